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

pub struct Drain {
    ring: Arc<Ring>,
    metrics: Arc<Metrics>,
    path: PathBuf,
    encoder: Encoder,
    /// A click popped from the ring that did not fit the datagram being sent.
    held: Option<Slot>,
    socket: Option<UnixDatagram>,
    backoff: Backoff,
    /// The kind of the last failed send, so a streak of failures is logged once.
    failing: Option<SendErrorKind>,
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
            match (kind, &self.socket) {
                (SendErrorKind::QueueFull, Some(socket)) => {
                    if socket.writable().await.is_err() {
                        self.socket = None;
                    }
                }
                _ => {
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
        if let Some(kind) = self.failing.take() {
            if kind != SendErrorKind::QueueFull {
                tracing::info!("sending to {} again", self.path.display());
            }
        }
    }

    /// Logs the first failure of a streak; a full queue is ordinary backpressure, not a warning.
    fn note_failure(&mut self, kind: SendErrorKind, err: &io::Error) {
        if self.failing == Some(kind) {
            return;
        }
        self.failing = Some(kind);
        let held = self.pending();
        if kind == SendErrorKind::QueueFull {
            tracing::debug!("collector queue full; waiting ({held} clicks held)");
        } else {
            tracing::warn!(
                "sending to {}: {err} ({}); keeping {held} clicks and retrying",
                self.path.display(),
                kind.as_str()
            );
        }
    }
}

fn connect(path: &std::path::Path) -> io::Result<UnixDatagram> {
    let socket = UnixDatagram::unbound()?;
    socket.connect(path)?;
    Ok(socket)
}

/// A sender id for this process start: random, from the standard library's per-process keys.
pub fn random_sender() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_i64(shared::now_us());
    h.write_u32(std::process::id());
    h.finish()
}
