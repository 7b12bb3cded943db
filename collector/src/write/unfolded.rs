//! The counts of the batches this collector committed and has not folded yet, summed in memory
//! as the writer commits them. A fold then sends PostgreSQL one sum per (code, day) and
//! deletes those batches' `click_count_lists` rows by number, instead of having it unnest and
//! add up every batch's entries again: with codes spread over many links, that adding up was
//! most of the database's work (BENCHMARKS.md, "Totals").
//!
//! Invariant, kept by [`Unfolded::add`] and checked by the fold: the sums are exactly those of
//! the rows of this writer with `batch` in `first..=last`, and there are `rows` of them, unless
//! another collector's fold took some (the fold then deletes fewer rows than `rows`, rolls its
//! own part back and folds them the SQL way). Whatever this loses track of (a batch it did not
//! see committed as it wrote it, a fold that failed after taking the sums) becomes "stray":
//! the writer's rows up to that batch are folded the SQL way, which is always exact, because
//! the rows are the truth and the sums only a cache of them.
//!
//! Memory: the sums hold one entry per distinct (code, day), so they grow with the number of
//! codes clicked between folds, not with the clicks. They are held to a bound
//! (`--compact-memory`), counting the sums a fold has taken and not finished with: a fold is
//! due at half of it, and the maintenance task is woken then rather than at its next look;
//! sums that reach it all the same (no fold could run: the fold's connection away, another
//! collector folding, a fold slower than the codes come) are dropped, and their batches become
//! stray. That costs the database the SQL way for them, never exactness.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use compact_str::CompactString;
use shared::metrics::{Counter, Gauge};
use shared::throttle::Throttle;
use tokio::sync::Notify;

use crate::write::batch::{Batch, CodeCounts};

/// The bound on the sums' memory when none is given (`--compact-memory`'s default): with the
/// default batches, what keeps the collector's peak RSS within its budget and well under
/// collector.service's MemoryMax (BENCHMARKS.md, "The collector's memory").
pub const DEFAULT_MEMORY: usize = 64 << 20;

/// Keys a fold sends in one statement: the parameters of a statement are encoded whole before
/// they are sent (at 64-byte codes, 5 MiB for this many), so the sums go in statements of this
/// size, all in the fold's one transaction. Much larger ones can also tip the planner into
/// hashing the whole of a large click_counts for each statement instead of probing its index
/// (BENCHMARKS.md, "The fold in a database with history").
pub const CHUNK_KEYS: usize = 65_536;

/// This writer's committed, unfolded counts.
#[derive(Debug)]
pub struct Unfolded {
    writer: i64,
    /// The most memory the sums may take, those taken by a fold under way included.
    bound: usize,
    state: Mutex<State>,
    /// Woken when a fold becomes due by memory.
    due_by_memory: Notify,
    meters: Meters,
}

/// What the sums show in the metrics.
#[derive(Debug, Default)]
pub struct Meters {
    /// Estimated bytes of the sums, a fold's included.
    pub bytes: Gauge,
    /// Times the sums reached the bound and were dropped.
    pub dropped: Counter,
}

#[derive(Debug, Default)]
struct State {
    /// The last batch committed (0: none yet).
    last: i64,
    /// The first batch the sums hold; `first > last` when they hold none.
    first: i64,
    /// `click_count_lists` rows of batches `first..=last`.
    rows: i64,
    /// Clicks per day, then per code (looked up by `&str`: a code is allocated once a fold).
    sums: CodeCounts,
    /// Distinct (code, day) keys in `sums`.
    keys: usize,
    /// Entries (code, day, clicks) in the rows of batches `first..=last`: what a reader of
    /// click_totals adds up on top of click_counts for them.
    entries: usize,
    /// When the first batch of the sums was committed.
    since: Option<Instant>,
    /// This writer's rows up to this batch must be folded the SQL way.
    stray_upto: Option<i64>,
    /// Heap bytes of the codes in `sums` (those too long to be held inline).
    heap: usize,
    /// Estimated bytes of the sums a fold has taken and not finished with.
    taken: usize,
    /// The log line of sums dropped: when codes keep coming faster than folds go, each fold's
    /// time would repeat it.
    dropping: Throttle,
}

