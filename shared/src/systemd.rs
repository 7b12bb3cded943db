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

/// The sockets systemd passed to this process, if it passed any. Takes ownership of them and
/// clears the variables so that children do not inherit the claim.
pub fn take_listen_fds() -> Vec<OwnedFd> {
    let ours = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
        == Some(std::process::id());
    let count = std::env::var("LISTEN_FDS")
        .ok()
        .and_then(|n| n.parse::<i32>().ok())
        .unwrap_or(0);
    for var in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(var);
    }
    if !ours {
        return Vec::new();
    }
    (LISTEN_FDS_START..LISTEN_FDS_START + count)
        // SAFETY: systemd hands us these descriptors open and owned by this process; the
        // LISTEN_PID check above makes sure the claim was made for us and not a parent.
        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .collect()
}
