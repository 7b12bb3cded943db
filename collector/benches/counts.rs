//! The collector's counting per click, without sockets or a database: a batch of 45,000
//! clicks (half a second at 90,000 clicks/s) of codes drawn uniformly from 250,000, as in
//! `scripts/bench totals`, pushed into a `Batch` datagram by datagram, then added
//! to the unfolded sums as the writer does after a commit. The part of the collector's CPU
//! that `perf` puts in its two code-keyed maps, measured alone, where its run-to-run noise is
//! a few percent rather than the whole pipeline's ten or more.
//!
//! The same with every click carrying a referrer, a device and a country, as a redirector with
//! `--dimensions referrer,device,country` sends them: three breakdown keys a click more.
//!
//! `cargo bench -p collector --bench counts`

use std::hint::black_box;

use collector::write::batch::{Batch, DateWindow};
use collector::write::unfolded::Unfolded;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use protocol::dimensions::{Country, Device, Dimensions};
use protocol::wire::{Click, Datagram};

const CODES: u64 = 250_000;
const BATCH: usize = 45_000;
/// Clicks per datagram (16 KiB holds about 930 of these; the number only sets how often a
/// push starts on a new datagram).
const PER_DATAGRAM: usize = 500;

/// `n` codes like the totals bench's, drawn with a fixed xorshift so that runs compare.
fn codes(n: usize) -> Vec<String> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            format!("seed{}", x % CODES)
        })
        .collect()
}

/// The batch's datagrams, each click carrying `dimensions`.
fn datagrams<'a>(
    codes: &'a [String],
    dimensions: Dimensions<'a>,
    now_us: i64,
) -> Vec<Datagram<'a>> {
    codes
        .chunks(PER_DATAGRAM)
        .enumerate()
        .map(|(seq, chunk)| Datagram {
            version: protocol::wire::VERSION,
            sender: 1,
            seq: seq as u64,
            base_us: now_us,
            clicks: chunk
                .iter()
                .map(|code| Click {
                    dimensions,
                    ..Click::new(code, 0)
                })
                .collect(),
        })
        .collect()
}

fn counts(c: &mut Criterion) {
    let codes = codes(BATCH * 8);
    let now_us = protocol::now_us();
    let window = DateWindow {
        max_age_us: i64::MAX,
        max_skew_us: i64::MAX,
    };
    // Every click of a redirector with `--dimensions referrer,device,country` carries the three.
    let all = Dimensions {
        referrer: Some("example.com"),
        device: Some(Device::Mobile),
        country: Country::parse(b"DE"),
        ..Dimensions::default()
    };
    let mut group = c.benchmark_group("counts");
    group.throughput(Throughput::Elements(BATCH as u64));
    for (name, dimensions) in [
        ("push and add a batch", Dimensions::default()),
        ("push and add a batch with three dimensions", all),
    ] {
        let datagrams = datagrams(&codes, dimensions, now_us);
        // Eight different batches in turn, over sums that hold about three quarters of the
        // codes, as between two folds.
        let sums = Unfolded::new(1);
        let mut batch = Batch::default();
        let mut number = 0;
        let mut batches = datagrams.chunks(BATCH / PER_DATAGRAM).cycle();
        group.bench_function(name, |b| {
            b.iter(|| {
                for datagram in batches.next().expect("cycles") {
                    batch.push(datagram, &window, now_us);
                }
                number += 1;
                sums.add(number, black_box(&batch));
                batch.clear();
            })
        });
    }
    group.finish();
}

/// A fold's taking of the sums: a million clicks' (about 245,000 codes, in the order they
/// came) out of their map, put in key order, and cut into statements' chunks: the collector's
/// part of a fold, besides encoding them. The codes (`seedN`) are short enough that no two tie
/// on the sort's 12-byte prefixes; codes that share longer prefixes fall back to comparing
/// whole codes, which is slower.
fn take(c: &mut Criterion) {
    let codes = codes(4 * CODES as usize);
    let now_us = protocol::now_us();
    let window = DateWindow {
        max_age_us: i64::MAX,
        max_skew_us: i64::MAX,
    };
    let datagrams = datagrams(&codes, Dimensions::default(), now_us);
    let mut group = c.benchmark_group("fold");
    group.bench_function("take the sums of a million clicks", |b| {
        b.iter_batched(
            || {
                let sums = Unfolded::new(1);
                let mut batch = Batch::default();
                for datagram in &datagrams {
                    batch.push(datagram, &window, now_us);
                }
                sums.add(1, &batch);
                sums
            },
            |sums| sums.take(),
            criterion::BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group!(benches, counts, take);
criterion_main!(benches);
