//! What chose the link table's structure: lookup cost (the old `HashMap<Box<str>, HeaderValue>`
//! plus a clone of the value, against the sharded arena plus building the `Location` value,
//! with our index and with the `hashbrown::HashTable<u32>` index first tried), hits and misses
//! over 1 M links, and memory per link.
//!
//!   cargo bench -p redirector --bench links                       lookups (criterion)
//!   LINKS_MEMORY=new:10000000 cargo bench -p redirector --bench links
//!                                                                 RSS per link of one structure
//!                                                                 (old, new or hashbrown)
//!
//! Memory is measured one structure per process (`old` or `new`, N links), so nothing freed by
//! an earlier measurement is counted: RSS after building minus RSS before, over N.

use std::collections::HashMap;
use std::hint::black_box;

use arc_swap::ArcSwapOption;
use criterion::{BatchSize, Criterion, Throughput};
use hyper::header::HeaderValue;
use redirector::table::{shard_of, Builder, Hasher, Table, SHARDS};

const LINKS: usize = 1_000_000;

/// The links every measurement uses: codes like real short codes, URLs of 45 bytes.
fn link(n: usize) -> (String, String) {
    (
        format!("l{n}"),
        format!("https://example.com/articles/2026/{n:011}"),
    )
}

type OldMap = HashMap<Box<str>, HeaderValue>;

fn old_map(n: usize) -> OldMap {
    (0..n)
        .map(link)
        .map(|(c, u)| (c.into_boxed_str(), HeaderValue::try_from(u).unwrap()))
        .collect()
}

/// Built as the loader builds its first table: per-shard builders, then one shard at a time.
fn new_table(n: usize) -> Table {
    let table = Table::default();
    let mut builders: Vec<Builder> = (0..SHARDS).map(|_| Builder::default()).collect();
    for (code, url) in (0..n).map(link) {
        let shard = shard_of(table.hasher().hash(code.as_bytes()));
        builders[shard].push(code.as_bytes(), url.as_bytes());
    }
    for (i, builder) in builders.into_iter().enumerate() {
        table.publish(i, builder.build(table.hasher()));
    }
    table
}

/// The sharded arena with a `hashbrown::HashTable<u32>` of offsets as its index (tags in
/// separate control bytes), as first built; entries `[code len][code][url len][url]` with
/// one-byte lengths (every URL here is 45 bytes).
struct HbShard {
    arena: bytes::Bytes,
    index: hashbrown::HashTable<u32>,
}

struct HbTable {
    shards: Box<[arc_swap::ArcSwap<HbShard>]>,
    hasher: Hasher,
}

fn hb_code(arena: &[u8], at: u32) -> &[u8] {
    let at = at as usize;
    &arena[at + 1..at + 1 + usize::from(arena[at])]
}

fn hb_table(n: usize) -> HbTable {
    let hasher = Hasher::default();
    let mut arenas: Vec<Vec<u8>> = vec![Vec::new(); SHARDS];
    for (code, url) in (0..n).map(link) {
        let arena = &mut arenas[shard_of(hasher.hash(code.as_bytes()))];
        arena.push(code.len() as u8);
        arena.extend_from_slice(code.as_bytes());
        arena.push(url.len() as u8);
        arena.extend_from_slice(url.as_bytes());
    }
    let shards = arenas.into_iter().map(|mut arena| {
        arena.shrink_to_fit();
        let arena = bytes::Bytes::from(arena);
        let (mut offsets, mut at) = (Vec::new(), 0);
        while at < arena.len() {
            offsets.push(at as u32);
            let url_at = at + 1 + usize::from(arena[at]);
            at = url_at + 1 + usize::from(arena[url_at]);
        }
        let mut index = hashbrown::HashTable::with_capacity(offsets.len());
        for at in offsets {
            let hash = |&at: &u32| hasher.hash(hb_code(&arena, at));
            index.insert_unique(hash(&at), at, hash);
        }
        arc_swap::ArcSwap::from_pointee(HbShard { arena, index })
    });
    HbTable {
        shards: shards.collect(),
        hasher: hasher.clone(),
    }
}

fn hb_lookup(t: &HbTable, code: &str) -> Option<HeaderValue> {
    let hash = t.hasher.hash(code.as_bytes());
    let shard = t.shards[shard_of(hash)].load();
    let at = *shard
        .index
        .find(hash, |&at| hb_code(&shard.arena, at) == code.as_bytes())? as usize;
    let url_at = at + 1 + usize::from(shard.arena[at]);
    let url = shard
        .arena
        .slice(url_at + 1..url_at + 1 + usize::from(shard.arena[url_at]));
    HeaderValue::from_maybe_shared(url).ok()
}

