//! The click pipeline's protocol, with no I/O: the wire format (`wire`), the judging of seqs
//! of senders that expect no acknowledgements (`seq`), and both halves of the acknowledgement
//! protocol as plain state machines: the sender's resend window (`window`) and the collector's
//! judging of senders (`senders`). The services do the I/O around them; the property test in
//! `tests/protocol.rs` runs both halves against each other.

pub mod dimensions;
pub mod senders;
pub mod seq;
pub mod window;
pub mod wire;

/// Every reason a receiver rejects a datagram whole for, each named once: the wire format's
/// (`wire::Reject::reason`), then who sent it (the transport's, judged by the collector) and
/// what it claims (`senders::Refusal::reason`). The names are metrics labels and log fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectReason {
    Undecodable,
    WrongVersion,
    BadCode,
    BadTimestamp,
    TrailingBytes,
    /// From a uid the receiver does not allow, or without credentials.
    Unauthorized,
    SenderMismatch,
    SeqJump,
    BadResync,
    /// It carried file descriptors.
    FdsAttached,
    /// Its control data was cut, so its sender is unknown.
    ControlTruncated,
    /// A version-2 click with a dimension value no sender writes.
    BadDimension,
}

impl RejectReason {
    /// Every reason, each at its discriminant's index.
    pub const ALL: [RejectReason; 12] = [
        RejectReason::Undecodable,
        RejectReason::WrongVersion,
        RejectReason::BadCode,
        RejectReason::BadTimestamp,
        RejectReason::TrailingBytes,
        RejectReason::Unauthorized,
        RejectReason::SenderMismatch,
        RejectReason::SeqJump,
        RejectReason::BadResync,
        RejectReason::FdsAttached,
        RejectReason::ControlTruncated,
        RejectReason::BadDimension,
    ];

    /// A short, stable name for metrics labels and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::Undecodable => "undecodable",
            RejectReason::WrongVersion => "wrong_version",
            RejectReason::BadCode => "bad_code",
            RejectReason::BadTimestamp => "bad_timestamp",
            RejectReason::TrailingBytes => "trailing_bytes",
            RejectReason::Unauthorized => "unauthorized",
            RejectReason::SenderMismatch => "sender_mismatch",
            RejectReason::SeqJump => "seq_jump",
            RejectReason::BadResync => "bad_resync",
            RejectReason::FdsAttached => "fds_attached",
            RejectReason::ControlTruncated => "control_truncated",
            RejectReason::BadDimension => "bad_dimension",
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::RejectReason;

    #[test]
    fn every_reject_reason_is_listed_once_at_its_index() {
        for (i, reason) in RejectReason::ALL.iter().enumerate() {
            assert_eq!(*reason as usize, i, "{reason:?}");
        }
        let mut names: Vec<_> = RejectReason::ALL.iter().map(|r| r.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), RejectReason::ALL.len());
    }
}
