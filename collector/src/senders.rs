//! The last accepted seq of each sender (redirector process), to skip duplicates and count
//! gaps. Loaded from click_senders at start; a batch commits its senders' seqs with its rows.

use std::collections::HashMap;

use tokio_postgres::Client;

/// What to do with a datagram, by its sender's seq.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// At or below the last accepted seq: already written, or on its way.
    Duplicate,
    /// New; `lost` datagrams of this sender were skipped before it.
    Accept { lost: u64 },
}

#[derive(Debug, Default)]
pub struct Senders {
    last: HashMap<u64, u64>,
}

impl Senders {
    /// The seqs committed so far.
    pub async fn load(client: &Client) -> Result<Senders, tokio_postgres::Error> {
        let rows = client
            .query("SELECT sender, last_seq FROM click_senders", &[])
            .await?;
        let last = rows
            .iter()
            // Stored as bigint: the u64 bits reinterpreted.
            .map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, i64>(1) as u64))
            .collect();
        Ok(Senders { last })
    }

    /// Judges datagram `seq` of `sender` and, if new, remembers it as the last one. A
    /// sender seen for the first time at seq N lost seqs 0 to N-1.
    pub fn accept(&mut self, sender: u64, seq: u64) -> Verdict {
        let lost = match self.last.get(&sender) {
            Some(&last) if seq <= last => return Verdict::Duplicate,
            Some(&last) => seq - last - 1,
            None => seq,
        };
        self.last.insert(sender, seq);
        Verdict::Accept { lost }
    }

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
        let mut s = Senders::default();
        assert_eq!(s.accept(7, 0), Verdict::Accept { lost: 0 });
        assert_eq!(s.accept(7, 0), Verdict::Duplicate);
        assert_eq!(s.accept(7, 1), Verdict::Accept { lost: 0 });
        assert_eq!(s.accept(7, 5), Verdict::Accept { lost: 3 });
        assert_eq!(s.accept(7, 4), Verdict::Duplicate);
        assert_eq!(s.accept(u64::MAX, 2), Verdict::Accept { lost: 2 });
        assert_eq!(s.len(), 2);
    }
}
