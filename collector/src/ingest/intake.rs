//! What the collector does with one received datagram, apart from its I/O: check who sent it,
//! decode it, judge its sender's seq, and add its clicks to the batch being filled. Pure but
//! for one look at the file system (`follow_move`, only for a sender id claimed from another
//! address) and one at whether a process exists (`release_replaced`, only for an id taken
//! over), so that it is tested (and fuzzed) alone; the receive loop (`receive`) does the
//! I/O and turns each outcome into metrics and log lines.

use protocol::wire::Reject;
use protocol::RejectReason;
use shared::socket::Received;
use std::time::{Duration, Instant};

use crate::write::batch::{Batch, DateWindow, Noted, PassedOver};
use protocol::senders::{Refusal, Resynced, Verdict};

use crate::ingest::senders::{Reply, Senders};

/// Why a datagram was rejected whole; formatted only when logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    /// Larger than the receive buffer: cut, so not decoded.
    Truncated(usize),
    Wire(Reject),
    /// It carried this many file descriptors (SCM_RIGHTS), closed as it was read.
    FdsAttached(usize),
    /// The kernel cut its control data (MSG_CTRUNC): who sent it is not known.
    ControlTruncated,
    /// Sent by a uid not in `--allow-uid` (`None`: the kernel attached no credentials).
    Unauthorized(Option<u32>),
    Refused(Refusal),
}

impl Why {
    /// Its reason: the metrics label and log field.
    pub(crate) fn reason(&self) -> RejectReason {
        match self {
            Why::Truncated(_) => RejectReason::Undecodable,
            Why::Wire(reject) => reject.reason(),
            Why::FdsAttached(_) => RejectReason::FdsAttached,
            Why::ControlTruncated => RejectReason::ControlTruncated,
            Why::Unauthorized(_) => RejectReason::Unauthorized,
            Why::Refused(refusal) => refusal.reason(),
        }
    }
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Why::Truncated(limit) => write!(f, "over {limit} bytes, cut by the receive buffer"),
            Why::Wire(reject) => write!(f, "{reject}"),
            Why::FdsAttached(n) => write!(f, "it carried {n} file descriptors (closed on receipt)"),
            Why::ControlTruncated => {
                f.write_str("its control data was cut (MSG_CTRUNC): its sender is unknown")
            }
            Why::Unauthorized(uid) => write!(f, "from uid {uid:?}, not one --allow-uid names"),
            Why::Refused(Refusal::SenderMismatch) => {
                f.write_str("the sender id belongs to another process")
            }
            Why::Refused(Refusal::SeqJump) => {
                f.write_str("its seq is further ahead than any sender could have got")
            }
            Why::Refused(Refusal::BadResync) => f.write_str(
                "a resync from a sender without an address, or claiming more clicks than any \
                 sender serves",
            ),
        }
    }
}

/// What became of one datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Rejected(Why),
    /// Rejected whole, but its header names its sender, seq and count of clicks, and the seq
    /// is the one its sender's next datagram must have: passed over (its seq accepted, with no
    /// click), so that a sender that resends until acknowledged is not held there for good.
    /// Its `clicks` are lost, counted as rejected.
    PassedOver {
        taken: Taken,
        why: Why,
        clicks: u64,
    },
    /// Accepted before: skipped.
    Duplicate,
    /// Past the seq its sender's next datagram must have: not accepted, resent later.
    Ahead,
    /// A resync: this collector's record of `sender` was behind, `skipped` datagrams of
    /// `unaccounted` clicks were passed over (the sender's count said `claimed`: more only
    /// where the record's count was short), and it goes on from `first`; `evicted` senders
    /// forgotten for it (its process's quota).
    Resynced {
        sender: u64,
        first: u64,
        skipped: u64,
        unaccounted: u64,
        claimed: u64,
        evicted: usize,
    },
    /// A resync that changed nothing (repeated, or the record was not behind).
    StaleResync,
    /// A resync that answers no resend request this collector made: ignored.
    UnaskedResync,
    /// Its clicks are in the batch.
    Accepted {
        taken: Taken,
        clicks: usize,
    },
}

/// A datagram's seq accepted: whose and which, how many datagrams of its sender were skipped
/// before it (`lost`), and how many sender ids were forgotten (idle, or past the bounds) since
/// the last one (`evicted`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    pub sender: u64,
    pub seq: u64,
    pub lost: u64,
    pub evicted: usize,
}

pub struct Intake {
    senders: Senders,
    window: DateWindow,
    /// `--allow-uid`: datagrams of any other uid are rejected (`None`: any uid).
    allowed_uids: Option<Vec<u32>>,
    /// The receive buffer's size: a datagram that filled it is cut.
    buffer: usize,
    /// Since when datagrams rejected for a dimension value have come, and when the last one
    /// came (`pass_over`).
    unknown_dimensions: Option<(Instant, Instant)>,
}

