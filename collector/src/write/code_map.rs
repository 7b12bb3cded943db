//! A map keyed by codes, for a batch's counts and breakdowns (looked up once a click, and
//! once per dimension it carries) and the unfolded sums (once per distinct code a batch):
//! most of the collector's CPU (BENCHMARKS.md, "The host's cost of a click", has the
//! profiles).
//!
//! - Hashed with foldhash (SipHash was a third of the collector's CPU), seeded at random so
//!   that chosen codes cannot collide on purpose, once per process so that a hash means the
//!   same in every map: each entry keeps its code's hash, a batch hands it on to the sums,
//!   and neither a sum added to nor a table that grows hashes a code again.
//! - A code of up to 24 bytes is held in its entry (`CompactString`): boxed codes cost a
//!   malloc and a free per code per batch, and a pointer chased per comparison.
//! - A code new to the map is probed for once and copied in (not compared again as it is
//!   inserted, as a `HashMap::entry_ref` does), and compared by words, not by a call to
//!   `memcmp`.

use std::hash::BuildHasher;
use std::sync::LazyLock;

use compact_str::CompactString;
use shared::hash_index::{self, HashIndex, Slot};

static SEED: LazyLock<foldhash::fast::RandomState> = LazyLock::new(Default::default);

/// Keys a caller of [`CodeMap::slot_each`] is ahead by when it asks for their slots and then
/// for their entries: far enough for a miss to come in, near enough to stay in the cache.
const SLOTS_AHEAD: usize = 16;
const ENTRIES_AHEAD: usize = 8;

/// Values per code: the entries in a vector, in the order their codes came, and an index of
/// their positions ([`HashIndex`]: eight bytes a slot, at most half of them full, where the
/// entries themselves take five or six words). A code new to a batch, as most are, is looked
/// for in the index alone (its slot asked for a few codes ahead) and its entry appended;
/// whoever reads the entries in turn (a batch's count lists, the sums, a fold) walks memory
/// in order.
///
/// Positions are `u32`: a batch holds at most `--batch-rows` (5 M) codes, and the sums what
/// `--compact-memory` (64 GiB at most, [`MAX_ENTRIES`]) holds at 40 bytes or more an entry.
#[derive(Debug)]
pub(crate) struct CodeMap<V> {
    index: HashIndex,
    entries: Vec<Entry<V>>,
}

#[derive(Debug)]
struct Entry<V> {
    hash: u64,
    code: CompactString,
    value: V,
}

impl<V> Default for CodeMap<V> {
    fn default() -> Self {
        CodeMap {
            index: HashIndex::default(),
            entries: Vec::new(),
        }
    }
}

/// The most entries a map can index.
pub(crate) const MAX_ENTRIES: u64 = hash_index::MAX_POSITIONS;

/// The hash of `code` in every [`CodeMap`] of this process.
pub(crate) fn hash(code: &str) -> u64 {
    SEED.hash_one(code)
}

impl<V> CodeMap<V> {
    /// The value of `code`, whose [`hash`] is `hash`, and whether it was new: then `new()`.
    pub(crate) fn slot(
        &mut self,
        code: &str,
        hash: u64,
        new: impl FnOnce() -> V,
    ) -> (&mut V, bool) {
        let entries = &mut self.entries;
        self.index
            .reserve_one(|| (0..).zip(entries.iter()).map(|(at, e)| (e.hash, at)));
        let found = self.index.probe(hash, |at| {
            let e = &entries[at as usize];
            e.hash == hash && same(&e.code, code)
        });
        match found {
            Slot::Taken { at, .. } => (&mut entries[at as usize].value, false),
            Slot::Free(i) => {
                // The entry first: a position never points past the entries.
                let at = entries.len();
                entries.push(Entry {
                    hash,
                    code: code.into(),
                    value: new(),
                });
                debug_assert!(
                    (at as u64) < MAX_ENTRIES,
                    "bounded by the flags (see CodeMap)"
                );
                self.index.fill(i, hash, at as u32);
                (&mut entries[at].value, true)
            }
        }
    }

    /// [`CodeMap::slot`] for each of `keys` (code, hash, what `f` is given with the value) in
    /// turn, with the slots and entries of the keys ahead asked for in advance: when most
    /// lookups miss the cache (the sums, each of whose codes a batch adds to), their misses
    /// then overlap instead of following one another.
    pub(crate) fn slot_each<'a, X>(
        &mut self,
        keys: impl Iterator<Item = (&'a str, u64, X)> + Clone,
        new: impl Fn() -> V,
        mut f: impl FnMut(&mut V, bool, X),
    ) {
        let mut slots_ahead = keys.clone().map(|(_, hash, _)| hash).skip(SLOTS_AHEAD);
        let mut entries_ahead = keys.clone().map(|(_, hash, _)| hash).skip(ENTRIES_AHEAD);
        for (code, hash, x) in keys {
            if let Some(ahead) = slots_ahead.next() {
                self.index.prefetch(ahead);
            }
            if let Some(ahead) = entries_ahead.next() {
                self.prefetch_entry(ahead);
            }
            let (value, new) = self.slot(code, hash, &new);
            f(value, new, x);
        }
    }

