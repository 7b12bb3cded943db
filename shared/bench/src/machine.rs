//! The machine's state, probed before each round of `redirect`: what a click adds to a redirect
//! has moved between runs of the same code by more than the host's-cost goal's margin, at times
//! while a redirect with clicks off cost the same (BENCHMARKS.md). A click's work is what crosses
//! cores (the ring's cells, the datagram, the collector's wake-up) and walks memory (the ring,
//! the collector's sums): so each round records how long a cache line takes to go from one CPU
//! to the other and back, how long a random read of memory takes, and, as the control, a chain
//! of dependent arithmetic on one core. Rounds of one run then say whether the machine changed
//! under them, and runs say in which state they measured.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

/// Round trips of the cache line between the two CPUs.
const HANDOFFS: u64 = 500_000;
/// The memory read at random: far past any cache the machine has.
const MEMORY_BYTES: usize = 256 << 20;
/// Reads of it, each depending on the one before.
const READS: usize = 1_000_000;
/// Steps of the arithmetic chain.
const STEPS: u64 = 100_000_000;

/// One probe's figures, in nanoseconds.
#[derive(Clone, Copy)]
pub(crate) struct Probe {
    /// A cache line there and back between the first two CPUs this process may use; `None` with
    /// fewer than two, or when a thread could not be pinned or started.
    pub(crate) handoff_ns: Option<f64>,
    pub(crate) memory_ns: f64,
    pub(crate) step_ns: f64,
}

impl Probe {
    /// Takes about a second, on an otherwise idle machine (between rounds).
    pub(crate) fn take() -> Probe {
        Probe {
            handoff_ns: handoff_ns(),
            memory_ns: memory_ns(),
            step_ns: step_ns(),
        }
    }

    /// For `machine.tsv`: the handoff (empty when not measured), the read, the step.
    pub(crate) fn fields(&self) -> [String; 3] {
        [
            self.handoff_ns
                .map_or(String::new(), |ns| format!("{ns:.1}")),
            format!("{:.1}", self.memory_ns),
            format!("{:.3}", self.step_ns),
        ]
    }
}

/// The first two CPUs this process may use.
fn two_cpus() -> Option<(usize, usize)> {
    let set = sched_getaffinity(Pid::from_raw(0)).ok()?;
    let mut cpus = (0..CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false));
    Some((cpus.next()?, cpus.next()?))
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) -> bool {
    let mut set = CpuSet::new();
    set.set(cpu).is_ok() && sched_setaffinity(Pid::from_raw(0), &set).is_ok()
}

/// A counter in a cache line of its own, moved up by each side in turn.
#[repr(align(64))]
struct Line(AtomicU64);

fn handoff_ns() -> Option<f64> {
    let (a, b) = two_cpus()?;
    let line = Line(AtomicU64::new(0));
    // Both threads there and pinned, or neither hands off: one that went on alone would wait
    // for the other for ever.
    let (ready, failed) = (AtomicU64::new(0), AtomicBool::new(false));
    let give_up = || {
        failed.store(true, Ordering::Release);
        ready.fetch_add(1, Ordering::AcqRel);
    };
    let pass = |cpu: usize, parity: u64| {
        if pin(cpu) {
            ready.fetch_add(1, Ordering::AcqRel);
        } else {
            give_up();
        }
        while ready.load(Ordering::Acquire) < 2 {
            std::hint::spin_loop();
        }
        if failed.load(Ordering::Acquire) {
            return None;
        }
        let started = Instant::now();
        for turn in 0..HANDOFFS {
            let mine = 2 * turn + parity;
            while line.0.load(Ordering::Acquire) != mine {
                std::hint::spin_loop();
            }
            line.0.store(mine + 1, Ordering::Release);
        }
        Some(started.elapsed())
    };
    let pass = &pass;
    std::thread::scope(|s| {
        let spawn =
            |cpu, parity| std::thread::Builder::new().spawn_scoped(s, move || pass(cpu, parity));
        let first = spawn(a, 0).ok()?;
        let Ok(second) = spawn(b, 1) else {
            // The first is waiting for it: let it go.
            give_up();
            let _ = first.join();
            return None;
        };
        let (first, second) = (first.join().ok().flatten(), second.join().ok().flatten());
        second?;
        Some(first?.as_nanos() as f64 / HANDOFFS as f64)
    })
}

/// The memory's cache lines in a random order, each holding where the next one is, read one
/// line at a time: each read's address is the one before's value, so none can start early.
fn memory_ns() -> f64 {
    const WORDS_A_LINE: usize = 8;
    let lines = MEMORY_BYTES / 64;
    let mut next = vec![0usize; lines * WORDS_A_LINE];
    let mut order: Vec<usize> = (0..lines).collect();
    let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
    for i in (1..lines).rev() {
        // A shuffle by xorshift64: enough to scatter the lines.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        order.swap(i, (seed % (i as u64 + 1)) as usize);
    }
    for (i, &line) in order.iter().enumerate() {
        next[line * WORDS_A_LINE] = order[(i + 1) % lines] * WORDS_A_LINE;
    }
    let mut at = order[0] * WORDS_A_LINE;
    let started = Instant::now();
    for _ in 0..READS {
        at = next[at];
    }
    black_box(at);
    started.elapsed().as_nanos() as f64 / READS as f64
}

/// A chain of multiply-adds, each on the one before: the core's own speed.
fn step_ns() -> f64 {
    let mut x = black_box(1u64);
    let started = Instant::now();
    for _ in 0..STEPS {
        x = black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
    }
    black_box(x);
    started.elapsed().as_nanos() as f64 / STEPS as f64
}
