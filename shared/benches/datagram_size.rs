//! What datagram size to use: clicks/s through a real AF_UNIX datagram socket pair
//! (encode, send, receive, decode) for several size limits, 9-byte codes.
//!
//! `cargo bench -p shared --bench datagram_size`

use std::os::unix::net::UnixDatagram;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use protocol::wire::{decode, EncodeError, Encoder, MAX_DATAGRAM};

/// Fills one datagram of at most `limit` bytes with 9-byte codes; returns it and its clicks.
fn full_datagram(limit: usize) -> (Vec<u8>, u64) {
    let mut enc = Encoder::new(42, limit).expect("limit in range");
    let mut at = 1_700_000_000_000_000;
    for i in 0.. {
        let code = format!("seed{:05}", i % 100_000);
        at += 7;
        if enc.push(&code, at) == Err(EncodeError::Full) {
            break;
        }
    }
    (enc.datagram().to_vec(), enc.len() as u64)
}

fn send_receive_decode(c: &mut Criterion) {
    let (tx, rx) = UnixDatagram::pair().expect("socketpair");
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut group = c.benchmark_group("datagram_size");
    for limit in [512, 1024, 4096, 8192, 16384, 32768, MAX_DATAGRAM] {
        let (datagram, clicks) = full_datagram(limit);
        group.throughput(Throughput::Elements(clicks));
        group.bench_with_input(BenchmarkId::from_parameter(limit), &datagram, |b, d| {
            b.iter(|| {
                tx.send(d).expect("send");
                let n = rx.recv(&mut buf).expect("recv");
                decode(&buf[..n]).expect("valid").clicks.len()
            })
        });
    }
    group.finish();
}

fn encode(c: &mut Criterion) {
    let codes: Vec<String> = (0..1000).map(|i| format!("seed{i:05}")).collect();
    let mut group = c.benchmark_group("encode");
    group.throughput(Throughput::Elements(codes.len() as u64));
    group.bench_function("1000_clicks_9_byte_codes", |b| {
        let mut enc = Encoder::new(42, MAX_DATAGRAM).expect("limit in range");
        b.iter(|| {
            for (i, code) in codes.iter().enumerate() {
                enc.push(code, 1_700_000_000_000_000 + i as i64)
                    .expect("fits");
            }
            let n = enc.datagram().len();
            enc.next();
            n
        })
    });
    group.finish();
}

criterion_group!(benches, send_receive_decode, encode);
criterion_main!(benches);
