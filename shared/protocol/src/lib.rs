//! The click pipeline's protocol, with no I/O: the wire format (`wire`), the judging of seqs
//! of senders that expect no acknowledgements (`seq`), and both halves of the acknowledgement
//! protocol as plain state machines: the sender's resend window (`window`) and the collector's
//! judging of senders (`senders`). The services do the I/O around them; the property test in
//! `tests/protocol.rs` runs both halves against each other.

pub mod senders;
pub mod seq;
pub mod window;
pub mod wire;

/// Who sent a datagram, as the kernel vouches (`SCM_CREDENTIALS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Creds {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

/// Now, in microseconds since the Unix epoch (the wire format's clock).
pub fn now_us() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
}
