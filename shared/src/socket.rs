//! Binding the collector-side datagram socket safely, and naming send errors.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use nix::sys::socket::{self, sockopt, AddressFamily, SockFlag, SockType, UnixAddr};
use protocol::Creds;

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

/// Whether `a` and `b` name one socket: the same path made absolute, or resolved (symbolic
/// links, `..`) as far as it exists (a socket not bound yet has no file to compare, nor its
/// directory, made at the bind, any), or the same file (another link to it).
pub fn same_path(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let absolute = |p| std::path::absolute(p).ok();
    let inode = |p| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    matches!((absolute(a), absolute(b)), (Some(a), Some(b)) if a == b)
        || resolved(a).is_some_and(|r| Some(r) == resolved(b))
        || inode(a).is_some_and(|i| Some(i) == inode(b))
}

/// `path` made absolute, its longest leading part that exists resolved (`canonicalize`) and
/// the rest joined as it is; `None` where the rest holds a `..` or `.`. A symbolic link to
/// what does not exist yet (a socket not bound) is followed as the kernel would, at most 40
/// deep as it does, and resolved the same way.
fn resolved(path: &Path) -> Option<PathBuf> {
    let mut path = std::path::absolute(path).ok()?;
    for _ in 0..40 {
        let mut rest = Vec::new();
        let mut leading = path.as_path();
        let target = loop {
            if let Ok(real) = std::fs::canonicalize(leading) {
                return Some(rest.iter().rev().fold(real, |real, name| real.join(name)));
            }
            if let Ok(link) = std::fs::read_link(leading) {
                break leading.parent()?.join(link);
            }
            rest.push(leading.file_name()?);
            leading = leading.parent()?;
        };
        path = rest.iter().rev().fold(target, |path, name| path.join(name));
    }
    None
}

/// Binds a datagram socket at `path` with SO_PASSCRED set before bind and the file mode set to
/// `mode`. Creates the parent directory. A leftover socket file that nobody is bound to (a
/// killed process's) is removed; anything else at the path is an error, never removed. The
/// look, the removal and the bind hold the directory's lock (`flock`), so that of processes
/// binding one path at once, one does and the others find it in use.
pub fn bind_datagram(path: &Path, mode: u32) -> Result<UnixDatagram, BindError> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir).map_err(io_err("create directory", dir))?;
    }
    let addr = UnixAddr::new(path).map_err(|e| io_err("address", path)(e.into()))?;
    let _locked = lock_directory(dir.unwrap_or(Path::new(".")));
    remove_stale(path, &addr)?;
    let fd = bound(path, &addr, mode)?;
    // Under the umask the file may have fewer bits than `mode`: given them now.
    set_mode(path, mode).map_err(io_err("set mode of", path))?;
    Ok(UnixDatagram::from(fd))
}

/// A datagram socket with SO_PASSCRED, bound at `path`, its file made with at most `mode`'s
/// bits: Linux gives a socket file the socket's own mode less the umask, so the socket is
/// given `mode` before the bind. Made with the default 0777 less the umask, the file let
/// anyone connect (and a connected socket keeps sending after a chmod) until `set_mode`.
fn bound(path: &Path, addr: &UnixAddr, mode: u32) -> Result<OwnedFd, BindError> {
    let fd: OwnedFd = socket::socket(
        AddressFamily::Unix,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| io_err("create socket for", path)(e.into()))?;
    socket::setsockopt(&fd, sockopt::PassCred, &true)
        .map_err(|e| io_err("set SO_PASSCRED on", path)(e.into()))?;
    nix::sys::stat::fchmod(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        nix::sys::stat::Mode::from_bits_truncate(mode),
    )
    .map_err(|e| io_err("set mode of socket for", path)(e.into()))?;
    socket::bind(std::os::fd::AsRawFd::as_raw_fd(&fd), addr)
        .map_err(|e| io_err("bind", path)(e.into()))?;
    Ok(fd)
}

/// `SO_PASSRIGHTS`, Linux 6.16 on (not in the `libc` crate yet; the same number on every
/// architecture but a few this project does not build for).
const SO_PASSRIGHTS: nix::libc::c_int = 83;

