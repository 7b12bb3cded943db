//! The link table's structure: code -> link (its URL and options, as `target` stores them) for
//! millions of links in compact memory, read by every request without a lock or a wait, changed
//! by one writer shard by shard.
//!
//! [`SHARDS`] shards, chosen by a hash of the code. Each shard is immutable once published: one
//! contiguous byte arena of entries `[code len: u8][code][link len: LEB128][link]` and an
//! open-addressing index of `u64` slots, each a hash tag and an offset into the arena. A change copies the shards it touches (a few
//! KB each at a million links) and swaps them in with [`ArcSwap`]; readers keep whatever shard
//! they loaded. About 60 bytes of arena and 13-17 of index per link, against ~144 for a
//! `HashMap<Box<str>, HeaderValue>` (BENCHMARKS.md).

use std::collections::HashSet;
use std::hash::BuildHasher;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use arc_swap::ArcSwap;
use bytes::Bytes;
use shared::hash_index::HashIndex;

/// How many shards. At 10 M links a shard holds ~1,200 links in ~70 KB, so one change copies
/// that much (and rehashes its codes); at 1 M, ~7 KB. Measured at 10 M links with 100
/// changes a second, req/s against the same changes to a table nobody follows: 0.92 with
/// 4096 shards (~140 KB copied per change), 0.98 with 8192 and with 16384 (medians of 6
/// interleaved pairs each, BENCHMARKS.md). More shards cost memory and load time, as arenas
/// under glibc's mmap threshold grow by doubling in the heap and fragment it where larger
/// ones are mapped and grow in place: 756, 859 and 877 MiB, ready in 7.1, 8.7 and 10.2 s.
pub const SHARDS: usize = 8192;

/// The longest URL served, in bytes: the same limit as the `links_url_clean` CHECK
/// (migration 7), so that a row which predates the constraint is skipped, never served.
pub const MAX_URL: usize = 2048;

/// Why a row is left out of the table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unusable {
    #[error("bad code: {0}")]
    Code(protocol::wire::CodeError),
    #[error("URL holds a control character")]
    Url,
    #[error("URL is not UTF-8")]
    UrlNotUtf8,
    #[error("URL is longer than {MAX_URL} bytes")]
    UrlTooLong,
    #[error("{0}")]
    Status(crate::target::BadStatus),
}

/// Checks that `code` is a click code and `url` is what the `links_url_clean` CHECK
/// (migration 7) lets into `links`: no control character (0x00-0x1f, 0x7f; tab included,
/// which a header would take), at most [`MAX_URL`] bytes, and UTF-8, as any URL of a UTF-8
/// database is (a `SQL_ASCII` one may hold other bytes). What passes goes into a `Location`
/// header with its spaces and UTF-8 percent-encoded (`target::encode`).
pub fn usable(code: &[u8], url: &[u8]) -> Result<(), Unusable> {
    protocol::wire::validate_code(code).map_err(Unusable::Code)?;
    if url.len() > MAX_URL {
        return Err(Unusable::UrlTooLong);
    }
    if !url.iter().all(|&b| b >= 32 && b != 127) {
        Err(Unusable::Url)
    } else if std::str::from_utf8(url).is_err() {
        Err(Unusable::UrlNotUtf8)
    } else {
        Ok(())
    }
}

/// The hasher every shard and lookup uses: foldhash, seeded at random per process so that
/// codes cannot be chosen to collide.
#[derive(Clone, Default)]
pub struct Hasher(foldhash::fast::RandomState);

impl Hasher {
    pub fn hash(&self, code: &[u8]) -> u64 {
        self.0.hash_one(code)
    }
}

/// Which shard a hash falls in. Bits 32.. are not the index's slot bits (the low ones), so the
/// links of one shard spread over its index.
pub fn shard_of(hash: u64) -> usize {
    (hash >> 32) as usize & (SHARDS - 1)
}

/// One shard: immutable once built.
#[derive(Default)]
pub struct Shard {
    arena: Bytes,
    index: HashIndex,
}

