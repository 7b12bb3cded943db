//! The receiving socket: taken from systemd or bound at a path, read one datagram at a time,
//! and fenced at stop so that nothing new arrives while the queue is drained.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixDatagram as StdDatagram;
use std::path::{Path, PathBuf};

use nix::sys::socket::{self, sockopt, MsgFlags, Shutdown, SockType, UnixAddr};
use tokio::io::Interest;
use tokio::net::UnixDatagram;

/// Where the socket came from decides what a stop does to it.
#[derive(Debug)]
enum Origin {
    /// Bound by this process at this path: unlinked and shut at stop, its queue drained.
    Bound(PathBuf),
    /// Passed by systemd, which keeps it (and its queue) for the next start: left alone.
    Activated,
}

/// The socket clicks arrive on.
#[derive(Debug)]
pub(crate) struct Inbox {
    sock: UnixDatagram,
    origin: Origin,
}

/// One received datagram's size in the buffer, and who sent it: `from` is where its
/// acknowledgements go (`None`: an unbound sender, which gets none).
pub(crate) use shared::socket::Received as Datagram;

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Bind(#[from] shared::socket::BindError),
    #[error("systemd passed {0} sockets; the collector takes exactly one datagram socket")]
    FdCount(usize),
    #[error("the socket systemd passed is not a Unix datagram socket: {0}")]
    NotDatagram(String),
    #[error("setting up the socket: {0}")]
    Io(#[from] io::Error),
}

impl Inbox {
    /// Takes the socket systemd passed (`passed`: what LISTEN_FDS held besides the admin
    /// listener) or else binds `path` with `mode`.
    pub(crate) fn open(path: &Path, mode: u32, passed: Vec<OwnedFd>) -> Result<Inbox, OpenError> {
        check_passed(&passed)?;
        let mut fds = passed;
        match fds.len() {
            0 => {
                let sock = shared::socket::bind_datagram(path, mode)?;
                tracing::info!(
                    path = %path.display(),
                    mode = %format_args!("{mode:o}"),
                    "bound {} (mode {mode:o})",
                    path.display()
                );
                Self::new(sock.into(), Origin::Bound(path.to_owned()))
            }
            1 => {
                let fd = fds.pop().expect("one");
                tracing::info!("using the socket passed by systemd");
                Self::new(fd, Origin::Activated)
            }
            n => Err(OpenError::FdCount(n)),
        }
    }

    fn new(fd: OwnedFd, origin: Origin) -> Result<Inbox, OpenError> {
        // Credentials mark every real datagram, so that after the fence an empty read that
        // carries none can be told apart from an empty datagram (see `recv_into`).
        socket::setsockopt(&fd, sockopt::PassCred, &true).map_err(io::Error::from)?;
        if !shared::socket::refuse_descriptors(&fd)? {
            tracing::info!(
                "this kernel (before Linux 6.16) cannot refuse datagrams carrying file \
                 descriptors at their sender: any that come are closed as they are read"
            );
        }
        let std = StdDatagram::from(fd);
        std.set_nonblocking(true)?;
        Ok(Inbox {
            sock: UnixDatagram::from_std(std)?,
            origin,
        })
    }

    /// Whether stopping drains the queue (a bound socket) or leaves it to systemd.
    pub(crate) fn drains_at_stop(&self) -> bool {
        matches!(self.origin, Origin::Bound(_))
    }

    /// Waits for the next datagram and reads it into `buf`.
    pub(crate) async fn recv(&self, buf: &mut [u8]) -> io::Result<Option<Datagram>> {
        self.sock
            .async_io(Interest::READABLE, || recv_into(self.sock.as_fd(), buf))
            .await
    }

    /// The next datagram already queued, without waiting: `None` once the queue is empty.
    pub(crate) fn try_recv(&self, buf: &mut [u8]) -> io::Result<Option<Datagram>> {
        match recv_into(self.sock.as_fd(), buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            other => other,
        }
    }

    /// Sends `bytes` to `to` without waiting: an acknowledgement to a sender whose socket is
    /// connected to this one (a redirector of a build from before the socket per peer,
    /// `replies`), which the kernel lets receive from its peer only. An error means it was not
    /// sent (the sender is gone, or this socket's send buffer, which all such senders share,
    /// is full); acknowledgements are cumulative, so the next one covers it.
    pub(crate) fn send_to(&self, bytes: &[u8], to: &UnixAddr) -> io::Result<()> {
        socket::sendto(self.sock.as_raw_fd(), bytes, to, MsgFlags::MSG_DONTWAIT)?;
        Ok(())
    }

    /// Stops new datagrams from arriving on a socket this process bound: unlinks the path (new
    /// senders get ENOENT) and shuts the reading side (connected senders, which do not look at
    /// the path again, get EPIPE and keep their datagram). What is queued can still be read.
    pub(crate) fn fence(&self) {
        let Origin::Bound(path) = &self.origin else {
            return;
        };
        if let Err(e) = std::fs::remove_file(path) {
            tracing::warn!(path = %path.display(), error = %e, "unlinking {}: {e}", path.display());
        }
        if let Err(e) = socket::shutdown(self.sock.as_raw_fd(), Shutdown::Read) {
            tracing::warn!(error = %e, "shutting the socket's reading side: {e}");
        }
    }
}

/// Reads one datagram. `Ok(None)` is the end of a fenced socket's queue (a read with no
/// credentials, which every queued datagram carries, and no other control data); older
/// kernels answer it with 0 bytes, newer ones with EAGAIN. A datagram whose control data was
/// cut or carried descriptors is returned as such, for the intake to reject.
fn recv_into(fd: impl AsFd, buf: &mut [u8]) -> io::Result<Option<Datagram>> {
    let datagram = shared::socket::recv(fd.as_fd(), buf)?;
    if datagram.len == 0 && datagram.creds.is_none() && !datagram.irregular_control() {
        return Ok(None);
    }
    Ok(Some(datagram))
}

/// What systemd passed for the inbox, `passed`: nothing, or one Unix datagram socket. Checked
/// before the database steps too (`service::run`): a unit's error waited through them, only
/// to fail after them, at every restart.
pub(crate) fn check_passed(passed: &[OwnedFd]) -> Result<(), OpenError> {
    match passed {
        [] => Ok(()),
        [fd] => check_datagram(fd),
        more => Err(OpenError::FdCount(more.len())),
    }
}

fn check_datagram(fd: &OwnedFd) -> Result<(), OpenError> {
    let kind = socket::getsockopt(fd, sockopt::SockType).map_err(io::Error::from)?;
    let name = socket::getsockname::<socket::UnixAddr>(fd.as_raw_fd());
    if kind != SockType::Datagram || name.is_err() {
        return Err(OpenError::NotDatagram(format!("{kind:?}")));
    }
    Ok(())
}

/// Where the Unix socket `fd` is bound (`None` if it has no path).
pub(crate) fn bound_path(fd: BorrowedFd<'_>) -> Option<PathBuf> {
    let addr = socket::getsockname::<UnixAddr>(fd.as_raw_fd()).ok()?;
    addr.path().map(Path::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::socket::SendErrorKind;

    /// The kernel behaviour the stop relies on: after the fence, a connected sender's send
    /// fails with EPIPE (it keeps the datagram), a new sender finds no path, and what was
    /// already queued, an empty datagram included, is still read to the end of the queue.
    #[tokio::test]
    async fn fence_refuses_new_sends_and_keeps_the_queue_readable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sock");
        let inbox = Inbox::open(&path, 0o600, Vec::new()).unwrap();
        let sender = StdDatagram::unbound().unwrap();
        sender.connect(&path).unwrap();
        for d in [&b"one"[..], b"", b"three"] {
            sender.send(d).unwrap();
        }
        inbox.fence();

        let err = sender.send(b"late").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(nix::libc::EPIPE), "{err}");
        assert_eq!(SendErrorKind::of(&err), SendErrorKind::NotConnected);
        let err = StdDatagram::unbound()
            .unwrap()
            .send_to(b"new", &path)
            .unwrap_err();
        assert_eq!(SendErrorKind::of(&err), SendErrorKind::NotFound);

        let mut buf = [0u8; 16];
        let mut read = Vec::new();
        while let Some(d) = inbox.try_recv(&mut buf).unwrap() {
            assert!(!d.truncated);
            read.push(buf[..d.len].to_vec());
        }
        assert_eq!(read, [&b"one"[..], b"", b"three"]);
        assert_eq!(inbox.try_recv(&mut buf).unwrap(), None);
    }

    /// Where acknowledgements go: a bound sender's address, nothing for an unbound one (whose
    /// zero-length address once panicked inside nix).
    #[tokio::test]
    async fn a_bound_sender_is_answered_from_this_socket_and_nobody_else_can_reach_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sock");
        let inbox = Inbox::open(&path, 0o600, Vec::new()).unwrap();
        let mut buf = [0u8; 16];
        StdDatagram::unbound()
            .unwrap()
            .send_to(b"anon", &path)
            .unwrap();
        assert_eq!(inbox.recv(&mut buf).await.unwrap().unwrap().from, None);

        let sender_path = dir.path().join("sender.sock");
        let sender = StdDatagram::bind(&sender_path).unwrap();
        sender.connect(&path).unwrap();
        sender.send(b"named").unwrap();
        let from = inbox.recv(&mut buf).await.unwrap().unwrap().from.unwrap();
        assert_eq!(from.path(), Some(sender_path.as_path()));
        inbox.send_to(b"ack", &from).unwrap();
        sender.set_nonblocking(true).unwrap();
        let n = sender.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"ack");
        // A connected datagram socket takes datagrams from its peer only.
        let forger = StdDatagram::unbound().unwrap();
        let err = forger.send_to(b"forged", &sender_path).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(nix::libc::EPERM), "{err}");
    }

    /// The inbox refuses descriptors at the sender, on a kernel that can (Linux 6.16 on).
    #[tokio::test]
    async fn the_inbox_refuses_datagrams_carrying_descriptors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sock");
        let _inbox = Inbox::open(&path, 0o600, Vec::new()).unwrap();
        let sender = StdDatagram::unbound().unwrap();
        let (_read, write) = nix::unistd::pipe().unwrap();
        let sent = testkit::send_with_fds(&sender, &path, b"fds", &[write.as_raw_fd()]);
        // Whether this kernel knows the option, asked of a socket of the test's own.
        let can = shared::socket::refuse_descriptors(&StdDatagram::unbound().unwrap()).unwrap();
        let refused = can.then_some(nix::errno::Errno::EPERM);
        assert_eq!(
            sent.err(),
            refused,
            "sent at a kernel that can refuse: {can}"
        );
    }

    #[tokio::test]
    async fn a_datagram_larger_than_the_buffer_is_marked_truncated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sock");
        let inbox = Inbox::open(&path, 0o600, Vec::new()).unwrap();
        StdDatagram::unbound()
            .unwrap()
            .send_to(&[7; 100], &path)
            .unwrap();
        let mut buf = [0u8; 10];
        let d = inbox.recv(&mut buf).await.unwrap().unwrap();
        assert!(d.truncated);
        assert!(inbox.drains_at_stop());
    }
}
