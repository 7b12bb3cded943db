//! Each sender's seqs as this collector knows them: which datagrams are new, repeated or
//! missing, and what to tell a sender that waits for acknowledgements.
//!
//! Two kinds of sender. One that sends from an address of its own (a redirector) expects
//! acknowledgements and resends what is not acknowledged: its datagrams are accepted strictly
//! in seq order, a datagram past the next one expected is not accepted (the sender is asked to
//! resend from the missing one), and a repeat of a committed one is acknowledged again. One
//! without an address (`clicktap send`, an older redirector) is never acknowledged: a gap in
//! its seqs is counted as lost, as the wire format's first version had it.
//!
//! Loaded from `click_senders` at start; a batch commits its senders' seqs with its rows.

use std::collections::HashMap;
use std::time::Duration;

use nix::sys::socket::UnixAddr;
use shared::wire::Ack;
use tokio::time::Instant;
use tokio_postgres::Client;

/// An acknowledgement or resend request identical to one sent this recently is not sent again:
/// a burst of repeated or early datagrams gets one answer, not one each.
const REPEAT_AFTER: Duration = Duration::from_millis(200);

/// What a datagram is, by its sender's seq.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// New; `lost` datagrams of this sender were skipped before it (never for a sender that
    /// expects acknowledgements: it resends them).
    Accept { lost: u64 },
    /// Accepted before: skipped.
    Duplicate,
    /// From a sender that expects acknowledgements, past the next seq expected: not accepted,
    /// the sender resends from the missing one.
    Ahead,
}

/// A message for a sender: where, and what.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    pub to: UnixAddr,
    pub ack: Ack,
}

#[derive(Debug, Default)]
struct Sender {
    /// Highest seq accepted into a batch, committed or not.
    accepted: Option<u64>,
    /// Highest seq committed.
    committed: Option<u64>,
    /// Where its acknowledgements go; `None` while it sends from no address of its own.
    reply: Option<UnixAddr>,
    /// The last message sent to it, and when.
    told: Option<(Ack, Instant)>,
}

impl Sender {
    /// A reply of `ack`, unless the sender has no address or was told the same just now.
    fn tell(&mut self, ack: Ack, now: Instant, repeat: bool) -> Option<Reply> {
        let to = self.reply?;
        let recent = |&(told, at): &(Ack, Instant)| told == ack && now - at < REPEAT_AFTER;
        if !repeat && self.told.as_ref().is_some_and(recent) {
            return None;
        }
        self.told = Some((ack, now));
        Some(Reply { to, ack })
    }
}

#[derive(Debug, Default)]
pub struct Senders {
    map: HashMap<u64, Sender>,
}

impl Senders {
    /// The senders whose seqs were committed, each with its last committed seq.
    pub fn committed(last: impl IntoIterator<Item = (u64, u64)>) -> Senders {
        let map = last
            .into_iter()
            .map(|(sender, seq)| {
                let known = Sender {
                    accepted: Some(seq),
                    committed: Some(seq),
                    ..Sender::default()
                };
                (sender, known)
            })
            .collect();
        Senders { map }
    }

    /// Judges datagram `seq` of `sender`, sent from `from`, and, if new, remembers it as
    /// accepted; also what to tell the sender, if anything.
    pub fn judge(
        &mut self,
        sender: u64,
        seq: u64,
        from: Option<UnixAddr>,
        now: Instant,
    ) -> (Verdict, Option<Reply>) {
        let s = self.map.entry(sender).or_default();
        s.reply = from;
        let expected = s.accepted.map_or(0, |a| a.saturating_add(1));
        let (verdict, reply) = match (from, s.accepted) {
            (None, accepted) => match shared::seq::judge(accepted, seq, true) {
                shared::seq::Verdict::Duplicate => (Verdict::Duplicate, None),
                shared::seq::Verdict::Accept { lost } => (Verdict::Accept { lost }, None),
            },
            (Some(_), Some(accepted)) if seq <= accepted => {
                // Committed already: the sender missed the acknowledgement (or this collector
                // restarted), so it is told again. Pending: its commit will tell.
                let reply = match s.committed {
                    Some(committed) if seq <= committed => {
                        s.tell(Ack::new(sender, Some(committed), None), now, false)
                    }
                    _ => None,
                };
                (Verdict::Duplicate, reply)
            }
            (Some(_), _) if seq == expected => (Verdict::Accept { lost: 0 }, None),
            (Some(_), _) => {
                let ask = Ack::new(sender, s.committed, Some(expected));
                (Verdict::Ahead, s.tell(ask, now, false))
            }
        };
        if let Verdict::Accept { .. } = verdict {
            s.accepted = Some(seq);
        }
        (verdict, reply)
    }