impl Shard {
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The URL of `code`, as a slice of the arena (no copy).
    pub fn get(&self, hash: u64, code: &[u8]) -> Option<Bytes> {
        self.find(hash, code).map(|url| self.arena.slice(url))
    }

    /// Where the URL of `code` is in the arena.
    fn find(&self, hash: u64, code: &[u8]) -> Option<Range<usize>> {
        let slot = self.index.find(hash, |at| self.code_at(at) == code)?;
        Some(self.url_range(self.index.at(slot)?))
    }

    /// Where `code` is in the index (its slot), to mark it seen during a full comparison.
    pub fn slot_of(&self, hash: u64, code: &[u8], url: &[u8]) -> Probe {
        match self.index.find(hash, |at| self.code_at(at) == code) {
            None => Probe::Absent,
            Some(slot) => {
                let at = self.index.at(slot).expect("found");
                if &self.arena[self.url_range(at)] == url {
                    Probe::Same(slot)
                } else {
                    Probe::Different(slot)
                }
            }
        }
    }

    pub fn slots(&self) -> usize {
        self.index.slots()
    }

    /// The code held in `slot`, if that slot is occupied.
    pub fn code_in_slot(&self, slot: usize) -> Option<&[u8]> {
        self.index.at(slot).map(|at| self.code_at(at))
    }

    /// Every (code, url) entry, in arena order.
    pub fn entries(&self) -> Entries<'_> {
        Entries {
            arena: &self.arena,
            at: 0,
        }
    }

    /// A copy of this shard without the codes of `changes` and with its entries added.
    pub fn changed(&self, changes: &Changes, hasher: &Hasher) -> Shard {
        let touched: HashSet<&[u8], foldhash::fast::RandomState> = changes.codes().collect();
        // Sized once: growing it by doubling was most of the cost of applying a change.
        let mut builder = Builder::with_capacity(self.arena.len() + changes.puts.arena.len());
        for (code, url) in self.entries().filter(|(c, _)| !touched.contains(c)) {
            builder.push(code, url);
        }
        for (code, url) in changes.puts.entries() {
            builder.push(code, url);
        }
        builder.build(hasher)
    }

    fn code_at(&self, at: u32) -> &[u8] {
        code_at(&self.arena, at)
    }

    fn url_range(&self, at: u32) -> Range<usize> {
        let at = at as usize;
        let after_code = at + 1 + usize::from(self.arena[at]);
        let (len, start) = read_len(&self.arena, after_code);
        start..start + len
    }
}

/// What [`Shard::slot_of`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    Absent,
    Same(usize),
    Different(usize),
}

/// The entries of an arena, in order.
pub struct Entries<'a> {
    arena: &'a [u8],
    at: usize,
}

impl<'a> Iterator for Entries<'a> {
    type Item = (&'a [u8], &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let code_len = usize::from(*self.arena.get(self.at)?);
        let code = &self.arena[self.at + 1..self.at + 1 + code_len];
        let (url_len, start) = read_len(self.arena, self.at + 1 + code_len);
        self.at = start + url_len;
        Some((code, &self.arena[start..self.at]))
    }
}

/// Appends entries to an arena; [`Builder::build`] indexes them.
#[derive(Default)]
pub struct Builder {
    arena: Vec<u8>,
    len: usize,
}

impl Builder {
    pub fn with_capacity(bytes: usize) -> Builder {
        Builder {
            arena: Vec::with_capacity(bytes),
            len: 0,
        }
    }

    /// Appends an entry: a code and its link's bytes (`target::encode`). The caller checked
    /// them with [`usable`] and pushes each code once.
    pub fn push(&mut self, code: &[u8], url: &[u8]) {
        debug_assert!(protocol::wire::validate_code(code).is_ok());
        self.arena.push(code.len() as u8);
        self.arena.extend_from_slice(code);
        write_len(&mut self.arena, url.len());
        self.arena.extend_from_slice(url);
        self.len += 1;
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn entries(&self) -> Entries<'_> {
        Entries {
            arena: &self.arena,
            at: 0,
        }
    }

