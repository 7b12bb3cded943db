//! Bounds on the connections the redirect server holds, so that idle or slow clients can take
//! neither the descriptors that accepting, the database and the drain need, nor a new client's
//! turn:
//!
//! - at most `--max-connections` at once, fitted under the process's descriptor limit; at the
//!   limit a new connection takes the place of the one idle the longest, or when none is idle,
//!   of the one whose unfinished request head began first, as the last look found them
//!   (below; `evicted`), and is refused only
//!   when every connection is answering a request or writing its response (`refused`); a
//!   connection that has received nothing yet counts as a head begun at its accept;
//! - a connection idle between requests for `--idle-timeout` is closed (`idle_timeout`);
//! - a response the client does not take within `--write-timeout` closes its connection
//!   (`write_timeout`; once a write has waited, everything written before must be taken:
//!   see `watched`); hyper's header read timeout bounds a request head as a whole, counted
//!   from when the server began waiting for it, not per byte (`header_timeout`).
//!
//! "Idle" means: no request being answered, everything answered written out, and no byte of
//! a next request received. Closing such a connection loses nothing; a client that sends a
//! request just as its connection is closed sees the close, as with any keep-alive timeout.
//! A connection that has received part of a request head is not idle, but not busy either:
//! nothing has been answered for it yet, and a client that sends its head a byte at a time
//! must not hold a place that a whole request could use. So at the limit it makes room when
//! no connection is idle, the slowest head (the one begun first) first. A connection just
//! accepted is not idle in that order either (though its idle timeout runs): its request may
//! be in the socket's buffer, unread only because its task has not run yet, and taking it for
//! idle had each of a burst of new clients close the one accepted before it, while the slow
//! heads stayed.
//!
//! Finding the first in that order reads every connection's state, under the lock every
//! closing connection takes too: at the limit a client opening connections would make each
//! accept cost that, and a look finds the next [`LOOK_AHEAD`]th of the connections at once
//! instead. They make room in turn, each one only as long as its rank has not changed since
//! (used since, it has a later place or none); once they are used up, or none of them still
//! qualifies, the next look. So a connection that went idle after a look waits for the next
//! one, even behind a slow head that look found.

use std::collections::BinaryHeap;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::Metrics;
use crate::metrics::Closed;

/// A look for the connections to make room finds the first of every this many (at least one).
const LOOK_AHEAD: usize = 64;

/// Descriptors kept out of the connection limit for everything else the process holds: the
/// runtime's own, the listeners, the datagram and ack sockets, database sessions, admin
/// connections.
const RESERVED_DESCRIPTORS: u64 = 64;

/// The most connections `nofile` descriptors allow: what the reserve leaves, less a fifth, so
/// that connections still closing (an evicted one closes after its successor was accepted)
/// never run the process out of descriptors ([`open_or_closing`]).
pub(super) fn fit_to_descriptors(requested: u64, nofile: u64) -> u64 {
    (nofile.saturating_sub(RESERVED_DESCRIPTORS) / 5 * 4).min(requested)
}

/// The most connections at once, open or still closing: the limit and the headroom that
/// [`fit_to_descriptors`] leaves for connections evicted but not closed yet (a quarter of
/// the limit, at least one, so that a server at its limit still takes a new client). Accepting
/// waits at it: a burst of new clients, each evicting an idle one, could otherwise outrun the
/// tasks closing the evicted, and run the process out of descriptors.
pub(super) fn open_or_closing(limit: usize) -> usize {
    limit.saturating_add((limit / 4).max(1))
}

/// `requested` (`--max-connections`), fitted under the soft `RLIMIT_NOFILE` with a log line
/// when that lowers it; an error when the descriptor limit leaves room for none.
pub(crate) fn connection_limit(requested: u64) -> Result<usize, String> {
    let nofile = match nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE) {
        Ok((soft, _hard)) => soft,
        Err(e) => {
            // A seccomp filter may refuse the call; the limit then stands as configured.
            tracing::warn!("reading RLIMIT_NOFILE: {e}; --max-connections {requested} not fitted");
            return usize::try_from(requested).map_err(|e| e.to_string());
        }
    };
    let fitted = fit_to_descriptors(requested, nofile);
    if fitted == 0 {
        return Err(format!(
            "the descriptor limit (RLIMIT_NOFILE soft limit {nofile}) leaves no room for \
             connections: raise it (ulimit -n, or LimitNOFILE= in the unit)"
        ));
    }
    if fitted < requested {
        tracing::info!(
            "max connections fitted to the descriptor limit: {fitted} (--max-connections \
             {requested}; RLIMIT_NOFILE soft limit {nofile}, {RESERVED_DESCRIPTORS} kept for \
             the rest, a fifth as headroom)"
        );
    }
    usize::try_from(fitted).map_err(|e| e.to_string())
}

