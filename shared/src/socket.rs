//! Binding the collector-side datagram socket safely, and naming send errors.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};

use nix::sys::socket::{
    self, sockopt, AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr,
};

/// Why a datagram socket could not be bound at a path.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("{0} exists and is not a socket; refusing to remove it")]
    NotASocket(PathBuf),
    #[error("{0} is in use: another process is bound to it")]
    InUse(PathBuf),
    #[error("{0} is a socket of another type (not a datagram socket); refusing to remove it")]
    WrongType(PathBuf),
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> BindError + 'a {
    move |source| BindError::Io {
        action,
        path: path.to_owned(),
        source,
    }
}

/// Binds a datagram socket at `path` with SO_PASSCRED set before bind and the file mode set to
/// `mode`. Creates the parent directory. A leftover socket file that nobody is bound to (a
/// killed process's) is removed; anything else at the path is an error, never removed.
pub fn bind_datagram(path: &Path, mode: u32) -> Result<UnixDatagram, BindError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io_err("create directory", dir))?;
    }
    remove_stale(path)?;
    let fd: OwnedFd = socket::socket(
        AddressFamily::Unix,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| io_err("create socket for", path)(e.into()))?;
    socket::setsockopt(&fd, sockopt::PassCred, &true)
        .map_err(|e| io_err("set SO_PASSCRED on", path)(e.into()))?;
    let addr = UnixAddr::new(path).map_err(|e| io_err("address", path)(e.into()))?;
    socket::bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr)
        .map_err(|e| io_err("bind", path)(e.into()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(io_err("set mode of", path))?;
    Ok(UnixDatagram::from(fd))
}

/// Removes `path` if it is a datagram socket nobody is bound to; fails on anything else.
fn remove_stale(path: &Path) -> Result<(), BindError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err("inspect", path)(e)),
    };
    if !meta.file_type().is_socket() {
        return Err(BindError::NotASocket(path.to_owned()));
    }
    let probe = UnixDatagram::unbound().map_err(io_err("create probe for", path))?;
    match probe.connect(path) {
        Ok(()) => Err(BindError::InUse(path.to_owned())),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            tracing::info!("removing stale socket {}", path.display());
            std::fs::remove_file(path).map_err(io_err("remove stale socket", path))
        }
        Err(e) if e.raw_os_error() == Some(nix::libc::EPROTOTYPE) => {
            Err(BindError::WrongType(path.to_owned()))
        }
        Err(e) => Err(io_err("probe", path)(e)),
    }
}

/// One datagram read by [`recv`]: its size, and what the kernel says about who sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub len: usize,
    /// It was larger than the buffer: the bytes are cut and must not be decoded.
    pub truncated: bool,
    /// The sender's own address, if its socket is bound to one (a path or an abstract name);
    /// `None` for an unbound sender.
    pub from: Option<UnixAddr>,
    /// The sender's credentials, attached by the kernel to every datagram while the receiving
    /// socket has SO_PASSCRED on (a process can claim only its own, unless privileged).
    pub creds: Option<Creds>,
}

/// Who sent a datagram, as the kernel vouches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Creds {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

/// Reads one datagram into `buf` without waiting (`WouldBlock` if none is queued).
pub fn recv(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Received> {
    let mut cmsg = nix::cmsg_space!(socket::UnixCredentials);
    let mut iov = [io::IoSliceMut::new(buf)];
    let msg = socket::recvmsg::<UnixAddr>(
        fd.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_DONTWAIT,
    )?;
    let creds = msg.cmsgs().ok().and_then(|mut c| {
        c.find_map(|m| match m {
            ControlMessageOwned::ScmCredentials(c) => Some(Creds {
                pid: c.pid(),
                uid: c.uid(),
                gid: c.gid(),
            }),
            _ => None,
        })
    });
    // An unbound sender's address is unnamed. nix hands it over with the length the kernel
    // gave, which is 0 then, and asserts (panics) when asked what kind of address a 0-length
    // one is: the length is checked first.
    let named = |a: &UnixAddr| {
        usize::try_from(socket::SockaddrLike::len(a))
            .is_ok_and(|len| len > std::mem::size_of::<nix::libc::sa_family_t>())
    };
    Ok(Received {
        len: msg.bytes,
        truncated: msg.flags.contains(MsgFlags::MSG_TRUNC),
        from: msg.address.filter(named),
        creds,
    })
}

/// What went wrong sending a datagram, by what the sender should do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SendErrorKind {
    /// The receiver's queue is full (EAGAIN, ENOBUFS): keep the datagram, wait, resend.
    QueueFull,
    /// No socket at the path (ENOENT): the receiver is away.
    NotFound,
    /// A socket file nobody is bound to, or a peer that just died (ECONNREFUSED).
    Refused,
    /// The connected peer died earlier (ENOTCONN) or shut its reading side (EPIPE).
    NotConnected,
    /// The socket or its directory does not let us write (EACCES, EPERM).
    PermissionDenied,
    /// The datagram is larger than the receiver accepts (EMSGSIZE).
    TooLarge,
    Other,
}

