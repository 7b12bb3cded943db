//! The two pieces of the systemd protocol the services use: readiness notification
//! (`sd_notify`) and socket activation (`LISTEN_FDS`, with the names of `LISTEN_FDNAMES`).
//! Both are no-ops outside systemd.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
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

/// Whether systemd keeps descriptors for this service (`FileDescriptorStoreMax=` above 0: it
/// says so in `$FDSTORE`, systemd 254 and later).
pub fn fd_store_enabled() -> bool {
    std::env::var_os("NOTIFY_SOCKET").is_some()
        && std::env::var("FDSTORE")
            .ok()
            .and_then(|n| n.parse::<u32>().ok())
            .is_some_and(|n| n > 0)
}

/// Hands `fd` to systemd's file descriptor store under `name` (`FDSTORE=1`): it is passed back
/// through `LISTEN_FDS` to the next process of this service.
pub fn store_fd(name: &str, fd: &impl std::os::fd::AsRawFd) -> io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, UnixAddr};
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "NOTIFY_SOCKET is not set",
        ));
    };
    let bytes = path.as_encoded_bytes();
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => UnixAddr::new_abstract(name)?,
        None => UnixAddr::new(bytes)?,
    };
    let socket = UnixDatagram::unbound()?;
    let state = format!("FDSTORE=1\nFDNAME={name}");
    let fds = [fd.as_raw_fd()];
    let iov = [io::IoSlice::new(state.as_bytes())];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    sendmsg(
        socket.as_raw_fd(),
        &iov,
        &cmsg,
        MsgFlags::empty(),
        Some(&addr),
    )?;
    Ok(())
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

/// The sockets systemd passed, each under its name in `LISTEN_FDNAMES` (a socket unit's
/// `FileDescriptorName=`, by default the unit's own name; `unknown` when systemd gave none).
/// A service that takes several sockets (an HTTP listener and an admin listener) takes each
/// by the name its unit gives it.
#[derive(Debug, Default)]
pub struct Passed(Vec<(String, OwnedFd)>);

impl Passed {
    /// Takes what systemd passed to this process (nothing outside socket activation). Call
    /// once: the descriptors are owned, and closed, by what it returns.
    pub fn take() -> io::Result<Passed> {
        let fds = take_listen_fds()?;
        let names = names(std::env::var("LISTEN_FDNAMES").ok().as_deref(), fds.len())?;
        Ok(Passed(names.into_iter().zip(fds).collect()))
    }

    /// The socket passed under `name`, if there is one (the first, if several share it).
    pub fn named(&mut self, name: &str) -> Option<OwnedFd> {
        let at = self.0.iter().position(|(n, _)| n == name)?;
        Some(self.0.remove(at).1)
    }

    /// The sockets not taken by name yet, with their names.
    pub fn rest(self) -> Vec<(String, OwnedFd)> {
        self.0
    }

    /// A passed socket as a listening TCP socket, checked: a socket unit of the wrong kind
    /// (a datagram or a Unix socket under this name) is refused here, not at the first accept.
    pub fn tcp_listener(fd: OwnedFd, name: &str) -> io::Result<std::net::TcpListener> {
        use nix::sys::socket::{
            getsockname, getsockopt, sockopt, AddressFamily, SockType, SockaddrLike,
            SockaddrStorage,
        };
        use std::os::fd::AsRawFd;
        let wrong = |what: &str| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the socket systemd passed as {name:?} is not {what}"),
            )
        };
        if getsockopt(&fd, sockopt::SockType).map_err(io::Error::from)? != SockType::Stream {
            return Err(wrong("a stream socket"));
        }
        if !getsockopt(&fd, sockopt::AcceptConn).map_err(io::Error::from)? {
            return Err(wrong("listening (ListenStream=)"));
        }
        let addr: SockaddrStorage = getsockname(fd.as_raw_fd()).map_err(io::Error::from)?;
        if !matches!(
            addr.family(),
            Some(AddressFamily::Inet | AddressFamily::Inet6)
        ) {
            return Err(wrong("an IPv4 or IPv6 socket"));
        }
        let listener = std::net::TcpListener::from(fd);
        listener.set_nonblocking(true)?;
        Ok(listener)
    }
}

/// The name of each of `count` passed descriptors, from `LISTEN_FDNAMES` (colon-separated).
fn names(var: Option<&str>, count: usize) -> io::Result<Vec<String>> {
    let Some(var) = var else {
        return Ok(vec!["unknown".to_owned(); count]);
    };
    let names: Vec<String> = if count == 0 {
        Vec::new()
    } else {
        var.split(':').map(str::to_owned).collect()
    };
    if names.len() != count {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "LISTEN_FDNAMES names {} sockets, LISTEN_FDS passes {count}",
                names.len()
            ),
        ));
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_listen_fdnames_or_are_unknown() {
        assert_eq!(names(Some("http:admin"), 2).unwrap(), ["http", "admin"]);
        assert_eq!(names(None, 2).unwrap(), ["unknown", "unknown"]);
        assert!(names(Some(""), 0).unwrap().is_empty());
        let err = names(Some("http"), 2).unwrap_err().to_string();
        assert!(
            err.contains("names 1 sockets, LISTEN_FDS passes 2"),
            "{err}"
        );
    }

    #[test]
    fn a_passed_socket_of_the_wrong_kind_is_refused_by_name() {
        let datagram = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let err = Passed::tcp_listener(datagram.into(), "admin").unwrap_err();
        assert!(
            err.to_string().contains("\"admin\" is not a stream socket"),
            "{err}"
        );
        let listening = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listening.local_addr().unwrap();
        let listener = Passed::tcp_listener(listening.into(), "http").unwrap();
        assert_eq!(listener.local_addr().unwrap(), addr);
    }
}
