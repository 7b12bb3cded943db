//! An index of `u32` positions by 64-bit hash, for maps whose entries live elsewhere (the
//! redirector's link arena, the collector's code maps): open addressing with linear probing
//! over `u64` slots, each the hash's high 32 bits as a tag and the position + 1 (0: empty).
//!
//! A lookup reads one slot and, only when the tag matches, the entry: one cache miss fewer
//! than an index whose tags live apart from its values (hashbrown's control bytes: slower on
//! the redirector's hits, BENCHMARKS.md, "Lookups and memory per link"). And since where a
//! lookup starts is known from the hash alone, a caller with many keys to look up can
//! [`HashIndex::prefetch`] the slots of those a few ahead, so that their misses overlap
//! instead of following one another (the collector's sums, which miss the cache on nearly
//! every code).

/// How full an index may be: 4 slots in 5 when it is built once for a known number of keys
/// (the redirector's links, looked up mostly by codes it holds), half when it grows a key at a
/// time (the collector's maps, which take mostly keys they do not hold yet: a probe for one
/// runs to an empty slot, and runs long in a fuller index; BENCHMARKS.md, "The host's cost of
/// a click").
const BUILT_FILL: (usize, usize) = (4, 5);
const GROWN_FILL: (usize, usize) = (1, 2);

/// The most positions an index holds: `0..u32::MAX`, as a slot holds the position + 1 in its
/// low 32 bits.
pub const MAX_POSITIONS: u64 = u32::MAX as u64;

/// Where a key is, or would go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// The slot holding the key, and the key's position.
    Taken { slot: usize, at: u32 },
    /// The empty slot where the probe for it ended.
    Free(usize),
}

/// Positions by hash, in `u64` slots (see the module's doc).
#[derive(Debug, Default, Clone)]
pub struct HashIndex {
    slots: Box<[u64]>,
    len: usize,
}

impl HashIndex {
    /// An index that holds `n` positions without growing.
    pub fn with_capacity(n: usize) -> HashIndex {
        HashIndex::with_slots(slots_for(n, BUILT_FILL))
    }

    fn with_slots(n: usize) -> HashIndex {
        HashIndex {
            slots: vec![0; n].into_boxed_slice(),
            len: 0,
        }
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its slots, full or empty.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Bytes of its slots.
    pub fn bytes(&self) -> usize {
        self.slots.len() * size_of::<u64>()
    }

    /// Adds `at` under `hash`, which the index does not hold yet, and for which it has room
    /// ([`HashIndex::with_capacity`], [`HashIndex::reserve_one`]).
    pub fn insert(&mut self, hash: u64, at: u32) {
        if let Slot::Free(free) = self.probe(hash, |_| false) {
            self.fill(free, hash, at);
        }
    }

    /// Where the key of `hash` for which `eq(position)` holds is, or would go (the index has
    /// room for one more: [`HashIndex::reserve_one`]).
    pub fn probe(&self, hash: u64, mut eq: impl FnMut(u32) -> bool) -> Slot {
        let mask = self.slots.len() - 1;
        let mut i = self.home(hash);
        loop {
            let slot = self.slots[i];
            if slot == 0 {
                return Slot::Free(i);
            }
            if slot >> 32 == hash >> 32 && eq(slot as u32 - 1) {
                let at = slot as u32 - 1;
                return Slot::Taken { slot: i, at };
            }
            i = (i + 1) & mask;
        }
    }

    /// The slot of the key of `hash` for which `eq(position)` holds.
    pub fn find(&self, hash: u64, eq: impl FnMut(u32) -> bool) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        match self.probe(hash, eq) {
            Slot::Taken { slot, .. } => Some(slot),
            Slot::Free(_) => None,
        }
    }

    /// Puts `at` under `hash` into `free`, a [`Slot::Free`] of a probe since which the index
    /// has not changed.
    pub fn fill(&mut self, free: usize, hash: u64, at: u32) {
        debug_assert_eq!(self.slots[free], 0, "a free slot");
        debug_assert!(
            u64::from(at) < MAX_POSITIONS,
            "position {at} past MAX_POSITIONS"
        );
        self.slots[free] = (hash & !0xffff_ffff) | (u64::from(at) + 1);
        self.len += 1;
        debug_assert!(
            self.len < self.slots.len(),
            "an empty slot ends every probe"
        );
    }

    /// The position in slot `i`, if it holds one.
    pub fn at(&self, i: usize) -> Option<u32> {
        self.slots
            .get(i)
            .filter(|&&s| s != 0)
            .map(|&s| s as u32 - 1)
    }

