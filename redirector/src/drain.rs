//! The drain task: empties the ring into datagrams and sends them to the collector's socket.
//!
//! The socket is *connected*: then the kernel's writability reflects the collector's receive
//! queue, so on EAGAIN the task can await writability instead of spinning. A datagram that was
//! not accepted is kept (the encoder returns the same bytes until `next()`) and resent; while
//! the collector is away the task reconnects with capped backoff and the ring holds the rest.
//! Every await is cancel-safe: all state lives in `Drain`, so the shutdown deadline can cut a
//! send short without losing track of a single click.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use shared::socket::SendErrorKind;
use shared::wire::{BadLimit, Encoder, PushError};
use tokio::net::UnixDatagram;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::metrics::{reason, Metrics};
use crate::ring::{Ring, Slot};
use shared::backoff::Backoff;

const RECONNECT_FIRST: Duration = Duration::from_millis(50);
const RECONNECT_CAP: Duration = Duration::from_secs(1);
/// While sends keep failing, how often the failure is logged again.
const REPORT_EVERY: Duration = Duration::from_secs(60);

pub struct Drain {
    ring: Arc<Ring>,
    metrics: Arc<Metrics>,
    path: PathBuf,
    encoder: Encoder,
    /// A click popped from the ring that did not fit the datagram being sent.
    held: Option<Slot>,
    socket: Option<UnixDatagram>,
    backoff: Backoff,
    /// The failures since the last send that worked, so a streak is not logged per attempt.
    failing: Option<Streak>,
}

/// Tells the drain task to stop: the deadline of its final flush.
pub type Stop = watch::Sender<Option<Instant>>;

impl Drain {
    pub fn new(
        ring: Arc<Ring>,
        metrics: Arc<Metrics>,
        path: PathBuf,
        sender: u64,
        datagram_limit: usize,
    ) -> Result<Drain, BadLimit> {
        Ok(Drain {
            ring,
            metrics,
            path,
            encoder: Encoder::new(sender, datagram_limit)?,
            held: None,
            socket: None,
            backoff: Backoff::new(RECONNECT_FIRST, RECONNECT_CAP),
            failing: None,
        })
    }