/// `idle_since` while the connection is not idle.
const BUSY: u64 = u64::MAX;
/// `head_since` while no unanswered request head has begun.
const NO_HEAD: u64 = u64::MAX;

/// One connection's state, shared by its I/O, its request handler and the registry.
#[derive(Debug)]
pub(super) struct Conn {
    id: u64,
    epoch: Instant,
    /// Milliseconds after `epoch` at which the connection last became idle, or [`BUSY`].
    idle_since: AtomicU64,
    /// Milliseconds after `epoch` at which the first byte of a request head not answered yet
    /// arrived on an idle connection (or the connection was accepted, for its first request),
    /// or [`NO_HEAD`].
    head_since: AtomicU64,
    /// Requests being answered (hyper answers one at a time; a count keeps it simple).
    in_flight: AtomicU32,
    evicted: Notify,
    write_timed_out: AtomicBool,
}

impl Conn {
    /// The write timeout closed it (see `Watched`).
    pub(super) fn write_timed_out(&self) {
        self.write_timed_out.store(true, Relaxed);
    }

    fn millis(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(BUSY - 1)
    }

    /// Bytes of a request arrived: no longer idle. On an idle connection they begin a request
    /// head, which stays evictable until it is whole (see [`Conn::begin_request`]).
    pub(super) fn received(&self) {
        let was_idle = self.idle_since.swap(BUSY, Relaxed) != BUSY;
        if was_idle && self.in_flight.load(Relaxed) == 0 {
            let now = self.millis();
            let _ = self
                .head_since
                .compare_exchange(NO_HEAD, now, Relaxed, Relaxed);
        }
    }

    /// Everything handed to the socket was taken: idle from now unless a request is running.
    pub(super) fn wrote_all(&self) {
        if self.in_flight.load(Relaxed) == 0 {
            self.idle_since.store(self.millis(), Relaxed);
        }
    }

    /// Marks a request (its head whole) as being answered until the guard is dropped; the
    /// connection is busy from now until its response is written out.
    pub(super) fn begin_request(self: &Arc<Self>) -> Answering {
        self.in_flight.fetch_add(1, Relaxed);
        self.idle_since.store(BUSY, Relaxed);
        self.head_since.store(NO_HEAD, Relaxed);
        Answering(self.clone())
    }

    /// When it became idle (milliseconds after the epoch), if it is.
    fn idle_since(&self) -> Option<u64> {
        let since = self.idle_since.load(Relaxed);
        (since != BUSY && self.in_flight.load(Relaxed) == 0).then_some(since)
    }

    fn idle_for(&self) -> Option<Duration> {
        let since = self.idle_since()?;
        Some(Duration::from_millis(self.millis().saturating_sub(since)))
    }

    /// When the request head it is receiving began (milliseconds after the epoch), if it is
    /// receiving one and nothing else: no request answered, no response being written.
    fn head_since(&self) -> Option<u64> {
        let since = self.head_since.load(Relaxed);
        (since != NO_HEAD && self.in_flight.load(Relaxed) == 0).then_some(since)
    }

    /// Its place in the order of eviction, lowest first: idle ones by how long they have been
    /// idle, then those receiving a request head (or accepted and not yet read from) by when
    /// it began; `None` while busy.
    fn eviction_rank(&self) -> Option<Rank> {
        if let Some(since) = self.head_since() {
            return Some((1, since));
        }
        self.idle_since().map(|since| (0, since))
    }
}

/// A request being answered on a connection (see [`Conn::begin_request`]).
pub(super) struct Answering(Arc<Conn>);

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Relaxed);
    }
}

/// The open connections, up to the limit.
pub(super) struct Connections {
    limit: usize,
    epoch: Instant,
    open: Mutex<Open>,
    metrics: Arc<Metrics>,
}

#[derive(Default)]
struct Open {
    next_id: u64,
    by_id: HashMap<u64, Arc<Conn>>,
    /// What the last look found to make room next, with their ranks then: the first last.
    next_out: Vec<(Rank, u64)>,
}