/// Has the kernel refuse, at their sender, datagrams to `fd` that carry file descriptors
/// (`SO_PASSRIGHTS` off: the sender's `sendmsg` fails with EPERM), so that none reaches this
/// process. [`recv`] closes those that do as it reads them, and a close can block (a TCP socket
/// lingering on unsent data to a peer that does not read, a file on FUSE), holding up whoever
/// reads. `false` on a kernel before 6.16, which does not know the option: there they are
/// closed as they are read.
pub fn refuse_descriptors(fd: &impl std::os::fd::AsFd) -> io::Result<bool> {
    use nix::libc;
    let off: libc::c_int = 0;
    // SAFETY: a descriptor of ours, and an `int` option given with its size.
    let set = unsafe {
        libc::setsockopt(
            fd.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PASSRIGHTS,
            (&off as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    match set {
        0 => Ok(true),
        _ => match nix::errno::Errno::last() {
            nix::errno::Errno::ENOPROTOOPT => Ok(false),
            e => Err(e.into()),
        },
    }
}

/// How long a bind waits for its directory's lock: a binder holds it for a moment, so only
/// something else locking the directory holds it longer.
const DIRECTORY_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Holds `dir`'s lock until dropped, or `None`: the lock only settles binds racing each other,
/// so a bind goes on without it, as before there was one, where it cannot be had: a directory
/// this process may not read (write and search alone let it bind there), a file system
/// without `flock`, or one held for longer than [`DIRECTORY_LOCK_WAIT`] by whoever may read
/// the directory (which must not keep every bind there from starting).
fn lock_directory(dir: &Path) -> Option<Flock<std::fs::File>> {
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_DIRECTORY)
        .open(dir);
    let mut file = match opened {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => return None,
        Err(e) => return unlocked(dir, &e),
    };
    let until = std::time::Instant::now() + DIRECTORY_LOCK_WAIT;
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(locked) => return Some(locked),
            Err((back, nix::errno::Errno::EWOULDBLOCK)) if std::time::Instant::now() < until => {
                file = back;
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Err((_, e)) => return unlocked(dir, &e.into()),
        }
    }
}

fn unlocked(dir: &Path, e: &io::Error) -> Option<Flock<std::fs::File>> {
    tracing::warn!(
        "locking directory {} for a bind: {e}; binding without the lock",
        dir.display()
    );
    None
}

/// Sets the mode of the file at `path` itself: a symlink put there since (by anyone who may
/// write to the directory) is refused, where chmod would set the mode of what it points to.
fn set_mode(path: &Path, mode: u32) -> io::Result<()> {
    let bits = nix::sys::stat::Mode::from_bits_truncate(mode);
    let flag = nix::sys::stat::FchmodatFlags::NoFollowSymlink;
    match nix::sys::stat::fchmodat(None, path, bits, flag) {
        // What glibc answers for a symlink, and for anything before 2.32 or without /proc:
        // there, look first. Between the look and chmod a symlink could still be put in place
        // (as before this check); glibc 2.32 and later with /proc, the call above, has no gap.
        Err(nix::errno::Errno::EOPNOTSUPP) => {
            if std::fs::symlink_metadata(path)?.file_type().is_symlink() {
                return Err(io::Error::other("a symlink: its target's mode is not set"));
            }
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        }
        other => other.map_err(io::Error::from),
    }
}

/// Removes `path` (`addr`) if it is a datagram socket nobody is bound to; fails on anything
/// else.
fn remove_stale(path: &Path, addr: &UnixAddr) -> Result<(), BindError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err("inspect", path)(e)),
    };
    if !meta.file_type().is_socket() {
        return Err(BindError::NotASocket(path.to_owned()));
    }
    match probe(addr) {
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

/// What the kernel keeps of a Unix datagram socket's send buffer beyond a datagram's bytes:
/// a datagram longer than SO_SNDBUF less this is refused (EMSGSIZE) every time it is sent.
const SEND_BUFFER_OVERHEAD: usize = 32;
/// Datagrams a send buffer is asked to hold, when it holds not even one.
const SEND_BUFFER_DATAGRAMS: usize = 8;

/// Why a send buffer cannot hold a datagram of the size asked for.
#[derive(Debug, thiserror::Error)]
pub enum SendBufferError {
    #[error(
        "a datagram of {size} bytes does not fit the socket's send buffer, which holds {held} \
         bytes at most here (raise net.core.wmem_max, or lower the datagram size)"
    )]
    TooSmall { size: usize, held: usize },
    #[error("SO_SNDBUF: {0}")]
    Io(#[from] nix::errno::Errno),
}

