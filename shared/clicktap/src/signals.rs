//! SIGINT/SIGTERM as a flag the loops check, so that `listen` removes its socket file and
//! `send` prints what it sent before exiting.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: nix::libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Installs handlers for SIGINT and SIGTERM and returns the flag they set. Without
/// `SA_RESTART`, a blocked `recv` returns `EINTR` at once instead of waiting out its timeout.
pub fn stop_flag() -> io::Result<&'static AtomicBool> {
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::empty(),
        SigSet::empty(),
    );
    for signal in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { sigaction(signal, &action) }?;
    }
    Ok(&STOP)
}

/// Whether a stop was asked for.
pub fn stopping(flag: &AtomicBool) -> bool {
    flag.load(Ordering::Relaxed)
}