    /// Records that `sender`'s datagrams up to `seq` are committed; the acknowledgement to
    /// send, if the sender expects one.
    pub fn commit(&mut self, sender: u64, seq: u64, now: Instant) -> Option<Reply> {
        let s = self.map.get_mut(&sender)?;
        let committed = s.committed.map_or(seq, |c| c.max(seq));
        s.committed = Some(committed);
        s.tell(Ack::new(sender, Some(committed), None), now, true)
    }

    /// Senders seen or known.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// The seqs committed so far; a sender not among them is judged from seq 0.
pub async fn load(client: &Client) -> Result<Senders, tokio_postgres::Error> {
    let rows = client
        .query("SELECT sender, last_seq FROM click_senders", &[])
        .await?;
    // Stored as bigint: the u64 bits reinterpreted.
    let last = rows
        .iter()
        .map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, i64>(1) as u64));
    Ok(Senders::committed(last))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr() -> Option<UnixAddr> {
        Some(UnixAddr::new_abstract(b"sender").unwrap())
    }

    fn ack(committed: Option<u64>, resend_from: Option<u64>) -> Option<Reply> {
        let to = addr().unwrap();
        Some(Reply {
            to,
            ack: Ack::new(7, committed, resend_from),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_sender_with_an_address_is_taken_in_order_and_told_what_is_committed() {
        let mut s = Senders::default();
        let now = Instant::now();
        assert_eq!(
            s.judge(7, 1, addr(), now),
            (Verdict::Ahead, ack(None, Some(0)))
        );
        assert_eq!(
            s.judge(7, 2, addr(), now),
            (Verdict::Ahead, None),
            "asked once"
        );
        assert_eq!(s.judge(7, 0, addr(), now).0, Verdict::Accept { lost: 0 });
        assert_eq!(s.judge(7, 1, addr(), now).0, Verdict::Accept { lost: 0 });
        assert_eq!(
            s.judge(7, 1, addr(), now),
            (Verdict::Duplicate, None),
            "pending"
        );
        assert_eq!(
            s.judge(7, 3, addr(), now),
            (Verdict::Ahead, ack(None, Some(2)))
        );
        assert_eq!(s.commit(7, 1, now), ack(Some(1), None));
        assert_eq!(
            s.judge(7, 0, addr(), now),
            (Verdict::Duplicate, None),
            "just told"
        );
        let later = now + REPEAT_AFTER;
        assert_eq!(
            s.judge(7, 0, addr(), later),
            (Verdict::Duplicate, ack(Some(1), None))
        );
        assert_eq!(
            s.commit(8, 0, now),
            None,
            "an unknown sender is told nothing"
        );
    }

    #[test]
    fn a_sender_without_an_address_gets_gaps_counted_and_nothing_back() {
        let mut s = Senders::committed([(7, 4)]);
        let now = Instant::now();
        assert_eq!(s.judge(7, 4, None, now), (Verdict::Duplicate, None));
        assert_eq!(
            s.judge(7, 8, None, now),
            (Verdict::Accept { lost: 3 }, None)
        );
        assert_eq!(
            s.judge(9, 2, None, now),
            (Verdict::Accept { lost: 2 }, None)
        );
        assert_eq!(s.commit(7, 8, now), None);
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn a_restarted_collector_acknowledges_what_was_committed_before_it() {
        let mut s = Senders::committed([(7, 4)]);
        let now = Instant::now();
        assert_eq!(
            s.judge(7, 3, addr(), now),
            (Verdict::Duplicate, ack(Some(4), None))
        );
        assert_eq!(
            s.judge(7, 6, addr(), now),
            (Verdict::Ahead, ack(Some(4), Some(5)))
        );
        assert_eq!(s.judge(7, 5, addr(), now).0, Verdict::Accept { lost: 0 });
    }
}