    /// Flushes every `flush_every` until `stop` carries a deadline (or is dropped), then
    /// flushes what is left until that deadline. Returns how many clicks were left unsent.
    pub async fn run(
        mut self,
        flush_every: Duration,
        mut stop: watch::Receiver<Option<Instant>>,
    ) -> u64 {
        let mut tick = tokio::time::interval(flush_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::select! {
            biased;
            _ = stop.wait_for(Option::is_some) => {}
            _ = async { loop { tick.tick().await; self.flush().await } } => {}
        }
        let deadline = stop.borrow().unwrap_or_else(Instant::now);
        let _ = tokio::time::timeout_at(deadline, self.flush()).await;
        self.pending()
    }

    /// Clicks not yet accepted by the kernel: the ring, the datagram being built, the held one.
    pub fn pending(&self) -> u64 {
        (self.ring.len() + self.encoder.len() + usize::from(self.held.is_some())) as u64
    }

    /// Sends what the ring held when the flush began: full datagrams as they fill, then the
    /// partial last one. Later arrivals wait for the next tick, so one flush is bounded.
    async fn flush(&mut self) {
        let mut budget = self.ring.len() + usize::from(self.held.is_some());
        while budget > 0 {
            let Some(slot) = self.held.take().or_else(|| self.ring.pop()) else {
                break;
            };
            match self.encoder.push(slot.code(), slot.at_us()) {
                Ok(()) => budget -= 1,
                Err(PushError::Full) => {
                    self.held = Some(slot);
                    self.send().await;
                }
                Err(e) => {
                    budget -= 1;
                    self.metrics.clicks_dropped.inc(reason::INVALID);
                    tracing::warn!("dropping click {:?}: {e}", slot.code());
                }
            }
        }
        if !self.encoder.is_empty() {
            self.send().await;
        }
    }

    /// Sends the current datagram, retrying until the kernel accepts it.
    async fn send(&mut self) {
        loop {
            let result = match &self.socket {
                Some(socket) => socket.try_send(self.encoder.datagram()),
                None => match connect(&self.path) {
                    Ok(socket) => {
                        self.socket = Some(socket);
                        continue;
                    }
                    Err(e) => Err(e),
                },
            };
            let err = match result {
                Ok(_) => {
                    self.sent();
                    // A backlog of many datagrams (after an outage) must not hold a runtime
                    // thread that request handlers are waiting for.
                    tokio::task::yield_now().await;
                    return;
                }
                Err(err) => err,
            };
            let kind = SendErrorKind::of(&err);
            self.metrics.send_errors.inc(kind.as_str());
            self.note_failure(kind, &err);
            match self.socket.as_ref().filter(|_| awaits_writability(&err)) {
                Some(socket) => {
                    if socket.writable().await.is_err() {
                        self.socket = None;
                    }
                }
                None => {
                    if kind.receiver_away() {
                        self.socket = None;
                    }
                    tokio::time::sleep(self.backoff.next_wait()).await;
                }
            }
        }
    }

    fn sent(&mut self) {
        self.metrics.clicks_sent.add(self.encoder.len() as u64);
        self.metrics.datagrams_sent.inc();
        self.encoder.next();
        self.backoff.reset();
        if let Some(streak) = self.failing.take() {
            if streak.kind != SendErrorKind::QueueFull {
                tracing::info!(
                    "sending to {} again after {}",
                    self.path.display(),
                    seconds(streak.since.elapsed())
                );
            }
        }
    }

    /// Logs the first failure of a streak and then one line per `REPORT_EVERY` while it lasts,
    /// so a send that never works (permissions, say) stays visible while the ring fills and
    /// drops. A full queue is ordinary backpressure, not a warning.
    fn note_failure(&mut self, kind: SendErrorKind, err: &io::Error) {
        let now = Instant::now();
        let again = match &mut self.failing {
            Some(streak) if streak.kind == kind => match streak.again(now) {
                Some(failures) => Some((failures, now - streak.since)),
                None => return,
            },
            _ => {
                self.failing = Some(Streak::new(kind, now));
                None
            }
        };
        let held = self.pending();
        let path = self.path.display();
        let label = kind.as_str();
        match (again, kind == SendErrorKind::QueueFull) {
            (None, true) => tracing::debug!("collector queue full; waiting ({held} clicks held)"),
            (Some((failures, lasting)), true) => tracing::debug!(
                "collector queue full for {}: {failures} more waits ({held} clicks held)",
                seconds(lasting)
            ),
            (None, false) => tracing::warn!(
                "sending to {path}: {err} ({label}); keeping {held} clicks and retrying"
            ),
            (Some((failures, lasting)), false) => tracing::warn!(
                "sending to {path} still fails after {}: {err} ({label}); {failures} failures \
                 since the last report, {held} clicks held, {} dropped so far for a full ring",
                seconds(lasting),
                self.metrics.clicks_dropped.get(reason::RING_FULL)
            ),
        }
    }
}

/// A run of failed sends of one kind.
struct Streak {
    kind: SendErrorKind,
    since: Instant,
    reported: Instant,
    /// Failures since the last log line.
    unreported: u64,
}

impl Streak {
    fn new(kind: SendErrorKind, now: Instant) -> Streak {
        Streak {
            kind,
            since: now,
            reported: now,
            unreported: 0,
        }
    }

    /// Counts one more failure. Once `REPORT_EVERY` has passed since the last report, returns
    /// how many failed since then (this one included): time to log again.
    fn again(&mut self, now: Instant) -> Option<u64> {
        self.unreported += 1;
        if now - self.reported < REPORT_EVERY {
            return None;
        }
        self.reported = now;
        Some(std::mem::take(&mut self.unreported))
    }
}

/// Whether to await the socket's writability before resending. Only after EAGAIN: tokio clears
/// the readiness it caches only on `WouldBlock`, so after ENOBUFS (also a full queue) the wait
/// would return at once and the task spin; that one waits out the backoff instead.
fn awaits_writability(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::WouldBlock
}

/// A duration to the second, for log lines.
fn seconds(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(Duration::from_secs(d.as_secs()))
}

fn connect(path: &std::path::Path) -> io::Result<UnixDatagram> {
    let socket = UnixDatagram::unbound()?;
    socket.connect(path)?;
    Ok(socket)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::libc;

    #[test]
    fn only_eagain_awaits_writability_enobufs_waits_out_the_backoff() {
        let eagain = io::Error::from_raw_os_error(libc::EAGAIN);
        let enobufs = io::Error::from_raw_os_error(libc::ENOBUFS);
        assert_eq!(SendErrorKind::of(&enobufs), SendErrorKind::QueueFull);
        assert!(awaits_writability(&eagain));
        assert!(!awaits_writability(&enobufs));
    }

    #[test]
    fn a_streak_is_reported_again_each_minute_with_the_failures_since() {
        let start = Instant::now();
        let mut streak = Streak::new(SendErrorKind::PermissionDenied, start);
        let at = |secs| start + Duration::from_secs(secs);
        assert_eq!(streak.again(at(1)), None);
        assert_eq!(streak.again(at(59)), None);
        assert_eq!(streak.again(at(60)), Some(3));
        assert_eq!(streak.again(at(61)), None);
        assert_eq!(streak.again(at(119)), None);
        assert_eq!(streak.again(at(120)), Some(3));
    }
}
