//! The two pieces of the systemd protocol the services use: readiness notification
//! (`sd_notify`) and socket activation (`LISTEN_FDS`). Both are no-ops outside systemd.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// The first file descriptor systemd passes.
const LISTEN_FDS_START: i32 = 3;

/// Sends `state` (e.g. `READY=1`) to `$NOTIFY_SOCKET`. Returns whether anyone was told.
pub fn notify(state: &str) -> io::Result<bool> {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let bytes = path.as_encoded_bytes();
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name)?,
        None => SocketAddr::from_pathname(&path)?,
    };
    UnixDatagram::unbound()?.send_to_addr(state.as_bytes(), &addr)?;
    Ok(true)
}

/// Logs instead of failing: a missed notification must not stop the service.
pub fn notify_or_log(state: &str) {
    if let Err(e) = notify(state) {
        tracing::warn!("sd_notify {state}: {e}");
    }
}

/// The most descriptors we accept from LISTEN_FDS; more is a misconfiguration, not a reason to
/// adopt (and later close) descriptors we were never given.
const LISTEN_FDS_MAX: i32 = 16;

/// The sockets systemd passed to this process, if it passed any, as owned descriptors.
///
/// The variables are read, not cleared: clearing the environment is unsound once other
/// threads run, and these services start no children that could misread them.
pub fn take_listen_fds() -> io::Result<Vec<OwnedFd>> {
    let ours = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
        == Some(std::process::id());
    if !ours {
        return Ok(Vec::new());
    }
    let count = std::env::var("LISTEN_FDS")
        .ok()
        .and_then(|n| n.parse::<i32>().ok())
        .filter(|n| (0..=LISTEN_FDS_MAX).contains(n))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("LISTEN_FDS is not a count from 0 to {LISTEN_FDS_MAX}"),
            )
        })?;
    let fds = LISTEN_FDS_START..LISTEN_FDS_START + count;
    for fd in fds.clone() {
        if nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD).is_err() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("LISTEN_FDS names descriptor {fd}, which is not open"),
            ));
        }
    }
    // SAFETY: systemd hands us these descriptors open (checked above) and owned by this
    // process; the LISTEN_PID check makes sure the claim was made for us and not a parent.
    Ok(fds.map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }).collect())
}