/// What a fold takes: sums to upsert, and this writer's batches to fold the SQL way.
#[derive(Debug, Default)]
pub struct Taken {
    pub(crate) sums: Option<Sums>,
    pub(crate) stray_upto: Option<i64>,
    /// Stray batches up to this one the fold left for the next (it folds them in slices).
    pub(crate) left: Option<i64>,
}

/// The sums of this writer's batches `first..=last`, which wrote `rows` rows: `keys` sums in
/// key order, in chunks of at most [`CHUNK_KEYS`], each sent (and freed) in turn.
#[derive(Debug)]
pub(crate) struct Sums {
    pub(crate) first: i64,
    pub(crate) last: i64,
    pub(crate) rows: i64,
    pub(crate) keys: usize,
    pub(crate) chunks: Vec<Chunk>,
}

/// Sums of consecutive keys, as the statement's three arrays.
#[derive(Debug, Default)]
pub(crate) struct Chunk {
    pub(crate) codes: Vec<CompactString>,
    pub(crate) days: Vec<i32>,
    pub(crate) clicks: Vec<i64>,
}

impl Unfolded {
    /// The sums of writer `writer`, held to [`DEFAULT_MEMORY`], unmetered.
    pub fn new(writer: i64) -> Unfolded {
        Unfolded::bounded(writer, DEFAULT_MEMORY, Meters::default())
    }

    /// The sums of writer `writer`, held to `bound` bytes, shown in `meters`.
    pub fn bounded(writer: i64, bound: usize, meters: Meters) -> Unfolded {
        Unfolded {
            writer,
            bound,
            state: Mutex::new(State {
                first: 1,
                dropping: Throttle::every(Duration::from_secs(60)),
                ..State::default()
            }),
            due_by_memory: Notify::new(),
            meters,
        }
    }

    /// The writer id whose rows these are.
    pub(crate) fn writer(&self) -> i64 {
        self.writer
    }

    /// The first batch the sums hold, or will: this writer's rows of the batches before it were
    /// folded by this process, but the stray ones (and unless an asynchronous failover lost
    /// that fold after its commit returned: the SQL way folds them then).
    pub(crate) fn held_from(&self) -> i64 {
        self.lock().first
    }

    /// Batch `number`, committed with exactly the counts of `batch`.
    pub fn add(&self, number: i64, batch: &Batch) {
        let mut s = self.lock();
        if number != s.last + 1 {
            // Not the next batch: what lies between is unknown here.
            s.stray(number);
            return;
        }
        s.last = number;
        s.rows += batch.count_row_count() as i64;
        s.entries += batch.delta_count();
        let State {
            sums, keys, heap, ..
        } = &mut *s;
        for (day, deltas) in batch.deltas() {
            let deltas = deltas.map(|(code, hash, clicks)| (code, hash, (code.len(), clicks)));
            let add = |sum: &mut i64, new, (len, clicks)| {
                *sum += clicks;
                if new {
                    *keys += 1;
                    *heap += heap_bytes(len);
                }
            };
            sums.entry(day).or_default().slot_each(deltas, || 0, add);
        }
        s.since.get_or_insert_with(Instant::now);
        let bytes = s.bytes();
        if bytes + s.taken >= self.bound {
            // Past the bound at most by one batch's keys (bounded by --batch-rows).
            if let Some(held) = s.dropping.allow() {
                tracing::warn!(
                    batch = number,
                    bytes,
                    taken = s.taken,
                    bound = self.bound,
                    held,
                    "the sums of the unfolded counts reached --compact-memory ({} bytes) before \
                     a fold took them ({held} more times since the last line): dropped; their \
                     batches, up to {number}, are folded from their rows, which costs the \
                     database more",
                    self.bound
                );
            }
            self.meters.dropped.inc();
            s.stray(number);
            self.show(&s);
            drop(s);
            give_memory_back();
            return;
        } else if bytes >= self.bound / 2 {
            self.due_by_memory.notify_one();
        }
        self.show(&s);
    }