    /// For a caller that looks up `hashes` in turn, at the `i`th: asks for the slot of the key
    /// [`SLOTS_AHEAD`] on and the entry of the key [`ENTRIES_AHEAD`] on, as
    /// [`CodeMap::slot_each`] does.
    pub(crate) fn prefetch_ahead(&self, hashes: &[u64], i: usize) {
        if let Some(&ahead) = hashes.get(i + SLOTS_AHEAD) {
            self.index.prefetch(ahead);
        }
        if let Some(&ahead) = hashes.get(i + ENTRIES_AHEAD) {
            self.prefetch_entry(ahead);
        }
    }

    /// Asks for the likely entry of `hash`, once its slot is in (see [`CodeMap::slot_each`]).
    fn prefetch_entry(&self, hash: u64) {
        if let Some(entry) = self
            .index
            .likely(hash)
            .and_then(|at| self.entries.get(at as usize))
        {
            shared::cache::prefetch(entry);
        }
    }

    /// Each code with its hash and value, in the order they came.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, u64, &V)> + Clone {
        self.entries
            .iter()
            .map(|e| (e.code.as_str(), e.hash, &e.value))
    }

    /// Each code with its value, taken out.
    pub(crate) fn into_entries(self) -> impl Iterator<Item = (CompactString, V)> {
        self.entries.into_iter().map(|e| (e.code, e.value))
    }

    /// Empties it, keeping its memory for the next batch.
    pub(crate) fn clear(&mut self) {
        self.index.clear();
        self.entries.clear();
    }

    /// Bytes of its index and its entries (as they only grow, at their capacity), the codes
    /// held on the heap not included.
    pub(crate) fn table_bytes(&self) -> usize {
        self.index.bytes() + self.entries.capacity() * size_of::<Entry<V>>()
    }
}

/// Whether two codes are the same. Codes are short (a shortener's are 5 to 12 bytes): compared
/// a word at a time here rather than by a call to `memcmp` (`perf` had it at a tenth of the
/// collector's CPU).
fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    if a.len() < 8 {
        return a.iter().zip(b).all(|(x, y)| x == y);
    }
    let word = |s: &[u8], at: usize| u64::from_ne_bytes(s[at..at + 8].try_into().expect("8"));
    let last = a.len() - 8;
    // Whole words, then the last eight bytes (overlapping the one before when not a multiple).
    (0..last).step_by(8).all(|at| word(a, at) == word(b, at)) && word(a, last) == word(b, last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_compares_every_byte_at_every_length() {
        for len in 0..40 {
            let a: String = (0..len)
                .map(|i| char::from(b'a' + (i % 26) as u8))
                .collect();
            assert!(same(&a, &a.clone()), "{a}");
            for at in 0..len {
                let mut b = a.clone().into_bytes();
                b[at] = b'Z';
                let b = String::from_utf8(b).unwrap();
                assert!(!same(&a, &b), "{a} vs {b}");
            }
            assert!(!same(&a, &format!("{a}a")));
        }
    }

    #[test]
    fn counts_a_code_once_and_hands_its_hash_on() {
        let mut m = CodeMap::default();
        for code in ["abc", "defghijkl", "abc"] {
            *m.slot(code, hash(code), || 0).0 += 1;
        }
        let mut v: Vec<_> = m.iter().map(|(c, h, &n)| (c, h == hash(c), n)).collect();
        v.sort();
        assert_eq!(v, [("abc", true, 2), ("defghijkl", true, 1)]);
        assert!(m.slot("new", hash("new"), || 5).1);
        assert_eq!(m.iter().count(), 3);
    }

    #[test]
    fn slot_each_finds_every_code_through_growth_as_slot_does() {
        let codes: Vec<String> = (0..10_000).map(|i| format!("code{i}")).collect();
        let keys = || codes.iter().map(|c| (c.as_str(), hash(c), c.len() as i64));
        let mut m = CodeMap::default();
        let mut news = 0;
        m.slot_each(
            keys(),
            || 0,
            |v: &mut i64, new, n| {
                *v += n;
                news += usize::from(new);
            },
        );
        assert_eq!(news, codes.len(), "each code new once");
        m.slot_each(
            keys(),
            || 0,
            |v, new, n| {
                assert!(!new, "held");
                *v += n;
            },
        );
        for code in &codes {
            let (&mut n, new) = m.slot(code, hash(code), || 0);
            assert_eq!((n, new), (2 * code.len() as i64, false), "{code}");
        }
    }

    #[test]
    fn counts_its_entries_and_table_and_keeps_them_when_cleared() {
        let mut m = CodeMap::default();
        let n = 1000;
        for i in 0..n {
            let code = i.to_string();
            m.slot(&code, hash(&code), || 0i64);
        }
        let bytes = m.table_bytes();
        let least = n * (size_of::<Entry<i64>>() + size_of::<u64>());
        assert!(bytes >= least, "{bytes} bytes for {n} entries");
        m.clear();
        assert_eq!(m.iter().count(), 0);
        assert_eq!(m.table_bytes(), bytes, "the memory is kept");
    }
}