/// How long datagrams rejected for a dimension value are held (rejected, their senders
/// resending them) before they are passed over: a redirector's build newer than the
/// collector's may write a value the collector's does not know, and has this long for the
/// collector's upgrade before its datagrams holding one are lost (counted). Past it, holding
/// them loses more: everything their senders serve meanwhile fills the rings and drops. Timed
/// from the first of a run of them, whoever sent it (`RUN_ENDS_AFTER`): one sender's
/// datagrams cannot hold another's longer, only end its wait early. A damaged dimension byte
/// holds its sender at most as long.
pub const HOLD_UNKNOWN_DIMENSION: Duration = Duration::from_secs(60);
/// A run of datagrams rejected for a dimension value ends when none came for this long: far
/// longer than a sender's resends of one held (`--ack-timeout`, 2 s by default) or a pause
/// of the collector's reading (its database away), which must not start the hold again.
pub const RUN_ENDS_AFTER: Duration = Duration::from_secs(3600);

impl Intake {
    pub fn new(
        senders: Senders,
        window: DateWindow,
        allowed_uids: Option<Vec<u32>>,
        buffer: usize,
    ) -> Intake {
        Intake {
            senders,
            window,
            allowed_uids,
            buffer,
            unknown_dimensions: None,
        }
    }

    /// Takes one datagram, `bytes` as `meta` describes them, received at `now` (`now_us` on
    /// the wall clock) into `batch`; what became of it, and what to tell its sender.
    pub fn take(
        &mut self,
        bytes: &[u8],
        meta: &Received,
        batch: &mut Batch,
        now: Instant,
        now_us: i64,
    ) -> (Outcome, Option<Reply>) {
        if meta.truncated {
            return (Outcome::Rejected(Why::Truncated(self.buffer)), None);
        }
        // Before anything else: such a datagram has no owner the kernel vouches for, so it may
        // not claim a sender id (or it would escape the per-process bound).
        if meta.ctrunc {
            return (Outcome::Rejected(Why::ControlTruncated), None);
        }
        if meta.fds > 0 {
            return (Outcome::Rejected(Why::FdsAttached(meta.fds)), None);
        }
        if let Some(allowed) = &self.allowed_uids {
            let uid = meta.creds.map(|c| c.uid);
            if !uid.is_some_and(|uid| allowed.contains(&uid)) {
                return (Outcome::Rejected(Why::Unauthorized(uid)), None);
            }
        }
        if bytes.first() == Some(&protocol::wire::RESYNC_VERSION) {
            return (self.resync(bytes, meta, batch, now), None);
        }
        let datagram = match protocol::wire::decode(bytes) {
            Ok(datagram) => datagram,
            Err(reject) => return self.pass_over(bytes, Why::Wire(reject), meta, batch, now),
        };
        let (sender, seq) = (datagram.sender, datagram.seq);
        let (verdict, reply) = self.judge(sender, (seq, datagram.clicks.len() as u64), meta, now);
        let outcome = match verdict {
            Verdict::Refused(refusal) => Outcome::Rejected(Why::Refused(refusal)),
            Verdict::Duplicate => Outcome::Duplicate,
            Verdict::Ahead => Outcome::Ahead,
            Verdict::Accept { lost } => {
                batch.push(&datagram, &self.window, now_us);
                Outcome::Accepted {
                    taken: self.note_accepted((sender, seq, lost), meta, batch),
                    clicks: datagram.clicks.len(),
                }
            }
        };
        (outcome, reply)
    }

    /// `sender`'s verdict on its datagram `seq` of `clicks` clicks, from `meta`'s sender; a
    /// claim from another address that turns out to be the id's move there is judged again.
    fn judge(
        &mut self,
        sender: u64,
        (seq, clicks): (u64, u64),
        meta: &Received,
        now: Instant,
    ) -> (Verdict, Option<Reply>) {
        if self.claimed_by_the_dead(sender, meta) {
            return (Verdict::Refused(Refusal::SenderMismatch), None);
        }
        let judge = |s: &mut Senders| s.judge(sender, (seq, clicks), meta.from, meta.creds, now);
        let (verdict, reply) = match judge(&mut self.senders) {
            (Verdict::Refused(Refusal::SenderMismatch), _) if self.follow_move(sender, meta) => {
                judge(&mut self.senders)
            }
            judged => judged,
        };
        if let Verdict::Accept { .. } = verdict {
            self.release_replaced(sender);
        }
        (verdict, reply)
    }