fn rss_kib() -> usize {
    testkit::rss_kib(nix::unistd::getpid()) as usize
}

/// `old:N` or `new:N`: prints the structure's resident bytes per link.
fn memory(spec: &str) {
    let (which, n) = spec.split_once(':').expect("LINKS_MEMORY=old:N or new:N");
    let n: usize = n.parse().expect("a number of links");
    let before = rss_kib();
    // Measured while the structure is alive.
    let (len, after) = match which {
        "old" => {
            let map = black_box(old_map(n));
            (map.len(), rss_kib())
        }
        "new" => {
            let table = black_box(new_table(n));
            (table.len(), rss_kib())
        }
        "hashbrown" => {
            let table = black_box(hb_table(n));
            let len = table.shards.iter().map(|s| s.load().index.len()).sum();
            (len, rss_kib())
        }
        _ => panic!("old, new or hashbrown, not {which}"),
    };
    let per = (after - before) as f64 * 1024.0 / len as f64;
    println!("{which}\t{len}\t{per:.1} bytes/link\t(RSS {before} -> {after} KiB)");
}

/// Codes in a random order, so lookups hit memory as requests over random codes do.
fn shuffled(prefix: &str) -> Vec<String> {
    let mut codes: Vec<String> = (0..LINKS).map(|n| format!("{prefix}{n}")).collect();
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    for i in (1..codes.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        codes.swap(i, (state % (i as u64 + 1)) as usize);
    }
    codes
}

/// Today's lookup as the server did it: load the map from its ArcSwapOption, get, clone.
fn old_lookup(old: &ArcSwapOption<OldMap>, code: &str) -> Option<HeaderValue> {
    old.load().as_ref().and_then(|m| m.get(code).cloned())
}

/// The new lookup as the server does it: a slice of the arena, checked into a header value.
fn new_lookup(new: &Table, code: &str) -> Option<HeaderValue> {
    new.get(code.as_bytes())
        .and_then(|url| HeaderValue::from_maybe_shared(url).ok())
}

/// The same with a copy of the URL instead of a reference to the arena.
fn new_lookup_copy(new: &Table, code: &str) -> Option<HeaderValue> {
    new.get_with(code.as_bytes(), |url| HeaderValue::from_bytes(url).ok())
        .flatten()
}

/// What hyper then does with the value: copies its bytes into the response head. Reading
/// the URL's bytes is part of serving it: the old value lives in an allocation of its own,
/// the new one in the shard's arena.
fn written(location: Option<HeaderValue>, head: &mut Vec<u8>) -> usize {
    head.clear();
    if let Some(v) = location {
        head.extend_from_slice(v.as_bytes());
    }
    head.len()
}

fn lookups(c: &mut Criterion) {
    let old = ArcSwapOption::from_pointee(old_map(LINKS));
    let new = new_table(LINKS);
    let hb = hb_table(LINKS);
    let mut head = Vec::with_capacity(256);
    for (what, prefix) in [("hit", "l"), ("miss", "m")] {
        let codes = shuffled(prefix);
        let mut group = c.benchmark_group(format!("lookup_{what}"));
        group.throughput(Throughput::Elements(1));
        let mut i = 0;
        let mut next = || {
            i = (i + 1) % codes.len();
            codes[i].as_str()
        };
        let small = BatchSize::SmallInput;
        group.bench_function("old_hashmap_clone", |b| {
            b.iter_batched(&mut next, |code| old_lookup(&old, code), small)
        });
        group.bench_function("new_sharded_arena", |b| {
            b.iter_batched(&mut next, |code| new_lookup(&new, code), small)
        });
        group.bench_function("hashbrown_sharded_arena", |b| {
            b.iter_batched(&mut next, |code| hb_lookup(&hb, code), small)
        });
        group.bench_function("new_sharded_arena_copy", |b| {
            b.iter_batched(&mut next, |code| new_lookup_copy(&new, code), small)
        });
        group.bench_function("old_hashmap_clone_written", |b| {
            b.iter_batched(
                &mut next,
                |code| written(old_lookup(&old, code), &mut head),
                small,
            )
        });
        group.bench_function("new_sharded_arena_written", |b| {
            b.iter_batched(
                &mut next,
                |code| written(new_lookup(&new, code), &mut head),
                small,
            )
        });
        group.bench_function("new_sharded_arena_copy_written", |b| {
            b.iter_batched(
                &mut next,
                |code| written(new_lookup_copy(&new, code), &mut head),
                small,
            )
        });
        group.finish();
    }
}

fn main() {
    if let Ok(spec) = std::env::var("LINKS_MEMORY") {
        memory(&spec);
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    lookups(&mut c);
    c.final_summary();
}
