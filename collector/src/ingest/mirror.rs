//! `--mirror`: every received datagram forwarded unchanged to a tap socket, never waiting.

use std::io;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;

#[derive(Debug)]
pub(crate) struct Mirror {
    sock: UnixDatagram,
    path: PathBuf,
}

impl Mirror {
    /// An unbound, non-blocking socket that sends to `path`.
    pub(crate) fn new(path: PathBuf) -> io::Result<Mirror> {
        let sock = UnixDatagram::unbound()?;
        sock.set_nonblocking(true)?;
        Ok(Mirror { sock, path })
    }

    /// Sends `datagram` if the tap can take it now; an error means it was not forwarded
    /// (nobody listens, or the tap's queue is full).
    pub(crate) fn forward(&self, datagram: &[u8]) -> io::Result<()> {
        self.sock.send_to(datagram, &self.path).map(drop)
    }
}