    /// Lets the process `sender` was taken from go, once no process has its pid: looked at
    /// with each datagram of `sender` accepted (its successor's, the first one that took it
    /// over included), so that a later redirector the kernel gives that pid (after the process
    /// replaced was killed, as it usually was) is a successor like any other, not refused
    /// until the collector restarts (see [`exists`]).
    fn release_replaced(&mut self, sender: u64) {
        let Some(pid) = self.senders.replaced(sender) else {
            return;
        };
        if !exists(pid) {
            self.senders.replaced_gone(sender);
        }
    }

    /// Whether `meta`'s datagram would take `sender` over from its owner but its process no
    /// longer exists: one it sent before it died, read after its successor's (a copy of the
    /// state beside the original, say). Refused: the id would go to the dead process once
    /// that is let go (`release_replaced`), and its live successor be refused it for as long
    /// as it lives. Looked at only for a claim of another's id, not for every datagram.
    fn claimed_by_the_dead(&self, sender: u64, meta: &Received) -> bool {
        let Some(pid) = meta.creds.map(|c| c.pid).filter(|&pid| pid > 0) else {
            return false;
        };
        self.senders.would_take_over(sender, meta.creds) && !exists(pid)
    }

    /// A datagram `why` rejects whole, from a sender that resends until acknowledged (it has
    /// an address): judged by its header if that decodes, and passed over if its seq is the
    /// one the sender's next datagram must have. Only the sender's own process gets that far
    /// (another's claim is refused), with a damaged copy of a datagram it holds: resent, it
    /// would be rejected again for good, and the sender held there. A datagram whose decoding
    /// first meets a dimension value this build does not know only once such datagrams have
    /// been held `HOLD_UNKNOWN_DIMENSION` (a newer build's, whose collector is being upgraded);
    /// a version this build does not read never (its header does not decode).
    fn pass_over(
        &mut self,
        bytes: &[u8],
        why: Why,
        meta: &Received,
        batch: &mut Batch,
        now: Instant,
    ) -> (Outcome, Option<Reply>) {
        let header = protocol::wire::decode_header(bytes);
        let (Some(_), Ok(header)) = (&meta.from, header) else {
            return (Outcome::Rejected(why), None);
        };
        let (sender, seq, clicks) = (header.sender, header.seq, header.clicks);
        let skew = matches!(why, Why::Wire(Reject::BadDimension { .. }));
        if skew && !self.held_long_enough(now) {
            return (Outcome::Rejected(why), None);
        }
        let (verdict, reply) = self.judge(sender, (seq, clicks), meta, now);
        // Judged as any other datagram at its seq: a resend request for a seq before it goes
        // out, and a resend of one passed over (until its acknowledgement arrives) is a repeat,
        // so that its clicks are counted as rejected once, when it is passed over.
        let lost = match verdict {
            Verdict::Accept { lost } => lost,
            Verdict::Duplicate => return (Outcome::Duplicate, reply),
            Verdict::Ahead => return (Outcome::Ahead, reply),
            // What refused it says who sent it (a claim of another's id), which its body's
            // fault does not: counted as that, it would raise no alert for hostile senders.
            Verdict::Refused(refusal) => {
                return (Outcome::Rejected(Why::Refused(refusal)), reply);
            }
        };
        let rejected = PassedOver {
            rejected: clicks,
            ..PassedOver::default()
        };
        batch.pass_over(sender, rejected);
        let outcome = Outcome::PassedOver {
            taken: self.note_accepted((sender, seq, lost), meta, batch),
            why,
            clicks,
        };
        (outcome, reply)
    }

    /// Whether datagrams rejected for a dimension value, one of them now, have come since
    /// `HOLD_UNKNOWN_DIMENSION` before `now` (a new run of them, if the last came
    /// `RUN_ENDS_AFTER` ago or longer).
    fn held_long_enough(&mut self, now: Instant) -> bool {
        let since = match self.unknown_dimensions {
            Some((since, last)) if now.saturating_duration_since(last) < RUN_ENDS_AFTER => since,
            _ => now,
        };
        self.unknown_dimensions = Some((since, now));
        now.saturating_duration_since(since) >= HOLD_UNKNOWN_DIMENSION
    }

    /// Notes in `batch` that `sender` was accepted up to `seq`, `lost` datagrams skipped
    /// before it, and forgets the senders the bounds pushed out.
    fn note_accepted(
        &mut self,
        (sender, seq, lost): (u64, u64, u64),
        meta: &Received,
        batch: &mut Batch,
    ) -> Taken {
        let clicks = self.senders.clicks_through(sender);
        batch.note_sender(sender, noted(seq, clicks, meta));
        let evicted = self.senders.forgotten();
        let count = evicted.len();
        batch.forget_senders(evicted);
        Taken {
            sender,
            seq,
            lost,
            evicted: count,
        }
    }