    /// The arena, trimmed to its length, and an index sized for exactly its entries.
    pub fn build(mut self, hasher: &Hasher) -> Shard {
        self.arena.shrink_to_fit();
        let arena = Bytes::from(self.arena);
        let mut index = HashIndex::with_capacity(self.len);
        let mut entries = Entries {
            arena: &arena,
            at: 0,
        };
        loop {
            let at = entries.at as u32;
            let Some((code, _)) = entries.next() else {
                break;
            };
            index.insert(hasher.hash(code), at);
        }
        Shard { arena, index }
    }
}

/// Changes to one shard: entries to put (insert or replace) and codes to remove.
#[derive(Default)]
pub struct Changes {
    pub puts: Builder,
    pub removes: Vec<Box<[u8]>>,
}

impl Changes {
    pub fn len(&self) -> usize {
        self.puts.len() + self.removes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn codes(&self) -> impl Iterator<Item = &[u8]> {
        self.puts
            .entries()
            .map(|(code, _)| code)
            .chain(self.removes.iter().map(|c| &c[..]))
    }
}

fn code_at(arena: &[u8], at: u32) -> &[u8] {
    let at = at as usize;
    &arena[at + 1..at + 1 + usize::from(arena[at])]
}

fn write_len(arena: &mut Vec<u8>, mut n: usize) {
    while n >= 0x80 {
        arena.push((n as u8) | 0x80);
        n >>= 7;
    }
    arena.push(n as u8);
}

/// Reads a LEB128 length at `at`; returns it and where the bytes after it start.
fn read_len(arena: &[u8], mut at: usize) -> (usize, usize) {
    let (mut n, mut shift) = (0usize, 0);
    loop {
        let b = arena[at];
        at += 1;
        n |= usize::from(b & 0x7f) << shift;
        if b < 0x80 {
            return (n, at);
        }
        shift += 7;
    }
}

/// Every shard, each swapped whole when it changes. Reads never wait; one task writes.
pub struct Table {
    shards: Box<[ArcSwap<Shard>]>,
    hasher: Hasher,
    /// Links in all shards, kept by the writer (summing every shard per read cost more than
    /// applying a few changes).
    len: AtomicUsize,
}

impl Default for Table {
    fn default() -> Self {
        Table {
            shards: (0..SHARDS).map(|_| ArcSwap::default()).collect(),
            hasher: Hasher::default(),
            len: AtomicUsize::new(0),
        }
    }
}

impl Table {
    pub fn hasher(&self) -> &Hasher {
        &self.hasher
    }

    /// The URL of `code`.
    pub fn get(&self, code: &[u8]) -> Option<Bytes> {
        let hash = self.hasher.hash(code);
        self.shards[shard_of(hash)].load().get(hash, code)
    }

    /// `f` of the URL of `code`, borrowed from the arena while `f` runs.
    pub fn get_with<R>(&self, code: &[u8], f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let hash = self.hasher.hash(code);
        let shard = self.shards[shard_of(hash)].load();
        shard.find(hash, code).map(|url| f(&shard.arena[url]))
    }

    /// The shard being served at `i`.
    pub fn shard(&self, i: usize) -> Arc<Shard> {
        self.shards[i].load_full()
    }

    /// Publishes `shard` at `i`; readers that loaded the old one keep it until they are done.
    pub fn publish(&self, i: usize, shard: Shard) {
        let added = shard.len();
        let old = self.shards[i].swap(Arc::new(shard));
        self.len.fetch_add(added, Relaxed);
        self.len.fetch_sub(old.len(), Relaxed);
    }

    /// Applies `changes` to shard `i`; returns how many links the shard gained (or lost).
    pub fn apply(&self, i: usize, changes: Changes) -> isize {
        let old = self.shard(i);
        let new = if old.is_empty() && changes.removes.is_empty() {
            // A first load: the pending arena becomes the shard, without a copy.
            changes.puts.build(&self.hasher)
        } else {
            old.changed(&changes, &self.hasher)
        };
        let gained = new.len() as isize - old.len() as isize;
        self.publish(i, new);
        gained
    }

    pub fn len(&self) -> usize {
        self.len.load(Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests;
