//! Each sender's last datagram seq, to tell new datagrams from repeats and count the ones
//! missing in between. The collector judges what it writes by it; `clicktap listen` reports by it.

use std::collections::HashMap;

/// What a datagram is, by its sender's seq.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// At or below the last accepted seq: seen already.
    Again,
    /// New; `lost` datagrams of this sender were skipped before it.
    New { lost: u64 },
}

/// Judges datagram `seq` given the sender's last accepted seq, if any. With `from_start`, a
/// sender seen first at seq N lost seqs 0 to N-1; otherwise its first datagram counts nothing
/// as missing.
pub fn judge(last: Option<u64>, seq: u64, from_start: bool) -> Seen {
    let lost = match last {
        Some(last) if seq <= last => return Seen::Again,
        Some(last) => seq - last - 1,
        None if from_start => seq,
        None => 0,
    };
    Seen::New { lost }
}

/// Each sender's last accepted seq and nothing else: what an observer such as `clicktap listen`
/// keeps. The collector's `Senders` judges by the same [`judge`] but also keeps reply addresses,
/// owners and committed seqs, so it is a sender table, not this.
#[derive(Debug)]
pub struct LastSeqs {
    last: HashMap<u64, u64>,
    /// Whether a sender's first datagram seen was preceded by none (the receiver saw the
    /// sender from its start) or may have been (the receiver joined mid-stream).
    joined_mid_stream: bool,
    /// Senders kept at most (a mid-stream observer's; see [`LastSeqs::accept`]).
    most: usize,
}

impl Default for LastSeqs {
    /// From the start, knowing nobody yet.
    fn default() -> LastSeqs {
        LastSeqs::from_start(HashMap::new())
    }
}

impl LastSeqs {
    /// For a receiver that sees every sender from seq 0 on, given the last seqs known so far:
    /// a sender seen first at seq N lost seqs 0 to N-1.
    pub fn from_start(last: HashMap<u64, u64>) -> LastSeqs {
        LastSeqs {
            last,
            joined_mid_stream: false,
            most: usize::MAX,
        }
    }

    /// For an observer that starts listening at any moment: a sender's first datagram seen
    /// counts nothing as missing. It keeps at most `most` senders.
    pub fn mid_stream(most: usize) -> LastSeqs {
        LastSeqs {
            last: HashMap::new(),
            joined_mid_stream: true,
            most,
        }
    }

    /// Judges datagram `seq` of `sender` and, if new, remembers it as the last one. A
    /// mid-stream observer past its most senders (a flood of fresh ids) starts again, as if it
    /// had just joined, rather than grow without bound.
    pub fn accept(&mut self, sender: u64, seq: u64) -> Seen {
        let full = self.last.len() >= self.most;
        if self.joined_mid_stream && full && !self.last.contains_key(&sender) {
            self.last.clear();
        }
        let verdict = judge(
            self.last.get(&sender).copied(),
            seq,
            !self.joined_mid_stream,
        );
        if let Seen::New { .. } = verdict {
            self.last.insert(sender, seq);
        }
        verdict
    }

    /// Senders seen or known.
    pub fn len(&self) -> usize {
        self.last.len()
    }

    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_and_gaps() {
        let mut s = LastSeqs::default();
        assert_eq!(s.accept(7, 0), Seen::New { lost: 0 });
        assert_eq!(s.accept(7, 0), Seen::Again);
        assert_eq!(s.accept(7, 1), Seen::New { lost: 0 });
        assert_eq!(s.accept(7, 5), Seen::New { lost: 3 });
        assert_eq!(s.accept(7, 4), Seen::Again);
        assert_eq!(s.accept(u64::MAX, 2), Seen::New { lost: 2 });
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn a_mid_stream_observer_counts_nothing_before_a_first_sight() {
        let mut s = LastSeqs::mid_stream(10);
        assert_eq!(s.accept(7, 40), Seen::New { lost: 0 });
        assert_eq!(s.accept(7, 42), Seen::New { lost: 1 });
        assert_eq!(s.accept(7, 42), Seen::Again);
    }

    /// `clicktap listen` on a collector's mirror sees every datagram, floods of fresh ids too.
    #[test]
    fn a_mid_stream_observer_keeps_a_bounded_number_of_senders() {
        let most = 1_000;
        let mut s = LastSeqs::mid_stream(most as usize);
        for sender in 0..most {
            s.accept(sender, 5);
        }
        assert_eq!(s.accept(0, 7), Seen::New { lost: 1 });
        assert_eq!(s.accept(most, 0), Seen::New { lost: 0 });
        assert_eq!(s.len(), 1, "started again");
        assert_eq!(s.accept(0, 9), Seen::New { lost: 0 }, "as if first seen");
    }
}