    /// Whether `sender`, claimed by a later process of its owner's user from another address
    /// than the one its acknowledgements go to, moved there: nobody listens at that one any
    /// more (a redirector restarted on its state region with another `--ack-socket`), and the
    /// claim's is one that only who may bind at the old one may bind (in the same directory:
    /// `same_binders`), bound there as this process sees it (an address is the text its binder
    /// gave, which a process of a mount namespace of its own could have bound elsewhere). The
    /// address remains what proves a successor: under `PrivateUsers=` every uid reads the
    /// same. A copy of the state beside a live original is still refused.
    fn follow_move(&mut self, sender: u64, meta: &Received) -> bool {
        let (Some(from), Some(old)) = (
            meta.from,
            self.senders
                .claimed_from_elsewhere(sender, meta.from, meta.creds),
        ) else {
            return false;
        };
        let alike = shared::socket::same_binders(&old, &from);
        if !alike || shared::socket::listening(&old) || !shared::socket::listening(&from) {
            return false;
        }
        tracing::info!(
            sender,
            "sender {sender} is claimed from {from} by a later process of its user, and \
             nobody listens at {old} any more: acknowledged there from now on"
        );
        self.senders.moved(sender, from);
        true
    }

    /// A resync: what it skipped is committed with the batch, as if accepted.
    fn resync(
        &mut self,
        bytes: &[u8],
        meta: &Received,
        batch: &mut Batch,
        now: Instant,
    ) -> Outcome {
        let resync = match protocol::wire::decode_resync(bytes) {
            Ok(resync) => resync,
            Err(reject) => return Outcome::Rejected(Why::Wire(reject)),
        };
        if self.claimed_by_the_dead(resync.sender, meta) {
            return Outcome::Rejected(Why::Refused(Refusal::SenderMismatch));
        }
        match self.senders.resync(&resync, meta.from, meta.creds, now) {
            Resynced::Refused(refusal) => Outcome::Rejected(Why::Refused(refusal)),
            Resynced::Stale => Outcome::StaleResync,
            Resynced::Unasked => Outcome::UnaskedResync,
            Resynced::Skipped {
                first,
                skipped,
                unaccounted,
                claimed,
            } => {
                let noted = noted(first - 1, resync.clicks_before, meta);
                batch.note_sender(resync.sender, noted);
                let passed = PassedOver {
                    rejected: 0,
                    unaccounted,
                    uncounted: claimed - unaccounted,
                };
                batch.pass_over(resync.sender, passed);
                // Forgotten as it was bound to its process: their rows go with this batch.
                let evicted = self.senders.forgotten();
                let count = evicted.len();
                batch.forget_senders(evicted);
                Outcome::Resynced {
                    sender: resync.sender,
                    first,
                    skipped,
                    unaccounted,
                    claimed,
                    evicted: count,
                }
            }
        }
    }

    /// The senders, to record what a committed batch committed.
    pub(crate) fn senders(&mut self) -> &mut Senders {
        &mut self.senders
    }
}

/// Whether a process has pid `pid` (> 0; a zombie too): `kill(pid, 0)` fails with ESRCH only
/// if none does. EPERM (another user's process, or the call filtered) counts as one that
/// exists: the side that refuses.
fn exists(pid: i32) -> bool {
    let signal_none = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None);
    signal_none != Err(nix::errno::Errno::ESRCH)
}