    /// Makes room for one more position, doubling the slots when they are half full; `held`
    /// then gives each (hash, position) held, as the slots keep only the hash's high half (from
    /// the entries, walked in order rather than looked up slot by slot).
    pub fn reserve_one<I>(&mut self, held: impl FnOnce() -> I)
    where
        I: Iterator<Item = (u64, u32)>,
    {
        let (num, den) = GROWN_FILL;
        if (self.len + 1) * den <= self.slots.len() * num {
            return;
        }
        let slots = slots_for(self.len + 1, GROWN_FILL).max(2 * self.slots.len());
        let mut grown = HashIndex::with_slots(slots);
        for (hash, at) in held() {
            grown.insert(hash, at);
        }
        debug_assert_eq!(grown.len, self.len, "every position held");
        *self = grown;
    }

    /// Empties it, keeping its slots.
    pub fn clear(&mut self) {
        self.slots.fill(0);
        self.len = 0;
    }

    /// Asks the CPU to bring in the slot where a probe for `hash` starts, to be read soon.
    pub fn prefetch(&self, hash: u64) {
        if let Some(slot) = self.slots.get(self.home(hash)) {
            crate::cache::prefetch(slot);
        }
    }

    /// The position in the first slot of a probe for `hash` whose tag matches: the likely
    /// entry of `hash`, for a caller to [`prefetch`](crate::cache::prefetch) before it looks
    /// the key up (once the slots are in: this reads them).
    pub fn likely(&self, hash: u64) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        match self.probe(hash, |_| true) {
            Slot::Taken { at, .. } => Some(at),
            Slot::Free(_) => None,
        }
    }

    /// The slot where a probe for `hash` starts (any number when there are no slots).
    fn home(&self, hash: u64) -> usize {
        hash as usize & self.slots.len().wrapping_sub(1)
    }
}

/// Slots for `n` positions: a power of two, at most `fill` full.
fn slots_for(n: usize, (num, den): (usize, usize)) -> usize {
    (n * den / num + 1).next_power_of_two()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Puts positions `0..n` under `hash_of(position)`, a key at a time, as a map that grows.
    fn grown(n: u32, hash_of: impl Fn(u32) -> u64) -> HashIndex {
        let mut index = HashIndex::default();
        for at in 0..n {
            index.reserve_one(|| (0..at).map(|p| (hash_of(p), p)));
            let Slot::Free(free) = index.probe(hash_of(at), |p| p == at) else {
                panic!("{at} found before it was put");
            };
            index.fill(free, hash_of(at), at);
        }
        index
    }

    /// Finds every position of `0..n` under its hash, and one it does not hold.
    fn finds_all(index: &HashIndex, n: u32, hash_of: impl Fn(u32) -> u64) {
        for at in 0..n {
            let i = index.find(hash_of(at), |p| p == at);
            assert_eq!(i.and_then(|i| index.at(i)), Some(at), "position {at}");
        }
        assert_eq!(index.find(hash_of(n + 1), |p| p == n + 1), None);
    }

    #[test]
    fn finds_what_it_holds_through_growth_and_tag_collisions() {
        // Hashes sharing their high half (the tag) and their slot bits, so that `eq` decides.
        let hash_of = |at: u32| (7u64 << 32) | u64::from(at % 3);
        let mut index = grown(1000, hash_of);
        assert_eq!(index.len(), 1000);
        assert!(index.slots() >= 2 * 1000, "{} slots", index.slots());
        finds_all(&index, 1000, hash_of);
        index.clear();
        assert_eq!(index.find(hash_of(1), |p| p == 1), None);
        assert!(index.is_empty());
    }

    #[test]
    fn growth_puts_each_position_back_under_its_whole_hash() {
        // Hashes spread over the slot bits, as a real hash's: a growth that lost their low
        // half would leave positions where no probe for them starts.
        let hash_of = |at: u32| {
            let mut x = u64::from(at).wrapping_add(0x9e37_79b9_7f4a_7c15);
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            x ^ (x >> 31)
        };
        let index = grown(20_000, hash_of);
        finds_all(&index, 20_000, hash_of);
    }

    #[test]
    fn the_likely_position_is_the_first_on_the_probe_whose_tag_matches() {
        let mut index = HashIndex::with_capacity(4);
        assert_eq!(index.likely(0x1_0000_0003), None);
        index.insert(0x3_0000_0003, 7);
        index.insert(0x1_0000_0003, 9);
        assert_eq!(
            index.likely(0x1_0000_0003),
            Some(9),
            "past a slot of another tag"
        );
        assert_eq!(index.likely(0x2_0000_0003), None, "another tag");
        assert_eq!(HashIndex::default().likely(3), None, "no slots");
        HashIndex::default().prefetch(3);
    }
}