impl SendErrorKind {
    pub const ALL: [SendErrorKind; 7] = [
        Self::QueueFull,
        Self::NotFound,
        Self::Refused,
        Self::NotConnected,
        Self::PermissionDenied,
        Self::TooLarge,
        Self::Other,
    ];

    pub fn of(err: &io::Error) -> Self {
        use nix::libc;
        match err.raw_os_error() {
            Some(libc::EAGAIN | libc::ENOBUFS) => Self::QueueFull,
            Some(libc::ENOENT) => Self::NotFound,
            Some(libc::ECONNREFUSED) => Self::Refused,
            Some(libc::ENOTCONN | libc::EPIPE | libc::EDESTADDRREQ) => Self::NotConnected,
            Some(libc::EACCES | libc::EPERM) => Self::PermissionDenied,
            Some(libc::EMSGSIZE) => Self::TooLarge,
            _ if err.kind() == io::ErrorKind::WouldBlock => Self::QueueFull,
            _ => Self::Other,
        }
    }

    /// The receiver is not there: reconnect with backoff and keep the datagram meanwhile.
    pub fn receiver_away(self) -> bool {
        matches!(self, Self::NotFound | Self::Refused | Self::NotConnected)
    }

    /// The metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::QueueFull => "queue_full",
            Self::NotFound => "not_found",
            Self::Refused => "refused",
            Self::NotConnected => "not_connected",
            Self::PermissionDenied => "permission_denied",
            Self::TooLarge => "too_large",
            Self::Other => "other",
        }
    }
}

/// The `kind` label of send errors.
impl crate::metrics::Label for SendErrorKind {
    const NAME: &'static str = "kind";
    const ALL: &'static [Self] = &Self::ALL;
    fn index(self) -> usize {
        self as usize
    }
    fn as_str(self) -> &'static str {
        SendErrorKind::as_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_creates_directory_and_sets_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/dir/c.sock");
        let _sock = bind_datagram(&path, 0o660).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o660);
        let passcred: bool = socket::getsockopt(&_sock, sockopt::PassCred).unwrap();
        assert!(passcred);
    }

    #[test]
    fn replaces_a_stale_socket_but_not_a_live_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sock");
        drop(bind_datagram(&path, 0o600).unwrap());
        assert!(
            path.exists(),
            "closing a bound socket leaves its file behind"
        );
        let live = bind_datagram(&path, 0o600).expect("a stale socket is replaced");
        assert!(matches!(
            bind_datagram(&path, 0o600),
            Err(BindError::InUse(_))
        ));
        drop(live);
    }

    #[test]
    fn refuses_to_remove_what_is_not_a_datagram_socket() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, b"keep me").unwrap();
        assert!(matches!(
            bind_datagram(&file, 0o600),
            Err(BindError::NotASocket(_))
        ));
        assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
        let stream = dir.path().join("stream");
        let _listener = std::os::unix::net::UnixListener::bind(&stream).unwrap();
        assert!(matches!(
            bind_datagram(&stream, 0o600),
            Err(BindError::WrongType(_))
        ));
    }

    #[test]
    fn send_errors_are_named_by_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gone.sock");
        let sender = UnixDatagram::unbound().unwrap();
        let err = sender.send_to(b"x", &path).unwrap_err();
        assert_eq!(SendErrorKind::of(&err), SendErrorKind::NotFound);
        drop(bind_datagram(&path, 0o600).unwrap());
        let err = sender.send_to(b"x", &path).unwrap_err();
        assert_eq!(SendErrorKind::of(&err), SendErrorKind::Refused);
        assert!(SendErrorKind::Refused.receiver_away());
        assert!(!SendErrorKind::QueueFull.receiver_away());
    }
}
