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

use std::sync::Mutex;
use std::time::{Duration, Instant};

use compact_str::CompactString;

use crate::write::batch::{Batch, CodeCounts};

/// This writer's committed, unfolded counts.
#[derive(Debug)]
pub struct Unfolded {
    writer: i64,
    state: Mutex<State>,
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
}

/// What a fold takes: sums to upsert, and this writer's batches to fold the SQL way.
#[derive(Debug, Default)]
pub(crate) struct Taken {
    pub(crate) sums: Option<Sums>,
    pub(crate) stray_upto: Option<i64>,
}

/// The sums of this writer's batches `first..=last`, which wrote `rows` rows.
#[derive(Debug)]
pub(crate) struct Sums {
    pub(crate) first: i64,
    pub(crate) last: i64,
    pub(crate) rows: i64,
    pub(crate) codes: Vec<CompactString>,
    pub(crate) days: Vec<i32>,
    pub(crate) clicks: Vec<i64>,
}

impl Unfolded {
    pub fn new(writer: i64) -> Unfolded {
        Unfolded {
            writer,
            state: Mutex::new(State {
                first: 1,
                ..State::default()
            }),
        }
    }

    /// The writer id whose rows these are.
    pub(crate) fn writer(&self) -> i64 {
        self.writer
    }

    /// Batch `number`, committed with exactly the counts of `batch`.
    pub(crate) fn add(&self, number: i64, batch: &Batch) {
        let mut s = self.lock();
        if number != s.last + 1 {
            // Not the next batch: what lies between is unknown here.
            s.stray(number);
            return;
        }
        s.last = number;
        s.rows += batch.count_row_count() as i64;
        s.entries += batch.delta_count();
        for (code, day, clicks) in batch.deltas() {
            let codes = s.sums.entry(day).or_default();
            match codes.get_mut(code) {
                Some(n) => *n += clicks,
                None => {
                    codes.insert(code.into(), clicks);
                    s.keys += 1;
                }
            }
        }
        s.since.get_or_insert_with(Instant::now);
    }

    /// Batch `number` is in, but not with the counts this would add (an earlier attempt whose
    /// answer was lost committed it, or rows were refused): fold up to it the SQL way.
    pub(crate) fn lose(&self, number: i64) {
        self.lock().stray(number);
    }

    /// A fold failed after [`Unfolded::take`]: what it took is left to the SQL way.
    pub(crate) fn give_back(&self, taken: &Taken) {
        let upto = taken.sums.as_ref().map(|s| s.last).max(taken.stray_upto);
        if let Some(upto) = upto {
            let mut s = self.lock();
            s.stray_upto = s.stray_upto.max(Some(upto));
        }
    }

    /// Whether a fold is due: `entries` counts in the rows of the batches summed, the oldest
    /// committed `interval` ago, or stray batches.
    pub(crate) fn due(&self, entries: usize, interval: Duration) -> bool {
        let s = self.lock();
        s.stray_upto.is_some()
            || s.entries >= entries
            || s.since.is_some_and(|t| t.elapsed() >= interval)
    }

    /// Everything to fold, leaving nothing behind.
    pub(crate) fn take(&self) -> Taken {
        let mut s = self.lock();
        let sums = (s.first <= s.last).then(|| {
            let mut sums = Sums {
                first: s.first,
                last: s.last,
                rows: s.rows,
                codes: Vec::with_capacity(s.keys),
                days: Vec::with_capacity(s.keys),
                clicks: Vec::with_capacity(s.keys),
            };
            let mut keys: Vec<_> = s
                .sums
                .drain()
                .flat_map(|(day, codes)| codes.into_iter().map(move |(c, n)| (c, day, n)))
                .collect();
            // In key order, as click_counts was first filled: where the fold probes its index
            // (new keys inserted; updates once the table is much larger than the sums) it walks
            // the index and pages in order (four times faster than in hash order, measured at
            // 245,000 keys).
            keys.sort_unstable();
            for (code, day, clicks) in keys {
                sums.codes.push(code);
                sums.days.push(day);
                sums.clicks.push(clicks);
            }
            sums
        });
        s.restart();
        Taken {
            sums,
            stray_upto: s.stray_upto.take(),
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
        self.sums.clear();
        self.since = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::write::batch::DateWindow;
    use protocol::wire::{Click, Datagram};

    fn batch(codes: &[&'static str]) -> Batch {
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

    fn sums(taken: &Taken) -> Vec<(&str, i64)> {
        let s = taken.sums.as_ref().unwrap();
        let mut v: Vec<_> = s
            .codes
            .iter()
            .map(|c| &**c)
            .zip(s.clicks.iter().copied())
            .collect();
        v.sort();
        v
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
}