/// A connection's place in the order of eviction ([`Conn::eviction_rank`]).
type Rank = (u8, u64);

impl Connections {
    pub(super) fn new(limit: usize, metrics: Arc<Metrics>) -> Arc<Connections> {
        Arc::new(Connections {
            limit,
            epoch: Instant::now(),
            open: Mutex::default(),
            metrics,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Open> {
        // Nothing panics while holding it; a poisoned lock still holds consistent data.
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for a connection just accepted: a free one, or the place of the connection idle
    /// the longest (when none is idle, of the one whose unfinished request head began first),
    /// as the last look found them, which is told to close. `None` (counted as refused) when every connection is answering
    /// a request or writing a response; the caller then closes the new one.
    pub(super) fn admit(self: &Arc<Self>) -> Option<Held> {
        let mut open = self.lock();
        if open.by_id.len() >= self.limit && !self.evict_oldest_idle(&mut open) {
            self.metrics.connections_closed.inc(Closed::Refused);
            return None;
        }
        open.next_id += 1;
        let conn = Arc::new(Conn {
            id: open.next_id,
            epoch: self.epoch,
            idle_since: AtomicU64::new(0),
            head_since: AtomicU64::new(NO_HEAD),
            in_flight: AtomicU32::new(0),
            evicted: Notify::new(),
            write_timed_out: AtomicBool::new(false),
        });
        let now = conn.millis();
        conn.idle_since.store(now, Relaxed);
        conn.head_since.store(now, Relaxed);
        open.by_id.insert(conn.id, conn.clone());
        self.metrics.connections.set(open.by_id.len() as i64);
        Some(Held {
            conn,
            connections: self.clone(),
        })
    }

    /// Closes the connection idle the longest (or the slowest request head), to free its
    /// descriptor (accept ran out).
    pub(super) fn evict_one(&self) -> bool {
        let mut open = self.lock();
        self.evict_oldest_idle(&mut open)
    }

    /// Closes the first connection in the order of [`Conn::eviction_rank`] that a look found
    /// and whose rank is still the same, if any is not busy (two looks at most: one found in
    /// the first may have become busy since).
    fn evict_oldest_idle(&self, open: &mut Open) -> bool {
        let mut looks = 0;
        let conn = loop {
            let Some((rank, id)) = open.next_out.pop() else {
                if looks == 2 || !Self::look(open) {
                    return false;
                }
                looks += 1;
                continue;
            };
            let unchanged = open.by_id.get(&id).map(|c| c.eviction_rank()) == Some(Some(rank));
            if let Some(conn) = unchanged.then(|| open.by_id.remove(&id)).flatten() {
                break conn;
            }
        };
        // A stored permit: the connection's task closes it even if it is not waiting yet.
        conn.evicted.notify_one();
        self.metrics.connections_closed.inc(Closed::Evicted);
        self.metrics.connections.set(open.by_id.len() as i64);
        true
    }

    /// Finds the first [`LOOK_AHEAD`]th of the open connections in the order of eviction (the
    /// busy ones have none), into `open.next_out`; false if every connection is busy.
    fn look(open: &mut Open) -> bool {
        let wanted = (open.by_id.len() / LOOK_AHEAD).max(1);
        // The `wanted` lowest ranks, the highest of them on top, to be pushed out by a lower.
        let mut lowest = BinaryHeap::with_capacity(wanted + 1);
        for conn in open.by_id.values() {
            let Some(rank) = conn.eviction_rank() else {
                continue;
            };
            lowest.push((rank, conn.id));
            if lowest.len() > wanted {
                lowest.pop();
            }
        }
        // Ascending; reversed, so that the first is popped first.
        open.next_out = lowest.into_sorted_vec();
        open.next_out.reverse();
        !open.next_out.is_empty()
    }
}

/// A connection's place among the open ones, given back when dropped.
pub(super) struct Held {
    conn: Arc<Conn>,
    connections: Arc<Connections>,
}

impl Held {
    pub(super) fn conn(&self) -> &Arc<Conn> {
        &self.conn
    }

    /// Gives the place back; false if it was given up already: evicted, which the eviction
    /// counted. Decided under the lock the eviction takes, so that a connection that ends on
    /// its own as it is evicted is counted once.
    fn release(&self) -> bool {
        let mut open = self.connections.lock();
        let held = open.by_id.remove(&self.conn.id).is_some();
        if held {
            let open_now = open.by_id.len() as i64;
            self.connections.metrics.connections.set(open_now);
        }
        held
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.release();
    }
}

/// Serves one connection (hyper's future) until it ends, is evicted, or stays idle for
/// `idle_timeout`, and counts why it was closed.
pub(super) async fn drive(
    connection: impl Future<Output = hyper::Result<()>>,
    held: Held,
    idle_timeout: Duration,
) {
    tokio::pin!(connection);
    let conn = held.conn.clone();
    let mut check = tokio::time::Instant::now() + idle_timeout;
    let closed = loop {
        tokio::select! {
            result = &mut connection => break ended(result, &conn),
            // Counted when it was chosen.
            () = conn.evicted.notified() => break None,
            () = tokio::time::sleep_until(check) => {
                let now = tokio::time::Instant::now();
                match conn.idle_for() {
                    Some(idle) if idle >= idle_timeout => break Some(Closed::IdleTimeout),
                    Some(idle) => check = now + (idle_timeout - idle),
                    None => check = now + idle_timeout,
                }
            }
        }
    };
    if let Some(reason) = closed.filter(|_| held.release()) {
        held.connections.metrics.connections_closed.inc(reason);
    }
}

/// Why hyper's connection ended, if it was one of ours to count.
fn ended(result: hyper::Result<()>, conn: &Conn) -> Option<Closed> {
    let e = result.err()?;
    if conn.write_timed_out.load(Relaxed) {
        Some(Closed::WriteTimeout)
    } else if e.is_timeout() && conn.idle_since().is_some() && conn.head_since().is_none() {
        // hyper's header timer runs from when it begins waiting for the next request, on a
        // keep-alive connection too: an --idle-timeout longer than it ends there.
        Some(Closed::IdleTimeout)
    } else if e.is_timeout() {
        Some(Closed::HeaderTimeout)
    } else if e.is_parse_too_large() {
        Some(Closed::HeadTooLarge)
    } else if e.is_parse_version_h2() {
        Some(Closed::Http2)
    } else if e.is_parse() {
        Some(Closed::BadRequest)
    } else {
        tracing::debug!("http connection: {e}");
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_fits_under_the_descriptors_with_a_reserve_and_a_fifth_to_spare() {
        assert_eq!(fit_to_descriptors(10_000, 1_024), 768);
        assert_eq!(fit_to_descriptors(10_000, 16_384), 10_000);
        assert_eq!(fit_to_descriptors(100, 1_024), 100);
        assert_eq!(fit_to_descriptors(10_000, 64), 0);
        assert_eq!(fit_to_descriptors(10_000, u64::MAX), 10_000);
    }

    #[test]
    fn closing_connections_have_the_fifth_of_the_descriptors_fitting_left() {
        let fitted = fit_to_descriptors(10_000, 1_024) as usize;
        assert_eq!(open_or_closing(fitted), 960, "1024 less the reserve");
        assert_eq!(open_or_closing(1), 2, "room for the one that evicts");
        assert_eq!(open_or_closing(usize::MAX), usize::MAX);
    }

    fn admitted(connections: &Arc<Connections>) -> Held {
        connections.admit().expect("a place")
    }

    #[test]
    fn at_the_limit_the_longest_idle_makes_room_and_busy_ones_are_kept() {
        let metrics = Arc::new(Metrics::default());
        let connections = Connections::new(2, metrics.clone());
        let first = admitted(&connections);
        let second = admitted(&connections);
        // The first is answering a request: not idle, so the second goes.
        let _answering = first.conn().begin_request();
        let third = admitted(&connections);
        assert_eq!(metrics.connections_closed.get(Closed::Evicted), 1);
        assert!(!connections.lock().by_id.contains_key(&second.conn().id));
        assert_eq!(metrics.connections.get(), 2);
        // The third is answering a request too: nothing can go, so a fourth is refused.
        third.conn().received();
        let _answering_too = third.conn().begin_request();
        assert!(connections.admit().is_none());
        assert_eq!(metrics.connections_closed.get(Closed::Refused), 1);
        drop(second);
        assert_eq!(
            metrics.connections.get(),
            2,
            "an evicted place is not given twice"
        );
        drop(third);
        assert_eq!(metrics.connections.get(), 1);
    }

    fn in_place(connections: &Connections, held: &Held) -> bool {
        connections.lock().by_id.contains_key(&held.conn().id)
    }

    #[test]
    fn an_unfinished_request_head_makes_room_after_the_idle_ones_the_slowest_first() {
        let metrics = Arc::new(Metrics::default());
        let connections = Connections::new(3, metrics.clone());
        let early = admitted(&connections);
        let late = admitted(&connections);
        let idle = admitted(&connections);
        // Two heads begun, `early`'s before `late`'s; `idle` has answered a request and
        // received nothing since.
        idle.conn().received();
        drop(idle.conn().begin_request());
        idle.conn().wrote_all();
        early.conn().received();
        late.conn().received();
        early.conn().head_since.store(10, Relaxed);
        late.conn().head_since.store(20, Relaxed);
        // More bytes of a head do not make it younger.
        early.conn().received();
        assert_eq!(early.conn().head_since.load(Relaxed), 10);

        let fourth = admitted(&connections);
        assert!(!in_place(&connections, &idle), "the idle one goes first");
        let _answering = fourth.conn().begin_request();
        let fifth = admitted(&connections);
        assert!(!in_place(&connections, &early), "then the head begun first");
        assert!(in_place(&connections, &late));
        assert_eq!(metrics.connections_closed.get(Closed::Evicted), 2);

        // A head that became whole is a request being answered, and then a response being
        // written: busy until everything is written out, then idle.
        let answering = late.conn().begin_request();
        let _answering_fifth = fifth.conn().begin_request();
        assert!(connections.admit().is_none());
        drop(answering);
        late.conn().received();
        assert!(
            connections.admit().is_none(),
            "bytes read while its response is written begin no evictable head"
        );
        late.conn().wrote_all();
        let _sixth = admitted(&connections);
        assert!(!in_place(&connections, &late));
        assert_eq!(metrics.connections_closed.get(Closed::Refused), 2);
        assert_eq!(metrics.connections_closed.get(Closed::Evicted), 3);
    }

    /// A connection just accepted, not yet read from, ranks as a head begun at its accept:
    /// behind the slow heads that were there before it. Taken for idle, it was closed by the
    /// next client of a burst, and every client of the burst but the last lost its request.
    #[test]
    fn a_connection_not_yet_read_from_makes_room_after_the_heads_begun_before_it() {
        let metrics = Arc::new(Metrics::default());
        let connections = Connections::new(2, metrics.clone());
        let slow = [admitted(&connections), admitted(&connections)];
        for held in &slow {
            held.conn().received();
            // Begun before anything else happens (ties go to the earlier accepted).
            held.conn().head_since.store(0, Relaxed);
        }
        let new = admitted(&connections);
        assert!(!in_place(&connections, &slow[0]), "the slowest head goes");
        assert!(new.conn().idle_for().is_some(), "its idle timeout runs");
        let _next = admitted(&connections);
        assert!(in_place(&connections, &new), "not the one just accepted");
        assert!(
            !in_place(&connections, &slow[1]),
            "the next slowest head goes"
        );
    }

    /// At the limit one look finds the next of every [`LOOK_AHEAD`] connections to make room:
    /// the admissions after it take their places in turn without reading every connection
    /// again, passing over one used since the look.
    #[test]
    fn a_look_finds_room_for_several_admissions_and_passes_over_one_used_since() {
        let metrics = Arc::new(Metrics::default());
        let limit = 3 * LOOK_AHEAD;
        let connections = Connections::new(limit, metrics.clone());
        let held: Vec<Held> = (0..limit).map(|_| admitted(&connections)).collect();
        for (i, h) in held.iter().enumerate().rev() {
            h.conn().received();
            drop(h.conn().begin_request());
            h.conn().wrote_all();
            h.conn().idle_since.store(i as u64, Relaxed);
        }
        let _new = admitted(&connections);
        assert!(!in_place(&connections, &held[0]), "the longest idle goes");
        let found: Vec<u64> = connections.lock().next_out.iter().map(|n| n.1).collect();
        let next = [held[2].conn().id, held[1].conn().id];
        assert_eq!(found, next, "the next two, found by the same look");
        // The next one receives a request: its place in the order is no longer the one found.
        held[1].conn().received();
        let _newer = admitted(&connections);
        assert!(in_place(&connections, &held[1]), "used since the look");
        assert!(!in_place(&connections, &held[2]));
        assert!(connections.lock().next_out.is_empty());
        let _newest = admitted(&connections);
        assert!(!in_place(&connections, &held[3]), "the next look's first");
        assert_eq!(metrics.connections_closed.get(Closed::Evicted), 3);
    }
}