/// Makes sure `fd`'s send buffer holds a datagram of `size` bytes: on a host whose
/// `net.core.wmem_default` is smaller, every such datagram would be refused for good. A buffer
/// too small is asked for room for [`SEND_BUFFER_DATAGRAMS`] of them (the kernel allows up to
/// `net.core.wmem_max`); one that still holds none is an error.
pub fn fit_send_buffer(fd: BorrowedFd<'_>, size: usize) -> Result<(), SendBufferError> {
    let needed = size.saturating_add(SEND_BUFFER_OVERHEAD);
    if socket::getsockopt(&fd, sockopt::SndBuf)? >= needed {
        return Ok(());
    }
    // The kernel takes an int, and caps it at net.core.wmem_max anyway.
    let asked = needed
        .saturating_mul(SEND_BUFFER_DATAGRAMS)
        .min(i32::MAX as usize / 2);
    socket::setsockopt(&fd, sockopt::SndBuf, &asked)?;
    match socket::getsockopt(&fd, sockopt::SndBuf)? {
        held if held >= needed => Ok(()),
        held => Err(SendBufferError::TooSmall { size, held }),
    }
}

/// Connects a new datagram socket to `addr`: fine if one is bound there; ECONNREFUSED for a
/// socket file nobody is bound to, ENOENT for no file, EPROTOTYPE for a socket of another type.
fn probe(addr: &UnixAddr) -> io::Result<()> {
    let flags = SockFlag::SOCK_CLOEXEC;
    let fd = socket::socket(AddressFamily::Unix, SockType::Datagram, flags, None)?;
    socket::connect(fd.as_raw_fd(), addr)?;
    Ok(())
}

/// Whether a datagram socket is bound at `addr` (a sender's own address): not if its file is
/// gone or nobody is bound to it, as when its process ended. Anything else (no permission to
/// look, say) counts as bound.
pub fn listening(addr: &UnixAddr) -> bool {
    let gone = [nix::libc::ECONNREFUSED, nix::libc::ENOENT];
    probe(addr).map_or_else(
        |e| !e.raw_os_error().is_some_and(|c| gone.contains(&c)),
        |()| true,
    )
}

/// Whether whoever may bind at `new` may bind at `old` too, once nobody is bound there (by
/// removing its file first): both are absolute paths in one directory, and that directory has
/// no sticky bit (in one that has, anyone may add a name but only its owner remove one). Not
/// for abstract addresses, which anyone may bind, nor relative paths, whose directory depends
/// on the binder's.
pub fn same_binders(old: &UnixAddr, new: &UnixAddr) -> bool {
    let dir = |a: &UnixAddr| {
        let path = a.path().filter(|p| p.is_absolute())?;
        path.parent().map(Path::to_owned)
    };
    match (dir(old), dir(new)) {
        (Some(old), Some(new)) if old == new => std::fs::metadata(&old)
            .is_ok_and(|m| m.is_dir() && m.permissions().mode() & nix::libc::S_ISVTX == 0),
        _ => false,
    }
}

/// The most file descriptors one datagram can carry (Linux's `SCM_MAX_FD`). Any sender may
/// attach that many to any datagram, so [`recv`] has room for them all.
pub const SCM_MAX_FD: usize = 253;

/// One datagram read by [`recv`]: its size, and what the kernel says about who sent it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Received {
    pub len: usize,
    /// It was larger than the buffer: the bytes are cut and must not be decoded.
    pub truncated: bool,
    /// The sender's own address, if its socket is bound to one (a path or an abstract name);
    /// `None` for an unbound sender.
    pub from: Option<UnixAddr>,
    /// The sender's credentials, attached by the kernel to every datagram while the receiving
    /// socket has SO_PASSCRED on (a process can claim only its own, unless privileged). Still
    /// there when file descriptors came along.
    pub creds: Option<Creds>,
    /// File descriptors the sender attached (SCM_RIGHTS). [`recv`] has already closed every
    /// one of them: none is kept, none leaks. No sender of clicks attaches any, so a datagram
    /// with `fds > 0` is not a redirector's.
    pub fds: usize,
    /// The kernel cut the control data (MSG_CTRUNC): it did not fit the room [`recv`] gives
    /// (credentials plus [`SCM_MAX_FD`] descriptors), so `creds` may be missing and `fds`
    /// incomplete (those not delivered were closed by the kernel). Who sent it is then not
    /// known: it must be rejected, never taken as a datagram without an owner.
    pub ctrunc: bool,
}