    /// Waits until a fold is due by memory (at once if it became due since the last wait).
    pub(crate) async fn due_by_memory(&self) {
        self.due_by_memory.notified().await;
    }

    fn show(&self, s: &State) {
        let bytes = s.bytes() + s.taken;
        self.meters
            .bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Batch `number` is in, but not with the counts this would add (an earlier attempt whose
    /// answer was lost committed it, or rows were refused): fold up to it the SQL way.
    pub(crate) fn lose(&self, number: i64) {
        let mut s = self.lock();
        s.stray(number);
        self.show(&s);
    }

    /// A fold failed after [`Unfolded::take`]: what it took is left to the SQL way.
    pub(crate) fn give_back(&self, taken: &Taken) {
        let upto = taken.sums.as_ref().map(|s| s.last).max(taken.stray_upto);
        if let Some(upto) = upto {
            let mut s = self.lock();
            s.stray_upto = s.stray_upto.max(Some(upto));
        }
    }

    /// The fold of what [`Unfolded::take`] took is over, committed or not: its sums no longer
    /// count against the bound, and the stray batches it left are stray still.
    pub(crate) fn release(&self, taken: &Taken) {
        let mut s = self.lock();
        s.taken = 0;
        s.stray_upto = s.stray_upto.max(taken.left);
        self.show(&s);
        drop(s);
        give_memory_back();
    }

    /// Whether a fold is due: `entries` counts in the rows of the batches summed, the oldest
    /// committed `interval` ago, the sums at half the memory bound, or stray batches.
    pub(crate) fn due(&self, entries: usize, interval: Duration) -> bool {
        let s = self.lock();
        s.stray_upto.is_some()
            || s.entries >= entries
            || s.since.is_some_and(|t| t.elapsed() >= interval)
            || s.bytes() >= self.bound / 2
    }

    /// Everything to fold, leaving nothing behind. Its sums count against the bound until
    /// [`Unfolded::release`]. Only taken under the lock, which the writer waits on after each
    /// commit: they are sorted once it is let go (a sort of every key, which the writer and
    /// so the receive loop waited through, longer the larger `--compact-memory`).
    pub fn take(&self) -> Taken {
        let mut s = self.lock();
        s.taken = s.bytes();
        let taken = (s.first <= s.last).then(|| {
            let sums = Sums {
                first: s.first,
                last: s.last,
                rows: s.rows,
                keys: s.keys,
                chunks: Vec::new(),
            };
            (sums, std::mem::take(&mut s.sums))
        });
        s.restart();
        self.show(&s);
        let stray_upto = s.stray_upto.take();
        drop(s);
        let sums = taken.map(|(sums, counts)| Sums {
            chunks: in_chunks(counts),
            ..sums
        });
        Taken {
            sums,
            stray_upto,
            left: None,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state stays consistent at every step, so a panic elsewhere does not spoil it.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl State {
    /// Batches up to `number` are left to the SQL way; the sums start after it.
    fn stray(&mut self, number: i64) {
        self.last = self.last.max(number);
        self.stray_upto = self.stray_upto.max(Some(self.last));
        self.restart();
    }

    /// Empty sums, starting after the last batch.
    fn restart(&mut self) {
        self.first = self.last + 1;
        self.rows = 0;
        self.keys = 0;
        self.entries = 0;
        self.heap = 0;
        // The day maps go with their entries (not kept for reuse, as a batch's are): kept,
        // they would hold their largest size between folds.
        self.sums.clear();
        self.since = None;
    }

    /// Estimated bytes of the sums: each day map's table and entries (at their capacity) and
    /// the codes held on the heap.
    fn bytes(&self) -> usize {
        let tables: usize = self.sums.values().map(|c| c.table_bytes()).sum();
        tables + self.heap
    }
}

/// The sums of each day's codes as chunks of (code, day, clicks) in key order, as
/// click_counts was first filled: where the fold probes its index (new keys inserted; updates
/// once the table is much larger than the sums) it walks the index and pages in order (four
/// times faster than in hash order, measured at 245,000 keys).
fn in_chunks(sums: CodeCounts) -> Vec<Chunk> {
    let mut keys: Vec<_> = sums
        .into_iter()
        .flat_map(|(day, codes)| codes.into_entries().map(move |(c, n)| (c, day, n)))
        .collect();
    sort_in_key_order(&mut keys);
    let mut chunks = Vec::with_capacity(keys.len().div_ceil(CHUNK_KEYS));
    for (i, (code, day, clicks)) in keys.into_iter().enumerate() {
        if i % CHUNK_KEYS == 0 {
            chunks.push(Chunk::default());
        }
        let chunk = chunks.last_mut().expect("pushed above");
        chunk.codes.push(code);
        chunk.days.push(day);
        chunk.clicks.push(clicks);
    }
    chunks
}

/// Puts `keys` in (code, day) order. Their positions are sorted first, each in one integer
/// under the code's first 12 bytes (padded with zeros, which keeps byte order): most compares
/// are then one instruction on a key beside its neighbours, rather than a `memcmp` through each
/// code's `CompactString`, and whole codes are compared only on a tie (BENCHMARKS.md, "The
/// fifth step"). The sums are then moved into that order in place, and the positions dropped
/// before the statements' arrays are built, so that a fold of sums at `--compact-memory` holds
/// no more at once than it did before.
fn sort_in_key_order(keys: &mut [(CompactString, i32, i64)]) {
    let entry = |at: usize, code: &str| {
        let mut bytes = [0u8; 16];
        let head = &code.as_bytes()[..code.len().min(12)];
        bytes[..head.len()].copy_from_slice(head);
        u128::from_be_bytes(bytes) | at as u128
    };
    // A position fits in the low 32 bits, below `PLACED`: the sums hold what --compact-memory
    // allows at 40 bytes or more a key, at most 64 GiB, far fewer than 2^32 keys.
    let at = |entry: u128| entry as u32 as usize;
    let mut order: Vec<u128> = (keys.iter().enumerate())
        .map(|(i, (code, ..))| entry(i, code))
        .collect();
    order.sort_unstable_by(|a, b| {
        (a >> 32).cmp(&(b >> 32)).then_with(|| {
            let (x, y) = (&keys[at(*a)], &keys[at(*b)]);
            (x.0.as_str(), x.1).cmp(&(y.0.as_str(), y.1))
        })
    });
    // Cycle by cycle: the sum at `order[i]`'s position goes to `i`.
    const PLACED: u128 = u32::MAX as u128;
    for start in 0..order.len() {
        let mut i = start;
        while order[i] & PLACED != PLACED {
            let from = at(order[i]);
            order[i] |= PLACED;
            if from == start {
                break;
            }
            keys.swap(i, from);
            i = from;
        }
    }
}

/// Hands the memory of sums just freed back to the system. glibc keeps what is freed in its
/// arenas, in pieces between live allocations (the codes of the sums are small allocations
/// among the batches'), where only `malloc_trim` finds it: without it the collector's RSS stayed
/// near its peak of sums long after they were gone (BENCHMARKS.md, "The collector's memory").
fn give_memory_back() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free pages of the allocator's own arenas to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The heap bytes of a code of `len` bytes: none if held inline in its `CompactString`, else
/// its allocation as malloc rounds it (a word of header, 16-byte steps, 32 at least).
fn heap_bytes(len: usize) -> usize {
    if len <= std::mem::size_of::<CompactString>() {
        0
    } else {
        (len + 8).div_ceil(16).max(2) * 16
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::write::batch::DateWindow;
    use protocol::wire::{Click, Datagram};

    fn batch(codes: &[&str]) -> Batch {
        let clicks = codes.iter().map(|&code| Click::new(code, 0)).collect();
        let datagram = Datagram {
            version: protocol::wire::VERSION,
            sender: 1,
            seq: 0,
            base_us: protocol::now_us(),
            clicks,
        };
        let mut b = Batch::default();
        let window = DateWindow {
            max_age_us: i64::MAX,
            max_skew_us: i64::MAX,
        };
        b.push(&datagram, &window, protocol::now_us());
        b
    }

    /// A batch of one click each of 64-byte codes `from..from + n`.
    fn distinct(from: usize, n: usize) -> Batch {
        let codes: Vec<String> = (from..from + n).map(|i| format!("{i:064}")).collect();
        batch(&codes.iter().map(String::as_str).collect::<Vec<_>>())
    }

    fn sums(taken: &Taken) -> Vec<(&str, i64)> {
        let s = taken.sums.as_ref().unwrap();
        let mut v: Vec<_> = s
            .chunks
            .iter()
            .flat_map(|c| c.codes.iter().map(|c| &**c).zip(c.clicks.iter().copied()))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn sums_are_taken_in_byte_order_of_code_then_day() {
        // Codes that tie on their first 12 bytes, are prefixes of one another, or differ
        // only past byte 12, each on two days, in a scrambled order.
        let stems = [
            "a",
            "ab",
            "abcdefghijk",
            "abcdefghijkl",
            "abcdefghijklmnop",
            "abcdefghijklmnopq",
            "abcdefghijklmnopr",
        ];
        let mut keys: Vec<(CompactString, i32, i64)> = Vec::new();
        for (i, stem) in stems.iter().enumerate() {
            for tail in ["", "Z", "z", "0123456789abcdefghij"] {
                for day in [9_000, 8_999] {
                    keys.push((format!("{stem}{tail}").into(), day, i as i64));
                }
            }
        }
        let mut x = 7_u64;
        for i in (1..keys.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            keys.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let mut expected = keys.clone();
        expected.sort_unstable();
        sort_in_key_order(&mut keys);
        assert_eq!(keys, expected);
    }

    #[test]
    fn a_take_sends_its_chunks_in_key_order() {
        let n = CHUNK_KEYS + 1000;
        // Codes that come in an order far from their byte order (7919 is prime to n).
        let codes: Vec<String> = (0..n).map(|i| format!("c{}", i * 7919 % n)).collect();
        let u = Unfolded::new(7);
        u.add(
            1,
            &batch(&codes.iter().map(String::as_str).collect::<Vec<_>>()),
        );
        let taken = u.take();
        let chunks = &taken.sums.as_ref().unwrap().chunks;
        assert_eq!(chunks.len(), 2);
        let keys: Vec<(&str, i32)> = chunks
            .iter()
            .flat_map(|c| {
                c.codes
                    .iter()
                    .map(|c| c.as_str())
                    .zip(c.days.iter().copied())
            })
            .collect();
        assert_eq!(keys.len(), n);
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "not in key order");
    }

    #[test]
    fn sums_consecutive_batches_and_starts_over_after_a_take() {
        let u = Unfolded::new(7);
        u.add(1, &batch(&["a", "b", "a"]));
        u.add(2, &batch(&["b"]));
        let taken = u.take();
        assert_eq!(sums(&taken), [("a", 2), ("b", 2)]);
        let s = taken.sums.as_ref().unwrap();
        assert_eq!((s.first, s.last, s.rows), (1, 2, 2));
        assert_eq!(taken.stray_upto, None);
        assert!(u.take().sums.is_none(), "nothing since");
        u.add(3, &batch(&["c"]));
        assert_eq!(u.take().sums.unwrap().first, 3);
    }

    #[test]
    fn a_batch_out_of_turn_or_lost_leaves_everything_up_to_it_to_sql() {
        let u = Unfolded::new(7);
        u.add(1, &batch(&["a"]));
        u.add(3, &batch(&["a"]));
        let taken = u.take();
        assert!(taken.sums.is_none());
        assert_eq!(taken.stray_upto, Some(3));
        u.add(4, &batch(&["a"]));
        u.lose(5);
        u.add(6, &batch(&["b"]));
        let taken = u.take();
        assert_eq!(taken.stray_upto, Some(5));
        assert_eq!(sums(&taken), [("b", 1)]);
    }

    #[test]
    fn a_failed_fold_gives_what_it_took_to_sql() {
        let u = Unfolded::new(7);
        u.add(1, &batch(&["a"]));
        let taken = u.take();
        u.add(2, &batch(&["a"]));
        u.give_back(&taken);
        let again = u.take();
        assert_eq!(again.stray_upto, Some(1));
        assert_eq!(again.sums.unwrap().first, 2);
    }

    #[test]
    fn due_at_the_size_the_age_or_strays() {
        let u = Unfolded::new(7);
        let hour = Duration::from_secs(3600);
        assert!(!u.due(10, hour));
        u.add(1, &batch(&["a", "b"]));
        assert!(!u.due(10, hour));
        u.add(2, &batch(&["a"]));
        assert!(!u.due(4, hour));
        assert!(u.due(3, hour), "three counts in the rows, of two keys");
        assert!(u.due(10, Duration::ZERO), "old enough");
        u.lose(2);
        assert!(u.due(10, hour), "strays");
    }

    #[test]
    fn estimates_the_codes_on_the_heap() {
        assert_eq!(heap_bytes(24), 0, "held inline");
        assert_eq!(heap_bytes(25), 48);
        assert_eq!(heap_bytes(64), 80);
    }

    #[test]
    fn due_at_half_the_memory_bound_and_woken_then() {
        let u = Unfolded::bounded(7, 1 << 20, Meters::default());
        let hour = Duration::from_secs(3600);
        let mut number = 0;
        while u.meters.bytes.get() < 1 << 19 {
            assert!(
                !u.due(usize::MAX, hour),
                "at {} bytes",
                u.meters.bytes.get()
            );
            number += 1;
            u.add(number, &distinct(number as usize * 100, 100));
        }
        assert!(u.due(usize::MAX, hour));
        let woken = std::pin::pin!(u.due_by_memory());
        assert!(
            futures_util::FutureExt::now_or_never(woken).is_some(),
            "the maintenance task is woken"
        );
        assert_eq!(u.meters.dropped.get(), 0);
        let taken = u.take();
        assert_eq!(taken.sums.unwrap().keys, number as usize * 100);
    }

    #[test]
    fn sums_that_reach_the_bound_are_dropped_and_their_batches_left_to_sql() {
        let u = Unfolded::bounded(7, 1 << 20, Meters::default());
        let mut number = 0;
        while u.meters.dropped.get() == 0 {
            number += 1;
            u.add(number, &distinct(number as usize * 100, 100));
            assert!(u.meters.bytes.get() < 1 << 20, "never held at the bound");
        }
        assert_eq!(u.meters.bytes.get(), 0, "nothing held");
        u.add(number + 1, &distinct(0, 10));
        let taken = u.take();
        assert_eq!(
            taken.stray_upto,
            Some(number),
            "up to the batch that reached it"
        );
        let sums = taken.sums.unwrap();
        assert_eq!((sums.first, sums.keys), (number + 1, 10));
    }

    /// Batches of 100 distinct codes `u` takes until its sums are dropped.
    fn batches_to_the_bound(u: &Unfolded, mut number: i64) -> i64 {
        let first = number;
        while u.meters.dropped.get() == 0 {
            number += 1;
            u.add(number, &distinct(number as usize * 100, 100));
        }
        number - first
    }

    #[test]
    fn sums_taken_by_a_fold_count_against_the_bound_until_released() {
        let alone = batches_to_the_bound(&Unfolded::bounded(7, 1 << 20, Meters::default()), 0);
        let u = Unfolded::bounded(7, 1 << 20, Meters::default());
        let mut number = 0;
        while !u.due(usize::MAX, Duration::from_secs(3600)) {
            number += 1;
            u.add(number, &distinct(number as usize * 100, 100));
        }
        let held = u.meters.bytes.get();
        let taken = u.take();
        assert_eq!(u.meters.bytes.get(), held, "the fold's, until it is over");
        let beside = batches_to_the_bound(&u, number);
        assert!(
            beside < alone,
            "beside the fold's sums the new ones reach the bound sooner: {beside} of {alone}"
        );
        u.release(&taken);
        assert_eq!(u.meters.bytes.get(), 0);
    }
}
