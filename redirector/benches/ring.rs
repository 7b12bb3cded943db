//! The ring's cost per click, side by side with the ring it replaced: the state region's ring
//! (in a memfd mapping, that a later process can adopt) against `crossbeam_queue::ArrayQueue`
//! of the same 80-byte slots on the heap (the ring before the state region). Push alone, push
//! and read on one thread, and push while another thread reads (the production shape: request
//! handlers push, the drain reads).
//!
//! `cargo bench -p redirector --bench ring`

use protocol::dimensions::Dimensions;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use crossbeam_queue::ArrayQueue;
use redirector::ring::{Read, Ring};
use redirector::state::Region;

/// A typical short code.
const CODE: &str = "aZ3-x_9Qk";
const CAPACITY: usize = 4096;

/// The slot the heap ring held: the same bytes as a cell of the region's ring, less the stamp.
#[derive(Clone, Copy)]
struct HeapSlot {
    _at_us: i64,
    _len: u8,
    _code: [u8; 64],
}

/// The two rings behind one face.
trait Bench: Send + Sync + 'static {
    fn push(&self, code: &str, at_us: i64) -> bool;
    /// Takes one click, as the one reader.
    fn take(&self) -> bool;
}

impl Bench for ArrayQueue<HeapSlot> {
    fn push(&self, code: &str, at_us: i64) -> bool {
        let bytes = code.as_bytes();
        let mut slot = HeapSlot {
            _at_us: at_us,
            _len: bytes.len() as u8,
            _code: [0; 64],
        };
        slot._code[..bytes.len()].copy_from_slice(bytes);
        ArrayQueue::push(self, slot).is_ok()
    }

    fn take(&self) -> bool {
        black_box(self.pop()).is_some()
    }
}

impl Bench for Ring {
    fn push(&self, code: &str, at_us: i64) -> bool {
        Ring::push(self, code, at_us, &Dimensions::default()).is_ok()
    }

    fn take(&self) -> bool {
        let head = self.head();
        match black_box(self.read(head)) {
            Read::Empty => false,
            _ => {
                self.release(head + 1);
                true
            }
        }
    }
}

fn rings() -> [(&'static str, Arc<dyn Bench>); 2] {
    let region = Region::in_process(CAPACITY as u64, 1).expect("a memfd region");
    [
        (
            "heap (before)",
            Arc::new(ArrayQueue::<HeapSlot>::new(CAPACITY)),
        ),
        ("region (after)", region.ring),
    ]
}

fn one_thread(c: &mut Criterion) {
    for (name, ring) in rings() {
        c.bench_function(&format!("ring push+read, one thread, {name}"), |b| {
            b.iter(|| {
                ring.push(black_box(CODE), black_box(1));
                ring.take()
            })
        });
        c.bench_function(&format!("ring push alone, one thread, {name}"), |b| {
            b.iter_custom(|iters| push_in_batches(&*ring, iters))
        });
    }
}

/// Pushes `iters` clicks, timed, emptying the ring (untimed) whenever it is full.
fn push_in_batches(ring: &dyn Bench, iters: u64) -> Duration {
    let mut timed = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let batch = left.min(CAPACITY as u64);
        let start = Instant::now();
        for _ in 0..batch {
            black_box(ring.push(black_box(CODE), 1));
        }
        timed += start.elapsed();
        while ring.take() {}
        left -= batch;
    }
    timed
}

/// The production shape: one thread pushes (a request handler) while another reads (the drain).
fn push_against_a_reader(c: &mut Criterion) {
    for (name, ring) in rings() {
        c.bench_function(
            &format!("ring push, one thread, another reading, {name}"),
            |b| {
                b.iter_custom(|iters| {
                    let done = Arc::new(AtomicBool::new(false));
                    let reader = {
                        let (ring, done) = (ring.clone(), done.clone());
                        std::thread::spawn(move || {
                            while !done.load(Relaxed) {
                                ring.take();
                            }
                        })
                    };
                    let began = Instant::now();
                    for _ in 0..iters {
                        black_box(ring.push(black_box(CODE), 1));
                    }
                    let took = began.elapsed();
                    done.store(true, Relaxed);
                    reader.join().unwrap();
                    while ring.take() {}
                    took
                })
            },
        );
    }
}

criterion_group!(benches, one_thread, push_against_a_reader);
criterion_main!(benches);
