//! The ring's cost per click: push and pop on one thread, push alone, push+pop with two
//! threads contending on the same ring, and push while another thread pops.
//!
//! `cargo bench -p redirector --bench ring`

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use redirector::ring::Ring;

/// A typical short code.
const CODE: &str = "aZ3-x_9Qk";
const CAPACITY: usize = 4096;

fn one_thread(c: &mut Criterion) {
    let ring = Ring::new(CAPACITY);
    c.bench_function("ring push+pop, one thread", |b| {
        b.iter(|| {
            ring.push(black_box(CODE), black_box(1)).unwrap();
            black_box(ring.pop())
        })
    });
    c.bench_function("ring push alone, one thread", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let batch = left.min(CAPACITY as u64);
                let start = Instant::now();
                for _ in 0..batch {
                    let _ = black_box(ring.push(black_box(CODE), 1));
                }
                timed += start.elapsed();
                while ring.pop().is_some() {}
                left -= batch;
            }
            timed
        })
    });
}

fn two_threads(c: &mut Criterion) {
    let ring = Arc::new(Ring::new(CAPACITY));
    c.bench_function("ring push+pop, two threads contending", |b| {
        b.iter_custom(|iters| {
            let start = Arc::new(Barrier::new(2));
            let other = {
                let (ring, start) = (ring.clone(), start.clone());
                std::thread::spawn(move || push_pop(&ring, &start, iters))
            };
            let mine = push_pop(&ring, &start, iters);
            // Each thread made `iters` pairs at the same time: the wall time of the slower one
            // divided by `iters` is the cost of one pair under contention.
            mine.max(other.join().unwrap())
        })
    });
}

/// The production shape: one thread pushes (a request handler) while another pops (the drain).
fn push_against_a_popper(c: &mut Criterion) {
    let ring = Arc::new(Ring::new(CAPACITY));
    c.bench_function("ring push, one thread, another popping", |b| {
        b.iter_custom(|iters| {
            let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let popper = {
                let (ring, done) = (ring.clone(), done.clone());
                std::thread::spawn(move || {
                    while !done.load(std::sync::atomic::Ordering::Relaxed) {
                        black_box(ring.pop());
                    }
                })
            };
            let began = Instant::now();
            for _ in 0..iters {
                let _ = black_box(ring.push(black_box(CODE), 1));
            }
            let took = began.elapsed();
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            popper.join().unwrap();
            took
        })
    });
}

fn push_pop(ring: &Ring, start: &Barrier, iters: u64) -> Duration {
    start.wait();
    let began = Instant::now();
    for _ in 0..iters {
        let _ = black_box(ring.push(black_box(CODE), 1));
        black_box(ring.pop());
    }
    began.elapsed()
}

criterion_group!(benches, one_thread, two_threads, push_against_a_popper);
criterion_main!(benches);