impl Received {
    /// Whether the datagram came with more than credentials: file descriptors, or control data
    /// cut short. Either way it is no redirector's datagram.
    pub fn irregular_control(&self) -> bool {
        self.fds > 0 || self.ctrunc
    }
}

/// The room [`recv`] gives the control data: the credentials (SO_PASSCRED), then as many file
/// descriptors as one datagram can carry. The kernel writes the credentials first, so they
/// arrive whatever came with them.
const CONTROL_LEN: usize = {
    use nix::libc::{c_int, c_uint, ucred, CMSG_SPACE};
    // SAFETY: CMSG_SPACE only computes a size.
    unsafe {
        CMSG_SPACE(size_of::<ucred>() as c_uint) as usize
            + CMSG_SPACE((SCM_MAX_FD * size_of::<c_int>()) as c_uint) as usize
    }
};

/// The control buffer, aligned for `cmsghdr` (its `cmsg_len` is a `size_t`).
#[repr(C, align(8))]
struct Control([u8; CONTROL_LEN]);

/// Reads one datagram into `buf` without waiting (`WouldBlock` if none is queued). File
/// descriptors that came with it are closed before this returns, and counted in
/// [`Received::fds`].
pub fn recv(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Received> {
    recv_with(fd, buf, &mut Control([0; CONTROL_LEN]).0)
}

/// [`recv`] with `control` as the room for control data (8-byte aligned).
fn recv_with(fd: BorrowedFd<'_>, buf: &mut [u8], control: &mut [u8]) -> io::Result<Received> {
    use nix::libc;
    debug_assert_eq!(control.as_ptr() as usize % 8, 0, "cmsghdr alignment");
    // SAFETY: all zeroes is a valid sockaddr_un and msghdr (null pointers, zero lengths).
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    msg.msg_name = std::ptr::addr_of_mut!(addr).cast();
    msg.msg_namelen = size_of::<libc::sockaddr_un>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = control.len() as _;
    // MSG_CMSG_CLOEXEC: a descriptor a peer sent is never inherited, even for the moment before
    // it is closed here.
    let flags = libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC;
    // SAFETY: every pointer in `msg` points at a live buffer of the length given beside it.
    let n = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, flags) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let (creds, fds) = take_control(&msg);
    // The address's length as the kernel has it, which for a path of the whole of sun_path
    // (108 bytes) counts a NUL past the room it was given: what it wrote is that room at most.
    // (Given as is, nix copied it into a `sockaddr_un` one byte too small.)
    let len = (msg.msg_namelen as usize).min(size_of::<libc::sockaddr_un>());
    // An unbound sender's address is unnamed: the kernel gives it no length at all.
    let from = (len > size_of::<libc::sa_family_t>())
        .then(|| {
            // SAFETY: the kernel wrote `len` bytes of a Unix address into `addr`, its size.
            unsafe {
                <UnixAddr as socket::SockaddrLike>::from_raw(
                    std::ptr::addr_of!(addr).cast(),
                    Some(len as libc::socklen_t),
                )
            }
        })
        .flatten();
    Ok(Received {
        len: n as usize,
        truncated: msg.msg_flags & libc::MSG_TRUNC != 0,
        from,
        creds,
        fds,
        ctrunc: msg.msg_flags & libc::MSG_CTRUNC != 0,
    })
}