/// What a batch notes of the sender of `meta`'s datagram, accepted up to `seq`.
fn noted(seq: u64, clicks: u64, meta: &Received) -> Noted {
    Noted {
        reply: meta.from,
        uid: meta.creds.map(|c| c.uid),
        ..Noted::at(seq, clicks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::UnixAddr;
    use protocol::wire::{Encoder, DEFAULT_DATAGRAM};
    use protocol::Creds;

    const OPEN: DateWindow = DateWindow {
        max_age_us: i64::MAX,
        max_skew_us: i64::MAX,
    };

    fn meta(pid: i32, uid: u32, len: usize) -> Received {
        Received {
            len,
            creds: Some(Creds { pid, uid, gid: uid }),
            ..Received::default()
        }
    }

    fn datagram(sender: u64, clicks: usize) -> Vec<u8> {
        let mut enc = Encoder::new(sender, DEFAULT_DATAGRAM).unwrap();
        for i in 0..clicks {
            enc.push("abc", 1_000_000 + i as i64).unwrap();
        }
        enc.datagram().to_vec()
    }

    /// A resync that binds its sender to a process whose quota of ids is full pushes out the
    /// process's oldest id without an address at once: its `click_senders` row goes with the
    /// batch, and it is counted as evicted (before, only an accepted datagram took them to a
    /// batch: those of a resync waited for the next one, or were never deleted).
    #[test]
    fn a_resync_that_pushes_an_id_out_forgets_its_row_with_the_batch() {
        let dir = tempfile::tempdir().unwrap();
        let mut intake = Intake::new(Senders::default(), OPEN, None, 65_536);
        let mut batch = Batch::default();
        let now = Instant::now();
        let per_process = protocol::senders::PER_PROCESS as u64;
        for id in 1..=per_process {
            let bytes = datagram(id, 1);
            let (outcome, _) = intake.take(&bytes, &meta(7, 1000, bytes.len()), &mut batch, now, 0);
            assert!(matches!(outcome, Outcome::Accepted { .. }), "{outcome:?}");
        }
        assert!(batch.forgotten_column().is_empty());
        // Another id of the process, from an address.
        let resync = protocol::wire::Resync::new(99, 1, 0);
        let outcome = ahead_then_resync(&mut intake, &mut batch, dir.path(), resync);
        assert!(
            matches!(outcome, Outcome::Resynced { evicted: 1, .. }),
            "{outcome:?}"
        );
        assert_eq!(
            batch.forgotten_column(),
            [1],
            "the oldest id, with the batch"
        );
    }

    /// A datagram of `resync`'s sender (process 7 of uid 1000) from an address in `dir`, at
    /// the seq where the resync says its window starts, ahead of what the collector has of it
    /// (asked for), then the resync.
    fn ahead_then_resync(
        intake: &mut Intake,
        batch: &mut Batch,
        dir: &std::path::Path,
        resync: protocol::wire::Resync,
    ) -> Outcome {
        let from = Some(UnixAddr::new(&dir.join("r")).unwrap());
        let m = |len| Received {
            from,
            ..meta(7, 1000, len)
        };
        let mut enc = Encoder::new(resync.sender, DEFAULT_DATAGRAM).unwrap();
        enc.resume_as(resync.sender, resync.first);
        enc.push("abc", 1_000_000).unwrap();
        let ahead = enc.datagram().to_vec();
        let now = Instant::now();
        let (outcome, _) = intake.take(&ahead, &m(ahead.len()), batch, now, 0);
        assert!(matches!(outcome, Outcome::Ahead), "{outcome:?}");
        let resync = resync.encode();
        intake.take(&resync, &m(resync.len()), batch, now, 0).0
    }

    /// A resync claiming more clicks than its skipped datagrams hold (a record whose count was
    /// short): the unaccounted counted are what they hold, and the rest passed over too, in
    /// no metric, so that a failover losing the batch does not count them as lost either.
    #[test]
    fn a_resync_past_what_its_datagrams_hold_passes_the_rest_over_uncounted() {
        let dir = tempfile::tempdir().unwrap();
        let mut intake = Intake::new(Senders::default(), OPEN, None, 65_536);
        let mut batch = Batch::default();
        let resync = protocol::wire::Resync::new(99, 2, 100_000);
        let outcome = ahead_then_resync(&mut intake, &mut batch, dir.path(), resync);
        let most = 2 * (protocol::wire::MAX_DATAGRAM / protocol::wire::MIN_CLICK_LEN) as u64;
        assert!(
            matches!(outcome, Outcome::Resynced { skipped: 2, unaccounted, claimed: 100_000, .. } if unaccounted == most),
            "{outcome:?}"
        );
        let passed = PassedOver {
            unaccounted: most,
            uncounted: 100_000 - most,
            ..PassedOver::default()
        };
        assert_eq!(batch.passed_over(), passed);
        assert_eq!(batch.passed_over_by().collect::<Vec<_>>(), [(99, 100_000)]);
    }

    /// A datagram of a sender that awaits acknowledgements, rejected for a click (a byte of a
    /// code damaged, as in a damaged copy of its state file) with its header intact: at the
    /// seq awaited it is passed over and the next one accepted; before, the sender resent it
    /// for good. Ahead of the seq awaited it is judged as any other (a resend request), and so
    /// is a resend of one passed over (a repeat); from
    /// another process it is rejected (by its own reason, as before) and passes nothing; ones
    /// rejected for a dimension value (a newer build's) are held for `HOLD_UNKNOWN_DIMENSION`
    /// first; and one of a sender without an address, which resends nothing, is rejected.
    #[test]
    fn a_datagram_rejected_for_a_click_at_the_seq_awaited_is_passed_over() {
        let dir = tempfile::tempdir().unwrap();
        let mut intake = Intake::new(Senders::default(), OPEN, None, 65_536);
        let mut batch = Batch::default();
        let now = Instant::now();
        let clock = std::cell::Cell::new(now);
        let mut take = |(sender, seq): (u64, u64), damage: Damage, pid: i32, from: Option<&str>| {
            let mut enc = Encoder::new(sender, DEFAULT_DATAGRAM).unwrap();
            enc.resume_as(sender, seq);
            enc.push("abc", 1_000_000).unwrap();
            enc.push("abd", 1_000_000).unwrap();
            let mut bytes = enc.datagram().to_vec();
            let at = match damage {
                Damage::None => None,
                Damage::Code => bytes.windows(3).position(|w| w == b"abd").map(|at| at + 1),
                // The last click's dimensions end it: its agent, then no referrer, device nor
                // country.
                Damage::Agent => Some(bytes.len() - 4),
            };
            if let Some(at) = at {
                bytes[at] = 0x20;
            }
            let m = Received {
                from: from.map(|name| UnixAddr::new(&dir.path().join(name)).unwrap()),
                ..meta(pid, 1000, bytes.len())
            };
            intake.take(&bytes, &m, &mut batch, clock.get(), 0)
        };
        let taken = |seq| Taken {
            sender: 5,
            seq,
            lost: 0,
            evicted: 0,
        };
        let accepted = |seq| Outcome::Accepted {
            taken: taken(seq),
            clicks: 2,
        };
        let for_damage = |reject: &Reject, damage: Damage| match damage {
            Damage::Code => matches!(reject, Reject::BadCode { index: 1, .. }),
            _ => matches!(reject, Reject::BadDimension { index: 1 }),
        };
        let rejected_for = |o: &Outcome, damage: Damage| match o {
            Outcome::Rejected(Why::Wire(reject)) => for_damage(reject, damage),
            _ => false,
        };
        // Passed over as `taken(seq)`, its two clicks lost.
        let passed_for = |o: &Outcome, damage: Damage, seq: u64| match o {
            Outcome::PassedOver {
                taken: t,
                clicks: 2,
                why: Why::Wire(reject),
            } => *t == taken(seq) && for_damage(reject, damage),
            _ => false,
        };
        let owner = (10, Some("a"));
        assert_eq!(take((5, 0), Damage::None, owner.0, owner.1).0, accepted(0));
        let (other, reply) = take((5, 1), Damage::Code, 11, Some("b"));
        assert_eq!(
            other,
            Outcome::Rejected(Why::Refused(Refusal::SenderMismatch)),
            "another process's claim: refused as one (DatagramsRejectedHostile), not for its body"
        );
        assert!(reply.is_none());
        let (ahead, reply) = take((5, 2), Damage::Code, owner.0, owner.1);
        assert_eq!(
            ahead,
            Outcome::Ahead,
            "counted as rejected when its turn comes"
        );
        assert_eq!(reply.map(|r| r.ack.resend_from), Some(Some(1)));
        let (passed, _) = take((5, 1), Damage::Code, owner.0, owner.1);
        assert!(passed_for(&passed, Damage::Code, 1), "{passed:?}");
        // Resent until its acknowledgement arrives: a repeat, not rejected again.
        let (again, _) = take((5, 1), Damage::Code, owner.0, owner.1);
        assert_eq!(again, Outcome::Duplicate);
        assert_eq!(take((5, 2), Damage::None, owner.0, owner.1).0, accepted(2));
        let (skew, reply) = take((5, 3), Damage::Agent, owner.0, owner.1);
        assert!(rejected_for(&skew, Damage::Agent), "{skew:?}");
        assert!(reply.is_none());
        assert_eq!(take((5, 3), Damage::None, owner.0, owner.1).0, accepted(3));
        // Held while such datagrams have come for less than HOLD_UNKNOWN_DIMENSION, several
        // of its sender's among them (resent every --ack-timeout), and another sender's; then
        // passed over, and the next one with it.
        let hold = HOLD_UNKNOWN_DIMENSION;
        let mut at = Duration::ZERO;
        while at < hold {
            clock.set(now + at);
            for seq in [4, 5] {
                let (held, reply) = take((5, seq), Damage::Agent, owner.0, owner.1);
                assert!(rejected_for(&held, Damage::Agent), "{at:?}: {held:?}");
                assert!(reply.is_none());
            }
            let (other, _) = take((7, 0), Damage::Agent, 13, Some("c"));
            assert!(rejected_for(&other, Damage::Agent), "{at:?}: {other:?}");
            at += Duration::from_secs(2);
        }
        clock.set(now + hold);
        let (passed, _) = take((5, 4), Damage::Agent, owner.0, owner.1);
        assert!(passed_for(&passed, Damage::Agent, 4), "{passed:?}");
        let (passed, _) = take((5, 5), Damage::Agent, owner.0, owner.1);
        assert!(matches!(passed, Outcome::PassedOver { .. }), "{passed:?}");
        // The run goes on across a silence shorter than RUN_ENDS_AFTER (a long --ack-timeout,
        // the collector's reading paused): the next one is passed over at once.
        let quiet = now + hold + RUN_ENDS_AFTER - Duration::from_millis(1);
        clock.set(quiet);
        let (passed, _) = take((5, 6), Damage::Agent, owner.0, owner.1);
        assert!(matches!(passed, Outcome::PassedOver { .. }), "{passed:?}");
        // After one as long, a new run, started by another sender, holds this one until its
        // hold is over.
        let started = quiet + RUN_ENDS_AFTER;
        clock.set(started);
        let (other, _) = take((7, 0), Damage::Agent, 13, Some("c"));
        assert!(rejected_for(&other, Damage::Agent), "{other:?}");
        clock.set(started + hold - Duration::from_millis(1));
        let (held, _) = take((5, 7), Damage::Agent, owner.0, owner.1);
        assert!(rejected_for(&held, Damage::Agent), "{held:?}");
        clock.set(started + hold);
        let (passed, _) = take((5, 7), Damage::Agent, owner.0, owner.1);
        assert!(matches!(passed, Outcome::PassedOver { .. }), "{passed:?}");
        let (unbound, reply) = take((6, 0), Damage::Code, 12, None);
        assert!(rejected_for(&unbound, Damage::Code), "{unbound:?}");
        assert!(reply.is_none());
        assert_eq!(batch.received(), 6, "the clicks of seqs 0, 2 and 3");
        let passed_over = PassedOver {
            rejected: 10,
            ..PassedOver::default()
        };
        assert_eq!(batch.passed_over(), passed_over, "seqs 1, 4, 5, 6 and 7");
        let senders = intake.senders();
        assert_eq!(senders.clicks_through(5), 16, "as its sender counts");
        assert_eq!(
            senders.len(),
            1,
            "no record of the sender without an address"
        );
    }

    /// A fresh intake, taking datagrams of sender 5 (a click each) from processes of uid 1000.
    struct Claims {
        intake: Intake,
        batch: Batch,
        now: Instant,
    }

    impl Claims {
        fn new() -> Claims {
            Claims {
                intake: Intake::new(Senders::default(), OPEN, None, 65_536),
                batch: Batch::default(),
                now: Instant::now(),
            }
        }

        /// What the intake makes of datagram `seq`, sent by process `pid` from `from`.
        fn take(&mut self, seq: u64, pid: u32, from: UnixAddr) -> Outcome {
            let mut enc = Encoder::new(5, DEFAULT_DATAGRAM).unwrap();
            enc.resume_as(5, seq);
            enc.push("abc", 1_000_000).unwrap();
            let bytes = enc.datagram();
            let m = Received {
                from: Some(from),
                ..meta(pid as i32, 1000, bytes.len())
            };
            let (intake, batch) = (&mut self.intake, &mut self.batch);
            intake.take(bytes, &m, batch, self.now, 0).0
        }
    }

    /// A live process of its own (`sleep`), to claim ids with: a take-over by a pid nobody
    /// has is refused.
    fn a_process() -> std::process::Child {
        std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap()
    }

    /// What `a_datagram_rejected_for_a_click_at_the_seq_awaited_is_passed_over` damages.
    #[derive(Clone, Copy)]
    enum Damage {
        None,
        Code,
        Agent,
    }

    /// A later process of the same user claims an id from another address while nobody is
    /// bound at the first: it moves there only from the same directory (where binding takes
    /// what binding the first did), not while the first is bound, and not to an address
    /// nobody is bound at here (bound in a mount namespace of the claimant's own).
    #[test]
    fn an_id_moves_to_a_successor_in_the_same_directory_once_the_first_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let at = |d: &tempfile::TempDir, name| UnixAddr::new(&d.path().join(name)).unwrap();
        let mut claims = Claims::new();
        let (mut first_process, next) = (a_process(), std::process::id());
        let first_pid = first_process.id();
        assert!(matches!(
            claims.take(0, first_pid, at(&dir, "a")),
            Outcome::Accepted { .. }
        ));
        let bind = |d: &tempfile::TempDir, name| {
            shared::socket::bind_datagram(&d.path().join(name), 0o600).unwrap()
        };
        let first = bind(&dir, "a");
        let _claims = (bind(&dir, "b"), bind(&other, "b"));
        let mismatch = Outcome::Rejected(Why::Refused(Refusal::SenderMismatch));
        assert_eq!(
            claims.take(1, next, at(&dir, "b")),
            mismatch,
            "the first still bound"
        );
        drop(first);
        // A process another test forks holds every descriptor until it execs: the socket
        // may outlive the drop for that moment.
        let gone_by = Instant::now() + testkit::LIMIT;
        while shared::socket::listening(&at(&dir, "a")) {
            assert!(Instant::now() < gone_by, "the first's socket still bound");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(
            claims.take(1, next, at(&dir, "c")),
            mismatch,
            "nobody bound at the claim's"
        );
        let elsewhere = claims.take(1, next, at(&other, "b"));
        assert_eq!(elsewhere, mismatch, "another directory");
        assert!(matches!(
            claims.take(1, next, at(&dir, "b")),
            Outcome::Accepted { .. }
        ));
        assert_eq!(
            claims.take(2, first_pid, at(&dir, "a")),
            mismatch,
            "the first does not take it back"
        );
        first_process.kill().unwrap();
        first_process.wait().unwrap();
    }

    /// The process an id was taken from is refused it while it lives, and let go once it is
    /// gone, so that a later process the kernel gives its pid takes the id over as any
    /// successor does (pids are given again, and a redirector given a replaced one's was
    /// refused until the collector restarted); a late datagram of the dead one is refused,
    /// not handed the id. A child process (`sleep`) stands for the process replaced.
    #[test]
    fn the_process_an_id_was_taken_from_is_refused_only_while_it_lives() {
        let dir = tempfile::tempdir().unwrap();
        let at = UnixAddr::new(&dir.path().join("ack")).unwrap();
        let mut claims = Claims::new();
        let (mut replaced, successor) = (a_process(), std::process::id());
        let gone = replaced.id();
        assert!(matches!(claims.take(0, gone, at), Outcome::Accepted { .. }));
        assert!(matches!(
            claims.take(1, successor, at),
            Outcome::Accepted { .. }
        ));
        let mismatch = Outcome::Rejected(Why::Refused(Refusal::SenderMismatch));
        let lives = claims.take(2, gone, at);
        assert_eq!(lives, mismatch, "the process replaced lives");
        replaced.kill().unwrap();
        replaced.wait().unwrap();
        assert!(matches!(
            claims.take(2, successor, at),
            Outcome::Accepted { .. }
        ));
        let replaced_now = claims.intake.senders().replaced(5);
        assert_eq!(replaced_now, None, "let go once gone");
        let late = claims.take(3, gone, at);
        assert_eq!(late, mismatch, "a datagram of the dead one, read late");
        assert!(
            matches!(claims.take(3, successor, at), Outcome::Accepted { .. }),
            "the successor keeps the id"
        );
    }

    #[test]
    fn takes_a_datagram_into_the_batch_and_names_each_rejection() {
        let mut intake = Intake::new(Senders::default(), OPEN, Some(vec![1000]), 65_536);
        let mut batch = Batch::default();
        let now = Instant::now();
        let good = datagram(5, 3);
        let take = |intake: &mut Intake, bytes: &[u8], m: Received, batch: &mut Batch| {
            intake.take(bytes, &m, batch, now, 0).0
        };
        let accepted = Outcome::Accepted {
            taken: Taken {
                sender: 5,
                seq: 0,
                lost: 0,
                evicted: 0,
            },
            clicks: 3,
        };
        assert_eq!(
            take(&mut intake, &good, meta(10, 1000, good.len()), &mut batch),
            accepted
        );
        assert_eq!(batch.len(), 3);
        let outcome = take(&mut intake, &good, meta(10, 0, good.len()), &mut batch);
        assert_eq!(outcome, Outcome::Rejected(Why::Unauthorized(Some(0))));
        let outcome = take(&mut intake, &good, meta(11, 1000, good.len()), &mut batch);
        assert_eq!(
            outcome.clone(),
            Outcome::Rejected(Why::Refused(Refusal::SenderMismatch))
        );
        let Outcome::Rejected(why) = outcome else {
            unreachable!()
        };
        assert_eq!(why.reason(), RejectReason::SenderMismatch);
        assert_eq!(
            take(&mut intake, &good, meta(10, 1000, good.len()), &mut batch),
            Outcome::Duplicate
        );
        let outcome = take(&mut intake, b"\x03", meta(10, 1000, 1), &mut batch);
        assert_eq!(
            outcome,
            Outcome::Rejected(Why::Wire(Reject::WrongVersion { got: 3, want: 2 }))
        );
        let mut cut = meta(10, 1000, 5);
        cut.truncated = true;
        assert_eq!(
            take(&mut intake, &good, cut, &mut batch),
            Outcome::Rejected(Why::Truncated(65_536))
        );
        let mut with_fds = meta(10, 1000, good.len());
        with_fds.fds = 2;
        assert_eq!(
            take(&mut intake, &good, with_fds, &mut batch),
            Outcome::Rejected(Why::FdsAttached(2))
        );
        let mut ctrunc = meta(10, 1000, good.len());
        (ctrunc.ctrunc, ctrunc.creds) = (true, None);
        assert_eq!(
            take(&mut intake, &good, ctrunc, &mut batch),
            Outcome::Rejected(Why::ControlTruncated)
        );
        assert_eq!(batch.len(), 3, "nothing else entered the batch");
    }
}
