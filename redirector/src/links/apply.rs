//! Turning rows into shard changes: a [`Batch`] gathers puts and removes per shard and applies
//! each touched shard once; [`Seen`] finds the codes a full comparison did not see.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::table::{shard_of, Changes, Probe, Shard, Table, SHARDS};

/// While serving, a change to a shard is applied early once it reaches half the shard (and at
/// least this many links), so a comparison that finds most of a large table changed holds at
/// most half a table of pending rows, and a shard is copied a bounded number of times.
const EAGER_MIN: usize = 256;

/// Changes gathered per shard and applied shard by shard.
pub(super) struct Batch<'a> {
    table: &'a Table,
    /// Only the shards touched: a read of a few changes allocates for those alone. Ordered:
    /// building the shards in order left the heap 90 MB smaller at 10 M links than a
    /// HashMap's order did.
    pending: BTreeMap<usize, Changes>,
    /// Nothing is served yet (the first load): every code is new, nothing is applied before
    /// the end, and each shard is built once.
    first: bool,
    /// Codes whose served value changed.
    pub changed: u64,
}

impl<'a> Batch<'a> {
    pub(super) fn new(table: &'a Table, first: bool) -> Batch<'a> {
        Batch {
            table,
            pending: BTreeMap::new(),
            first,
            changed: 0,
        }
    }

    /// Makes `code` answer `url`, or nothing for `None`. Does nothing if it already does.
    /// Each code at most once per batch.
    pub(super) fn set(&mut self, code: &[u8], url: Option<&[u8]>) {
        let hash = self.table.hasher().hash(code);
        let i = shard_of(hash);
        if self.first {
            if let Some(url) = url {
                self.changed += 1;
                self.pending.entry(i).or_default().puts.push(code, url);
            }
            return;
        }
        let current = self.table.shard(i);
        let unchanged = matches!(
            (current.slot_of(hash, code, url.unwrap_or_default()), url),
            (Probe::Same(_), Some(_)) | (Probe::Absent, None)
        );
        if unchanged {
            return;
        }
        self.changed += 1;
        let pending = self.pending.entry(i).or_default();
        match url {
            Some(url) => pending.puts.push(code, url),
            None => pending.removes.push(code.into()),
        }
        if pending.len() >= EAGER_MIN.max(current.len() / 2) {
            self.flush(i);
        }
    }

    fn flush(&mut self, i: usize) {
        if let Some(changes) = self.pending.remove(&i) {
            self.table.apply(i, changes);
        }
    }

    /// Applies what is still pending.
    pub(super) fn finish(self) -> u64 {
        for (i, changes) in self.pending {
            self.table.apply(i, changes);
        }
        self.changed
    }
}

/// Which of the links being served a full comparison saw in `links`: one bit per index slot
/// of each shard, as the shards were when it started (nothing else changes them meanwhile).
pub(super) struct Seen {
    /// Each shard as the comparison started, let go of once its unseen links are removed: held
    /// to the end, every shard a removal rebuilt would be in memory twice, the whole table's
    /// worth when the removals are spread over it.
    shards: Vec<Option<Arc<Shard>>>,
    bits: Vec<Vec<u64>>,
}

impl Seen {
    pub(super) fn new(table: &Table) -> Seen {
        let shards: Vec<Option<Arc<Shard>>> = (0..SHARDS).map(|i| Some(table.shard(i))).collect();
        let bits = shards
            .iter()
            .flatten()
            .map(|s| vec![0; s.slots().div_ceil(64)])
            .collect();
        Seen { shards, bits }
    }

    pub(super) fn mark(&mut self, table: &Table, code: &[u8]) {
        let hash = table.hasher().hash(code);
        let i = shard_of(hash);
        let Some(shard) = &self.shards[i] else {
            return;
        };
        if let Probe::Same(b) | Probe::Different(b) = shard.slot_of(hash, code, b"") {
            self.bits[i][b / 64] |= 1 << (b % 64);
        }
    }

    /// Removes every link that was not seen; returns how many.
    pub(super) fn remove_unseen(mut self, table: &Table) -> u64 {
        (0..SHARDS).map(|i| self.remove_unseen_in(i, table)).sum()
    }

    /// Removes the links of shard `i` that were not seen, and lets go of the shard as it was.
    pub(super) fn remove_unseen_in(&mut self, i: usize, table: &Table) -> u64 {
        let Some(shard) = self.shards[i].take() else {
            return 0;
        };
        let bits = std::mem::take(&mut self.bits[i]);
        let mut changes = Changes::default();
        for b in 0..shard.slots() {
            match shard.code_in_slot(b) {
                Some(code) if bits[b / 64] & (1 << (b % 64)) == 0 => {
                    changes.removes.push(code.into());
                }
                _ => {}
            }
        }
        drop(shard);
        let removed = changes.removes.len() as u64;
        if removed > 0 {
            table.apply(i, changes);
        }
        removed
    }
}