/// Reads the control messages `recvmsg` left in `msg`: the credentials, if whole; every file
/// descriptor, closed at once and counted. Also when the control data was cut (MSG_CTRUNC):
/// the descriptors that did arrive are in this process then too, and must be closed.
// `msg_controllen` and `cmsg_len` are `size_t` in glibc, not in every libc: the casts stay.
#[allow(clippy::unnecessary_cast)]
fn take_control(msg: &nix::libc::msghdr) -> (Option<Creds>, usize) {
    use nix::libc::{self, c_int};
    let mut creds = None;
    let mut fds = 0;
    let end = msg.msg_control as usize + msg.msg_controllen as usize;
    // SAFETY: `msg` is as recvmsg filled it: `msg_control` holds `msg_controllen` bytes the
    // kernel wrote, whole headers each, and CMSG_FIRSTHDR/CMSG_NXTHDR stay within them.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(msg) };
    while !cmsg.is_null() {
        // SAFETY: a header CMSG_FIRSTHDR/CMSG_NXTHDR returned lies inside the buffer, aligned.
        let (level, kind, cmsg_len) =
            unsafe { ((*cmsg).cmsg_level, (*cmsg).cmsg_type, (*cmsg).cmsg_len) };
        // SAFETY: as above; the data follows its header.
        let data = unsafe { libc::CMSG_DATA(cmsg) };
        // The data's length, never past what the kernel wrote.
        let len = (cmsg as usize + cmsg_len as usize)
            .min(end)
            .saturating_sub(data as usize);
        match (level, kind) {
            (libc::SOL_SOCKET, libc::SCM_CREDENTIALS) if len >= size_of::<libc::ucred>() => {
                // SAFETY: `len` bytes of a ucred are there; read unaligned to be safe.
                let c: libc::ucred = unsafe { std::ptr::read_unaligned(data.cast()) };
                creds = Some(Creds {
                    pid: c.pid,
                    uid: c.uid,
                    gid: c.gid,
                });
            }
            (libc::SOL_SOCKET, libc::SCM_RIGHTS) => {
                for i in 0..len / size_of::<c_int>() {
                    // SAFETY: within the `len` bytes of descriptors the kernel wrote.
                    let raw: c_int =
                        unsafe { std::ptr::read_unaligned(data.cast::<c_int>().add(i)) };
                    // SAFETY: the kernel installed this descriptor for this message alone:
                    // nothing else in the process knows it, so it is ours to close.
                    drop(unsafe { OwnedFd::from_raw_fd(raw) });
                    fds += 1;
                }
            }
            _ => {}
        }
        // SAFETY: as for CMSG_FIRSTHDR.
        cmsg = unsafe { libc::CMSG_NXTHDR(msg, cmsg) };
    }
    (creds, fds)
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

    /// One socket however spelt, before it or its directory exists: through a symbolic link
    /// to a directory above it, or to it (absolute or relative), or `..`; another name, a `..`
    /// not yet resolvable, or links that loop, is not.
    #[test]
    fn same_path_sees_one_socket_through_links_before_it_is_made() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("run");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, dir.path().join("var-run")).unwrap();
        let socket = real.join("clicks/collector.sock");
        let through_link = dir.path().join("var-run/clicks/collector.sock");
        assert!(same_path(&socket, &through_link));
        assert!(same_path(
            &socket,
            &real.join("../run/clicks/collector.sock")
        ));
        assert!(!same_path(&socket, &real.join("clicks/tap.sock")));
        assert!(!same_path(&socket, &real.join("clicks/../clicks/tap.sock")));
        let (absolute, relative) = (dir.path().join("mirror.sock"), real.join("mirror.sock"));
        std::os::unix::fs::symlink(&through_link, &absolute).unwrap();
        std::os::unix::fs::symlink("clicks/collector.sock", &relative).unwrap();
        assert!(same_path(&socket, &absolute), "a link to it");
        assert!(same_path(&socket, &relative), "a relative link to it");
        let (a, b) = (dir.path().join("a.sock"), dir.path().join("b.sock"));
        std::os::unix::fs::symlink(&b, &a).unwrap();
        std::os::unix::fs::symlink(&a, &b).unwrap();
        assert!(!same_path(&socket, &a), "a loop");
    }
    use std::os::fd::AsFd;
    use testkit::send_with_fds;

    /// A host whose `net.core.wmem_default` is under the datagram size (here a buffer set that
    /// small) refuses every such datagram for good: the buffer is made to hold them.
    #[test]
    fn a_send_buffer_too_small_for_a_datagram_is_made_to_hold_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.sock");
        let receiver = bind_datagram(&path, 0o600).unwrap();
        let sender = UnixDatagram::unbound().unwrap();
        socket::setsockopt(&sender, sockopt::SndBuf, &4096).unwrap();
        let datagram = vec![7; 16 * 1024];
        let refused = sender.send_to(&datagram, &path).unwrap_err();
        assert_eq!(SendErrorKind::of(&refused), SendErrorKind::TooLarge);
        fit_send_buffer(sender.as_fd(), datagram.len()).unwrap();
        assert_eq!(sender.send_to(&datagram, &path).unwrap(), datagram.len());
        let mut buf = vec![0; datagram.len() + 1];
        assert_eq!(receiver.recv(&mut buf).unwrap(), datagram.len());
        // One the host's net.core.wmem_max cannot hold (the kernel grants twice that) is an
        // error.
        let max = std::fs::read_to_string("/proc/sys/net/core/wmem_max").unwrap();
        let absurd = max.trim().parse::<usize>().unwrap() * 2 + 1;
        let err = fit_send_buffer(sender.as_fd(), absurd).unwrap_err();
        assert!(
            matches!(err, SendBufferError::TooSmall { size, held } if size == absurd && held < absurd),
            "{err}"
        );
    }

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

    /// What the mode is set on after bind: the file at the path, never what a symlink put
    /// there in the meantime points to.
    #[test]
    fn the_mode_goes_on_the_path_itself_not_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, b"").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.path().join("c.sock");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(set_mode(&link, 0o666).is_err(), "a symlink is refused");
        let mode = std::fs::metadata(&target).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the target keeps its mode");
        set_mode(&target, 0o640).unwrap();
        let mode = std::fs::metadata(&target).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o640);
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

    /// Processes binding one path at once (two collectors given the same --socket): one gets
    /// it, the others are told it is in use. Without the directory's lock, one could take the
    /// stale socket for gone after another had replaced it, remove the new one and bind: both
    /// bound, one at a path nobody can reach.
    #[test]
    fn of_binds_racing_on_a_stale_socket_one_wins() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sock");
        for round in 0..200 {
            drop(bind_datagram(&path, 0o600).unwrap());
            let start = std::sync::Barrier::new(4);
            let bound: Vec<UnixDatagram> = std::thread::scope(|s| {
                let racers: Vec<_> = (0..4)
                    .map(|_| {
                        s.spawn(|| {
                            start.wait();
                            bind_datagram(&path, 0o600)
                        })
                    })
                    .collect();
                let results = racers.into_iter().map(|r| r.join().unwrap());
                results
                    .filter_map(|r| match r {
                        Ok(socket) => Some(socket),
                        Err(BindError::InUse(_)) => None,
                        Err(e) => panic!("round {round}: {e}"),
                    })
                    .collect()
            });
            assert_eq!(bound.len(), 1, "round {round}: bound at once");
        }
    }

    /// A sender's address is listened at while its socket is bound; not once its process let
    /// it go (the file left behind), nor when the file is gone.
    #[test]
    fn an_address_is_listened_at_while_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.sock");
        let addr = UnixAddr::new(&path).unwrap();
        let bound = bind_datagram(&path, 0o600).unwrap();
        assert!(listening(&addr));
        drop(bound);
        assert!(!listening(&addr), "a socket file nobody is bound to");
        std::fs::remove_file(&path).unwrap();
        assert!(!listening(&addr), "no file");
    }

    /// Who may bind a new name in a directory may replace a stale socket there too, unless the
    /// directory is sticky; paths elsewhere, relative or abstract are not alike.
    #[test]
    fn binders_are_the_same_in_one_directory_without_the_sticky_bit() {
        let dir = tempfile::tempdir().unwrap();
        let at = |name: &str| UnixAddr::new(&dir.path().join(name)).unwrap();
        assert!(same_binders(&at("a.sock"), &at("b.sock")));
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        let elsewhere = UnixAddr::new(&sub.join("b.sock")).unwrap();
        assert!(!same_binders(&at("a.sock"), &elsewhere));
        let relative = UnixAddr::new("b.sock").unwrap();
        assert!(!same_binders(&relative, &UnixAddr::new("a.sock").unwrap()));
        assert!(!same_binders(
            &at("a.sock"),
            &UnixAddr::new_abstract(b"b").unwrap()
        ));
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(!same_binders(&at("a.sock"), &at("b.sock")), "sticky");
    }

    /// Something else holding the directory's lock for good (whoever may read it can) delays
    /// a bind there by the wait, and no more: it binds without the lock.
    #[test]
    fn a_directory_locked_for_good_delays_a_bind_and_does_not_stop_it() {
        let dir = tempfile::tempdir().unwrap();
        let held = Flock::lock(
            std::fs::File::open(dir.path()).unwrap(),
            FlockArg::LockShared,
        );
        let _held = held.map_err(|(_, e)| e).unwrap();
        let started = std::time::Instant::now();
        bind_datagram(&dir.path().join("c.sock"), 0o600).unwrap();
        assert!(
            started.elapsed() >= DIRECTORY_LOCK_WAIT,
            "waited for the lock first"
        );
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

    /// A pipe whose write end is passed around: its read end reads end-of-file only once every
    /// copy of the write end is closed, the ones a receiver got included. Close-on-exec, so a
    /// process another test spawns meanwhile does not hold it open.
    fn pipe() -> (OwnedFd, OwnedFd) {
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK).unwrap()
    }

    /// Whether every copy of the pipe's write end is closed: its read end then reads EOF
    /// (EAGAIN while any copy is open).
    fn all_closed(read: &OwnedFd) -> bool {
        match nix::unistd::read(read.as_raw_fd(), &mut [0u8; 1]) {
            Ok(0) => true,
            Err(nix::errno::Errno::EAGAIN) => false,
            other => panic!("reading the pipe: {other:?}"),
        }
    }

    fn own_creds() -> Creds {
        Creds {
            pid: nix::unistd::getpid().as_raw(),
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
        }
    }

    /// The most descriptors a datagram can carry, and its content: the credentials still come
    /// with it (a control buffer sized for them alone once made the kernel cut the control data,
    /// and the datagram arrived without an owner), every descriptor is closed in the receiver
    /// as it is read, and the datagram says it carried some.
    #[test]
    fn a_datagram_carrying_descriptors_keeps_its_credentials_and_none_is_left_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sock");
        let receiver = bind_datagram(&path, 0o600).unwrap();
        let sender = UnixDatagram::unbound().unwrap();
        let (read, write) = pipe();
        // One descriptor SCM_MAX_FD times: the receiver gets as many descriptors of its own.
        let fds = [write.as_raw_fd(); SCM_MAX_FD];
        assert_eq!(send_with_fds(&sender, &path, b"clicks", &fds), Ok(6));
        sender.send_to(b"plain", &path).unwrap();
        drop(write);
        assert!(
            !all_closed(&read),
            "the queued datagram holds the write end"
        );

        let mut buf = [0u8; 64];
        let got = recv(receiver.as_fd(), &mut buf).unwrap();
        assert_eq!(&buf[..got.len], b"clicks");
        assert_eq!(got.creds, Some(own_creds()), "{got:?}");
        assert_eq!(got.fds, SCM_MAX_FD, "{got:?}");
        assert!(!got.ctrunc && !got.truncated, "{got:?}");
        assert!(got.irregular_control());
        assert!(
            all_closed(&read),
            "a descriptor the peer sent is still open in the receiver"
        );

        let plain = recv(receiver.as_fd(), &mut buf).unwrap();
        assert_eq!(&buf[..plain.len], b"plain");
        assert_eq!(plain.creds, Some(own_creds()));
        assert_eq!((plain.fds, plain.ctrunc), (0, false));
        assert!(!plain.irregular_control());
    }

    /// With descriptors refused, a sender that attaches some is told so (EPERM) and nothing
    /// arrives; a plain datagram still does. On a kernel without the option, they arrive and
    /// are closed as they are read.
    #[test]
    fn descriptors_refused_at_the_sender_never_reach_the_receiver() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sock");
        let receiver = bind_datagram(&path, 0o600).unwrap();
        let refused = refuse_descriptors(&receiver).unwrap();
        let sender = UnixDatagram::unbound().unwrap();
        let (read, write) = pipe();
        let sent = send_with_fds(&sender, &path, b"fds", &[write.as_raw_fd()]);
        sender.send_to(b"plain", &path).unwrap();
        drop(write);
        let mut buf = [0u8; 64];
        let first = recv(receiver.as_fd(), &mut buf).unwrap();
        if refused {
            assert_eq!(sent, Err(nix::errno::Errno::EPERM));
            assert_eq!((&buf[..first.len], first.fds), (&b"plain"[..], 0));
        } else {
            assert_eq!((&buf[..first.len], first.fds), (&b"fds"[..], 1));
        }
        assert!(all_closed(&read), "a descriptor is open in the receiver");
    }

    /// Control data that does not fit is flagged (MSG_CTRUNC), and the descriptors that did
    /// arrive are closed all the same.
    #[test]
    fn control_data_cut_short_is_flagged_and_what_arrived_is_closed() {
        use nix::libc::{c_int, c_uint, ucred, CMSG_SPACE};
        #[repr(C, align(8))]
        struct Small([u8; 64]);
        // SAFETY: CMSG_SPACE only computes a size.
        let room = unsafe {
            CMSG_SPACE(size_of::<ucred>() as c_uint) + CMSG_SPACE(2 * size_of::<c_int>() as c_uint)
        } as usize;
        let mut small = Small([0; 64]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sock");
        let receiver = bind_datagram(&path, 0o600).unwrap();
        let sender = UnixDatagram::unbound().unwrap();
        let (read, write) = pipe();
        assert_eq!(
            send_with_fds(&sender, &path, b"x", &[write.as_raw_fd(); 5]),
            Ok(1)
        );
        drop(write);

        let mut buf = [0u8; 8];
        let got = recv_with(receiver.as_fd(), &mut buf, &mut small.0[..room]).unwrap();
        assert!(got.ctrunc, "{got:?}");
        assert!(got.irregular_control());
        assert_eq!(got.creds, Some(own_creds()), "{got:?}");
        assert_eq!(got.fds, 2, "room for two descriptors of five: {got:?}");
        assert!(
            all_closed(&read),
            "a descriptor the peer sent is still open"
        );
    }

    /// The socket file never has more bits than asked for, not even between the bind and the
    /// chmod: made with 0777 less the umask, it let anyone connect in that moment.
    #[test]
    fn a_socket_file_is_made_with_no_more_than_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.sock");
        let addr = UnixAddr::new(&path).unwrap();
        let _fd = bound(&path, &addr, 0o620).unwrap();
        let made = std::fs::symlink_metadata(&path)
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(made & !0o620, 0, "made {made:o}, asked 620");
    }

    /// A sender bound at a path that fills sun_path (108 bytes, no room for its NUL): the
    /// kernel gives its address's length counting the NUL, one byte past the room.
    #[test]
    fn a_sender_at_a_path_filling_sun_path_is_read_within_the_room() {
        use nix::libc;
        use std::os::fd::FromRawFd;
        let dir = tempfile::tempdir().unwrap();
        let receiver_path = dir.path().join("r.sock");
        let receiver = bind_datagram(&receiver_path, 0o600).unwrap();
        // SAFETY: all zeroes is a valid sockaddr_un.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        let room = addr.sun_path.len();
        let prefix = format!("{}/", dir.path().display());
        let path = format!("{prefix}{}", "s".repeat(room - prefix.len()));
        for (to, b) in addr.sun_path.iter_mut().zip(path.bytes()) {
            *to = b as libc::c_char;
        }
        // SAFETY: a new socket, bound at an address of its full size.
        let sender = unsafe {
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
            assert!(fd >= 0, "{}", io::Error::last_os_error());
            let at = std::ptr::addr_of!(addr).cast();
            let bound = libc::bind(fd, at, size_of::<libc::sockaddr_un>() as libc::socklen_t);
            assert_eq!(bound, 0, "{}", io::Error::last_os_error());
            UnixDatagram::from_raw_fd(fd)
        };
        sender.send_to(b"x", &receiver_path).unwrap();
        let mut buf = [0u8; 8];
        let from = recv(receiver.as_fd(), &mut buf)
            .unwrap()
            .from
            .expect("its address");
        let len = socket::SockaddrLike::len(&from) as usize;
        assert!(
            len <= size_of::<libc::sockaddr_un>(),
            "{len} bytes of address"
        );
        assert_eq!(from.path().unwrap().as_os_str().len(), room);
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
