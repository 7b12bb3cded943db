//! The client's socket as a connection's state sees it (`bounded::Conn`): a byte read ends its
//! idleness (on an idle connection, it begins a request head), a write that hands over
//! everything marks it idle again, and a response the client leaves untaken for
//! `--write-timeout` fails the write, which ends the connection.
//!
//! "Taken" means acknowledged by the client: once a write has waited for room, the client
//! has `--write-timeout` to take everything written before that wait, not only room for the
//! next write. A client that pipelines requests without end and reads a little at a time
//! would otherwise make room for one more response now and then, and hold its connection
//! (busy, so never evicted) for as long as it liked; now it must take a whole send buffer
//! each `--write-timeout`. A client that takes what it asked for, however many requests it
//! pipelines and however long its round trip, does. What it acknowledged is what was
//! written less the kernel's send queue (`TIOCOUTQ`: written, not acknowledged); asking
//! costs a system call, made only while a stall lasts.

use std::future::Future;
use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;

use super::bounded::Conn;

/// A client's socket as the connection sees it: reads end its idleness, a write that takes
/// everything marks it idle again, and a response the client leaves untaken for
/// `write_timeout` fails the write.
pub(super) struct Watched {
    stream: TcpStream,
    conn: Arc<Conn>,
    write_timeout: Duration,
    /// Armed when a write could not hand over everything at once; disarmed by a write that
    /// finds `stall_mark` acknowledged.
    stalled: Option<Pin<Box<Sleep>>>,
    /// Bytes handed to the kernel since the connection began.
    written: u64,
    /// `written` when the stall began: what the client must take to end it.
    stall_mark: u64,
}

impl Watched {
    pub(super) fn new(stream: TcpStream, conn: Arc<Conn>, write_timeout: Duration) -> Watched {
        Watched {
            stream,
            conn,
            write_timeout,
            stalled: None,
            written: 0,
            stall_mark: 0,
        }
    }

    /// The write timeout's verdict while a write waits.
    fn poll_stall(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let Some(stalled) = self.stalled.as_mut() else {
            return Poll::Pending;
        };
        ready!(stalled.as_mut().poll(cx));
        self.conn.write_timed_out();
        Poll::Ready(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the client took no response for {:?}", self.write_timeout),
        ))
    }

    fn after_write(
        &mut self,
        cx: &mut Context<'_>,
        wrote: Poll<io::Result<usize>>,
        asked: usize,
    ) -> Poll<io::Result<usize>> {
        if let Poll::Ready(Ok(n)) = wrote {
            self.written += n as u64;
        }
        match wrote {
            Poll::Ready(Ok(n)) if n == asked => {
                self.conn.wrote_all();
                Poll::Ready(Ok(n))
            }
            Poll::Ready(result) => {
                self.arm();
                Poll::Ready(result)
            }
            Poll::Pending => {
                self.arm();
                match self.poll_stall(cx) {
                    Poll::Ready(e) => Poll::Ready(Err(e)),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn arm(&mut self) {
        if self.stalled.is_none() {
            self.stalled = Some(Box::pin(tokio::time::sleep(self.write_timeout)));
            self.stall_mark = self.written;
        }
    }

    /// Before a write: a client that took everything written before the stall ends it; one
    /// that has not by its deadline fails the write before it starts.
    fn overdue(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        if self.stalled.is_some() && self.taken_since_stall() {
            self.stalled = None;
            return None;
        }
        match self.poll_stall(cx) {
            Poll::Ready(e) => Some(e),
            Poll::Pending => None,
        }
    }
}

impl Watched {
    /// Whether the client has acknowledged every byte written before the stall began: what
    /// was written less what the kernel's send queue still holds (`TIOCOUTQ`: unsent or
    /// unacknowledged). Taken as yes if the kernel does not say, which is the rule a stall had
    /// before this check.
    fn taken_since_stall(&self) -> bool {
        let mut queued: nix::libc::c_int = 0;
        // SAFETY: TIOCOUTQ stores one int through the pointer, which outlives the call; the
        // descriptor is the stream's own, open while `self` is.
        let rc = unsafe {
            nix::libc::ioctl(
                self.stream.as_raw_fd(),
                nix::libc::TIOCOUTQ,
                &mut queued as *mut nix::libc::c_int,
            )
        };
        let queued = u64::try_from(queued).unwrap_or(0);
        rc != 0 || self.written.saturating_sub(queued) >= self.stall_mark
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.conn.received();
        }
        read
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.overdue(cx) {
            return Poll::Ready(Err(e));
        }
        let wrote = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.after_write(cx, wrote, buf.len())
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.overdue(cx) {
            return Poll::Ready(Err(e));
        }
        let asked = bufs.iter().map(|b| b.len()).sum();
        let wrote = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.after_write(cx, wrote, asked)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
