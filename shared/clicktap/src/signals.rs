//! SIGINT/SIGTERM as a flag the loops check, so that `listen` removes its socket file and
//! `send` prints what it sent before exiting; and a standard output a stop interrupts.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: nix::libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Installs handlers for SIGINT and SIGTERM and returns the flag they set. Without
/// `SA_RESTART`, a blocked `recv` returns `EINTR` at once instead of waiting out its timeout.
/// A signal ignored at start stays ignored: a shell without job control starts a command run
/// in the background so, that a Ctrl-C meant for the script's foreground leaves it running.
pub fn stop_flag() -> io::Result<&'static AtomicBool> {
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::empty(),
        SigSet::empty(),
    );
    for signal in [Signal::SIGINT, Signal::SIGTERM] {
        // Looked at first: a handler standing in for a moment would take a signal sent then.
        if !ignored(signal)? {
            // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
            unsafe { sigaction(signal, &action) }?;
        }
    }
    Ok(&STOP)
}

/// Whether `signal` is ignored (`SIG_IGN`), as this process inherited it.
fn ignored(signal: Signal) -> io::Result<bool> {
    use nix::libc;
    let mut current = std::mem::MaybeUninit::<libc::sigaction>::uninit();
    // SAFETY: with no new action, sigaction(2) only writes the current one into `current`.
    let rc = unsafe {
        libc::sigaction(
            signal as libc::c_int,
            std::ptr::null(),
            current.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: written by the successful call above.
    Ok(unsafe { current.assume_init() }.sa_sigaction == libc::SIG_IGN)
}

/// Whether a stop was asked for.
pub fn stopping(flag: &AtomicBool) -> bool {
    flag.load(Ordering::Relaxed)
}

/// Standard output, unbuffered (a buffer would be flushed again as it is dropped, and block
/// there), whose blocked write a stop ends: std's writers retry `EINTR`, so a write blocked
/// on a reader that stopped reading (`| less`, a stalled FIFO) outlasted every SIGINT and
/// SIGTERM, and the socket file was left behind. Interrupted by a stop, a write fails as one
/// to a closed pipe does (`BrokenPipe`), which the commands take as the end of their output,
/// not as an error. One that begins after the stop (`send`'s summary; a line of `listen`'s
/// under way as the signal came) waits at most [`STOPPED_WAIT`] for room, then writes what
/// a pipe takes without blocking.
pub struct Stdout;

/// How long a write begun after a stop waits for standard output to take it.
const STOPPED_WAIT: u16 = 1000;

impl Stdout {
    /// Writes `line` and a newline.
    pub fn line(&mut self, line: &str) -> io::Result<()> {
        io::Write::write_all(self, format!("{line}\n").as_bytes())
    }
}

impl io::Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let stopped = || {
            let stopped = "stopped while writing to stdout";
            Err(io::Error::new(io::ErrorKind::BrokenPipe, stopped))
        };
        let mut buf = buf;
        if stopping(&STOP) {
            use nix::poll::{poll, PollFd, PollFlags};
            use std::os::fd::AsFd;
            let out = io::stdout();
            let mut ready = [PollFd::new(out.as_fd(), PollFlags::POLLOUT)];
            if !matches!(poll(&mut ready, STOPPED_WAIT), Ok(1)) {
                return stopped();
            }
            // Room for this much at least, once a pipe says it has room.
            buf = &buf[..buf.len().min(nix::libc::PIPE_BUF)];
        }
        loop {
            match nix::unistd::write(io::stdout(), buf) {
                Ok(n) => return Ok(n),
                Err(nix::errno::Errno::EINTR) if stopping(&STOP) => return stopped(),
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
