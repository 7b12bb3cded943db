//! The drain task: empties the ring into datagrams, keeps each in the resend window until the
//! collector acknowledges it, and sends (and, when no acknowledgement comes, resends) them.
//!
//! Its socket is bound to an address of its own (`--ack-socket`), where acknowledgements
//! arrive, and sends to the collector's path. It is not connected: the collector answers each
//! sender from a socket of that sender's own (see the collector's `replies`), so that a peer
//! that never reads its answers fills only its own socket's send buffer, and a connected
//! datagram socket would refuse those. Acknowledgements are checked for the collector's uid,
//! which the kernel attests (SO_PASSCRED), and for what they claim. An unconnected socket is
//! not told when a full receive queue (EAGAIN) has room again (epoll watches a connected
//! socket's peer only), so a full queue is tried again after 1 ms, doubling to 20 ms.
//!
//! When the collector asks for a seq the window no longer holds (it lost its record of this
//! sender: `click_senders` emptied, restored from a backup, or rolled back by a failover), the
//! drain answers with a resync (where the window starts, and how many clicks were
//! acknowledged before it) and sends the window again: the collector goes on from there.
//!
//! An event loop: each wake-up (a flush tick, an acknowledgement, the socket writable again, a
//! reconnect, resend or pause timer, the stop) is followed by non-blocking work only: read the
//! acknowledgements, move the ring into the window, send from the window's cursor until the
//! socket refuses. All state lives in `Drain`, so the stop deadline can end the loop at any
//! await without losing track of a click.

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::socket::{MsgFlags, UnixAddr};
use protocol::wire::{BadLimit, EncodeError, Encoder, Resync, MAX_ACK};
use shared::backoff::Backoff;
use shared::socket::SendErrorKind;
use shared::throttle::{Pass, Throttle};
use tokio::io::Interest;
use tokio::net::UnixDatagram;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::metrics::{Common, Dropped};
use crate::ring::{Read, Ring};
use crate::state::{Region, Sender, WindowStore};
use protocol::window::{Rewound, Window};
use shared::metrics::{Counter, Gauge, LabeledCounter};

const RECONNECT_FIRST: Duration = Duration::from_millis(50);
const RECONNECT_CAP: Duration = Duration::from_secs(1);
/// While sends keep failing, how often the failure is logged again.
const REPORT_EVERY: Duration = Duration::from_secs(60);
/// While the collector's queue is full, a send is tried again after the first, doubling up to
/// the cap: the collector reads a full queue (10 to 512 datagrams) in well under a millisecond.
const QUEUE_FULL_FIRST: Duration = Duration::from_millis(1);
const QUEUE_FULL_CAP: Duration = Duration::from_millis(20);
/// Datagrams sent in a row before the task yields, so that a backlog after an outage does not
/// hold a runtime thread that request handlers are waiting for.
const SENDS_PER_YIELD: u32 = 32;
/// Datagrams read from the ack socket a wake: the collector sends one a commit, so a few are
/// all it ever queues. Anything that may write to the socket can keep its queue full (the
/// collector, every redirector of the group): read without a bound, and ahead of the timers, it
/// held up the tick, resends and the stop's deadline for as long as it kept writing.
const ACKS_A_WAKE: usize = 8;
/// A sender with nothing unacknowledged that has sent nothing for this long goes on under a
/// new sender id, from seq 0, well within the 29 days a collector keeps an idle sender
/// (`protocol::senders::IDLE`): one that forgot it must not wait for seqs it cannot know were
/// committed. One stopped with datagrams in its window comes back under its id.
const NEW_SENDER_AFTER_IDLE: Duration = Duration::from_secs(24 * 3600);

shared::metrics! {
    /// What the drain counts: datagrams, sends, acknowledgements, resends and resyncs.
    pub struct Metrics {
        datagrams_sent: Counter = "datagrams_sent", "Datagrams the kernel accepted.";
        send_errors: LabeledCounter<SendErrorKind> = "send_errors",
            "Failed datagram sends, by kind; not_found also counts each reconnect that finds no collector socket.";
        resends: Counter = "resends",
            "Datagrams sent again: unacknowledged in time, asked for, or to a new collector.";
        acks: Counter = "acks", "Acknowledgements taken from the collector.";
        acks_rejected: Counter = "acks_rejected",
            "Acknowledgements refused: another uid, not an acknowledgement, or unsent seqs.";
        acks_stale: Counter = "acks_stale",
            "Acknowledgements from the collector for another sender id of this socket: a previous process's, or this one's before its id was renewed (ignored).";
        clicks_acked: Counter = "clicks_acked", "Clicks the collector acknowledged as committed.";
        resyncs: Counter = "resyncs",
            "Resyncs sent: the collector asked for seqs acknowledged already (it lost its record of this sender).";
        unacked_clicks: Gauge = "unacked_clicks",
            "Clicks out of the ring and not acknowledged yet (the resend window).";
    }
}

/// Why an acknowledgement was not applied.
enum AckError {
    /// The collector's, for another sender id: one this socket's previous process had (a late
    /// acknowledgement after a restart that kept no state region), or this process before it
    /// renewed its id. Nothing to refuse: only the collector's uid gets this far.
    OtherSender(u64),
    /// Not the collector's, not an acknowledgement, or for seqs never sent: why.
    Refused(String),
}

/// Where the drain sends, and how.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The collector's socket.
    pub collector: PathBuf,
    /// The address of our own, where acknowledgements arrive, and its file mode.
    pub ack_socket: PathBuf,
    pub ack_socket_mode: u32,
    /// How often the ring is emptied into datagrams.
    pub flush_every: Duration,
    /// Without an acknowledgement for this long, everything unacknowledged is sent again.
    pub ack_timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("--datagram-size: {0}")]
    DatagramSize(#[from] BadLimit),
    #[error("--ack-socket: {0}")]
    AckSocket(#[from] shared::socket::BindError),
    #[error("--ack-socket: {0}")]
    Io(#[from] io::Error),
    #[error("--socket {0:?}: not a Unix socket address: {1}")]
    Collector(PathBuf, nix::Error),
    #[error("--datagram-size: {0}")]
    SendBuffer(#[from] shared::socket::SendBufferError),
}

/// Tells the drain task to stop: the deadline of its final flush.
pub type Stop = watch::Sender<Option<Instant>>;

/// What the task left when it stopped, in clicks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Left {
    /// Never handed to the kernel (the ring, unsent window slots).
    pub unsent: u64,
    /// Sent and not acknowledged by the deadline.
    pub unacked: u64,
}

/// The state of the connection to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    Up,
    /// The collector's queue is full (EAGAIN): try again then.
    Blocked(Instant),
    /// A send failed otherwise (ENOBUFS, permissions, ...): try again then, same connection.
    Paused(Instant),
    /// The collector is away: connect again then, and resend what is unacknowledged.
    Away(Instant),
}

/// What woke the loop.
#[derive(Debug)]
enum Wake {
    Stop,
    Deadline,
    Tick,
    Readable,
    Retry,
    AckTimeout,
}

pub struct Drain {
    ring: Arc<Ring>,
    metrics: Arc<Metrics>,
    common: Arc<Common>,
    settings: Settings,
    encoder: Encoder,
    /// The next ring position to read. Positions from the ring's head up to it are in the
    /// datagram being built (or skipped); they are released once the window holds it.
    cursor: u64,
    window: Window<WindowStore>,
    sender: Sender,
    /// Bound at `--ack-socket`: sends the datagrams, receives the acknowledgements.
    socket: UnixDatagram,
    collector: UnixAddr,
    link: Link,
    /// The owner of the collector's socket file when we connected: acknowledgements from any
    /// other uid are refused.
    collector_uid: Option<u32>,
    /// When the owner of the collector's socket was last looked up after a refusal.
    uid_rechecked: Option<Instant>,
    backoff: Backoff,
    /// The retries of a full queue.
    queue_full: Backoff,
    /// The kind of the failures since the last send that worked, if any.
    failing: Option<SendErrorKind>,
    /// Those failures, so that a streak is not logged per attempt.
    failures: Throttle,
    /// When the last acknowledgement freed the window, or the first datagram it waits for was
    /// sent (a rewind leaves none waiting: the next send starts the wait).
    progress: Instant,
    /// When a datagram last entered the window.
    last_datagram: Instant,
    /// For a sender id adopted with datagrams in its window, until the collector confirms that
    /// its record of the sender is not past them: the ring's tail and the window's end (its
    /// next seq) at adoption (the first adoption's tail, kept in the region, when processes
    /// were restarted before the confirmation). Meanwhile nothing new is sealed, so that no new seq can hide an
    /// acknowledgement past the window, which says the region was rolled back
    /// ([`Drain::abandon_history`]).
    unconfirmed: Option<Unconfirmed>,
    refused_log: Throttle,
}

/// The drain's ack socket, bound (SO_PASSCRED on, so each acknowledgement carries its
/// sender's credentials), and the collector's address, checked: before the state region is
/// adopted, which a start that failed after it would have changed for nothing (its counts
/// of torn and stale clicks gone, its mark of a clean stop cleared).
pub struct Sockets {
    socket: std::os::unix::net::UnixDatagram,
    collector: UnixAddr,
}

impl Sockets {
    pub fn bind(settings: &Settings) -> Result<Sockets, Error> {
        let collector = UnixAddr::new(&settings.collector)
            .map_err(|e| Error::Collector(settings.collector.clone(), e))?;
        let socket = shared::socket::bind_datagram(&settings.ack_socket, settings.ack_socket_mode)?;
        socket.set_nonblocking(true)?;
        // Closing a descriptor a datagram carried could block the drain (`refuse_descriptors`).
        shared::socket::refuse_descriptors(&socket)?;
        Ok(Sockets { socket, collector })
    }

    /// Fits the ack socket's send buffer to datagrams of `size` (the configured size; the
    /// drain fits it again to its region's, if that region was laid out with another).
    pub fn fit(&self, size: usize) -> Result<(), Error> {
        Ok(shared::socket::fit_send_buffer(self.socket.as_fd(), size)?)
    }
}

impl Drain {
    /// Goes on from where the state region's window and sender left off, with datagrams of
    /// the size its window slots take, on `sockets` (bound with `settings`).
    pub fn new(
        state: Region,
        sockets: Sockets,
        metrics: Arc<Metrics>,
        common: Arc<Common>,
        settings: Settings,
    ) -> Result<Drain, Error> {
        let Region {
            ring,
            window,
            sender,
            geometry,
            ..
        } = state;
        let mut encoder = Encoder::new(sender.id(), geometry.slot_size as usize)?;
        encoder.resume_as(sender.id(), window.next_seq());
        let Sockets { socket, collector } = sockets;
        shared::socket::fit_send_buffer(socket.as_fd(), geometry.slot_size as usize)?;
        let now = Instant::now();
        let unconfirmed = (!window.is_empty()).then(|| Unconfirmed {
            tail: sender.unconfirmed_tail(ring.head(), ring.tail()),
            end: window.next_seq(),
        });
        Ok(Drain {
            cursor: ring.head(),
            ring,
            metrics,
            common,
            encoder,
            window,
            sender,
            socket: UnixDatagram::from_std(socket)?,
            collector,
            link: Link::Away(now),
            collector_uid: None,
            uid_rechecked: None,
            backoff: Backoff::new(RECONNECT_FIRST, RECONNECT_CAP),
            queue_full: Backoff::new(QUEUE_FULL_FIRST, QUEUE_FULL_CAP),
            failing: None,
            failures: Throttle::every(REPORT_EVERY),
            progress: now,
            last_datagram: now,
            unconfirmed,
            refused_log: Throttle::default(),
            settings,
        })
    }

    /// Runs until `stop` carries a deadline (or is dropped), then keeps sending and waiting for
    /// acknowledgements until everything is acknowledged or the deadline passes.
    pub async fn run(mut self, mut stop: watch::Receiver<Option<Instant>>) -> Left {
        let mut tick = tokio::time::interval(self.settings.flush_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut deadline = None;
        loop {
            match self.next_wake(&mut tick, &mut stop, deadline).await {
                Wake::Stop => deadline = Some(stop.borrow().unwrap_or_else(Instant::now)),
                Wake::Deadline => break,
                Wake::Tick => self.fill(),
                Wake::Readable => self.take_acks(),
                Wake::Retry => self.retry(),
                Wake::AckTimeout => self.ack_timeout(),
            }
            if deadline.is_some() {
                // Stopping: no handler pushes any more; move whatever is left at once.
                self.fill();
            }
            self.pump().await;
            self.metrics.unacked_clicks.set(self.window.clicks() as i64);
            if deadline.is_some() && self.is_done() {
                break;
            }
        }
        if let Err(e) = std::fs::remove_file(&self.settings.ack_socket) {
            let path = self.settings.ack_socket.display();
            tracing::warn!(%path, error = %e, "removing {path}: {e}");
        }
        self.left()
    }

    async fn next_wake(
        &self,
        tick: &mut tokio::time::Interval,
        stop: &mut watch::Receiver<Option<Instant>>,
        deadline: Option<Instant>,
    ) -> Wake {
        let retry_at = match self.link {
            Link::Paused(at) | Link::Away(at) | Link::Blocked(at) if self.window.has_unsent() => {
                Some(at)
            }
            _ => None,
        };
        // Not while a send of the window is under way (`ack_timeout` lets it finish): armed,
        // a deadline past would wake the loop at once, for nothing, until the send went.
        let ack_due = (self.window.awaits_ack() && !self.window.has_unsent())
            .then(|| self.progress + self.settings.ack_timeout);
        let at = |t: Option<Instant>| tokio::time::sleep_until(t.unwrap_or_else(Instant::now));
        tokio::select! {
            biased;
            // A closed channel means nobody will ever send a deadline: stop now.
            _ = stop.wait_for(Option::is_some), if deadline.is_none() => Wake::Stop,
            () = at(deadline), if deadline.is_some() => Wake::Deadline,
            // The timers before the socket, which its writers can keep readable
            // (`ACKS_A_WAKE`); each is past only once until handled. The tick before the
            // acknowledgement timeout, which a resend that outlasts a short --ack-timeout
            // leaves past at every wake: the ring would never be emptied into the window.
            () = at(retry_at), if retry_at.is_some() => Wake::Retry,
            _ = tick.tick() => Wake::Tick,
            () = at(ack_due), if ack_due.is_some() => Wake::AckTimeout,
            Ok(()) = self.socket.readable() => Wake::Readable,
        }
    }

    fn is_done(&self) -> bool {
        self.ring.is_empty() && self.encoder.is_empty() && self.window.is_empty()
    }

    fn left(&self) -> Left {
        let (unsent, unacked) = self.window.unsent_and_unacked();
        // The ring holds the datagram being built (its clicks, between the head and the
        // cursor, beside cells skipped there: torn, or dropped as invalid) and what the cursor
        // has not reached, where torn cells are passed over: each was counted once already,
        // when the region was adopted or the cell skipped.
        let ahead = (self.cursor..self.ring.tail())
            .filter(|&pos| !matches!(self.ring.read(pos), Read::Torn))
            .count();
        Left {
            unsent: unsent + (self.encoder.len() + ahead) as u64,
            unacked,
        }
    }

    /// Moves what the ring held when called into datagrams in the window, the last one
    /// partial, until the window is full (then the ring holds the rest). Later arrivals wait
    /// for the next tick, so one fill is bounded. Nothing moves while the window still holds a
    /// datagram that could not be sent (the collector away or its queue full): the ring holds
    /// the clicks meanwhile, rather than the window filling up with a small datagram per tick.
    /// Nor while an adopted window is unconfirmed (`Drain::unconfirmed`).
    fn fill(&mut self) {
        if self.window.has_unsent() || self.unconfirmed.is_some() {
            return;
        }
        let end = self.ring.tail();
        while self.cursor < end && !self.window.is_full() {
            let slot = match self.ring.read(self.cursor) {
                // A push still writing its slot: the next tick takes it.
                Read::Empty => break,
                // Counted when the region was adopted.
                Read::Torn => {
                    self.cursor += 1;
                    continue;
                }
                Read::Click(slot) => slot,
            };
            self.renew_sender_after_idle();
            let pushed = slot.code().map_err(EncodeError::from).and_then(|code| {
                self.encoder
                    .push_with(code, slot.at_us(), &slot.dimensions())
            });
            match pushed {
                Ok(()) => self.cursor += 1,
                Err(EncodeError::Full) => self.seal(),
                Err(e) => {
                    self.cursor += 1;
                    self.common.clicks_dropped.inc(Dropped::Invalid);
                    tracing::warn!(code = ?slot.code(), "dropping a click: {e}");
                }
            }
        }
        if !self.encoder.is_empty() && !self.window.is_full() {
            self.seal();
        }
        if self.encoder.is_empty() {
            // Everything before the cursor is in the window or was skipped.
            self.ring.release(self.cursor);
        }
    }

    /// Before the first click after a long idle spell with nothing unacknowledged: a new id.
    fn renew_sender_after_idle(&mut self) {
        if self.encoder.is_empty()
            && self.window.is_empty()
            && self.last_datagram.elapsed() >= NEW_SENDER_AFTER_IDLE
        {
            let sender = self.sender.renew(&mut self.window);
            tracing::info!(
                sender = format_args!("{sender:016x}"),
                "idle for over {}: going on as a new sender",
                seconds(NEW_SENDER_AFTER_IDLE)
            );
            self.encoder.restart_as(sender);
        }
    }

    /// The datagram being built goes into the window, to be sent, and its clicks leave the
    /// ring: in that order, so that a process killed in between has them in one or the other
    /// (the window's tag says how far the ring is consumed).
    fn seal(&mut self) {
        let clicks = self.encoder.len() as u32;
        let seq = self.encoder.seq();
        self.window
            .push(seq, self.encoder.datagram(), clicks, self.cursor);
        self.ring.release(self.cursor);
        self.encoder.next();
        self.last_datagram = Instant::now();
    }

    /// Sends from the window's cursor while the connection is up and the kernel takes them.
    async fn pump(&mut self) {
        let mut sent = 0;
        while self.link == Link::Up {
            let Some(datagram) = self.window.next_unsent() else {
                return;
            };
            let fd = self.socket.as_raw_fd();
            let result =
                nix::sys::socket::sendto(fd, datagram, &self.collector, MsgFlags::MSG_DONTWAIT);
            match result.map_err(io::Error::from) {
                Ok(_) => self.sent(),
                Err(err) => return self.send_failed(&err),
            }
            sent += 1;
            if sent % SENDS_PER_YIELD == 0 {
                tokio::task::yield_now().await;
            }
        }
    }

    fn sent(&mut self) {
        if !self.window.awaits_ack() {
            // The acknowledgement timeout counts from the send of the first datagram it waits
            // for: not from when it was sealed, nor from the last wait, which a collector away
            // for longer than the timeout would leave past (and the whole window sent twice).
            self.progress = Instant::now();
        }
        match self.window.mark_sent() {
            Some(clicks) => {
                self.common.clicks_sent.inc_by(u64::from(clicks));
                self.metrics.datagrams_sent.inc();
            }
            None => {
                self.metrics.resends.inc();
            }
        }
        self.backoff.reset();
        self.queue_full.reset();
        if let (Some(kind), Some(lasting)) = (self.failing.take(), self.failures.end()) {
            if kind != SendErrorKind::QueueFull {
                tracing::info!(
                    after_s = lasting.as_secs(),
                    "sending to {} again after {}",
                    self.settings.collector.display(),
                    seconds(lasting)
                );
            }
        }
    }

    fn send_failed(&mut self, err: &io::Error) {
        let kind = SendErrorKind::of(err);
        self.metrics.send_errors.inc(kind);
        self.note_failure(kind, err);
        // Each backoff moves on for its own kind only: a run of full queues does not leave the
        // next reconnect waiting the longest.
        self.link = if retries_soon(err) {
            Link::Blocked(Instant::now() + self.queue_full.next_wait())
        } else if kind.receiver_away() {
            Link::Away(Instant::now() + self.backoff.next_wait())
        } else {
            Link::Paused(Instant::now() + self.backoff.next_wait())
        };
    }

    /// A pause is over, or it is time to connect again.
    fn retry(&mut self) {
        match self.link {
            Link::Paused(_) | Link::Blocked(_) => self.link = Link::Up,
            Link::Away(_) => self.connect(),
            Link::Up => {}
        }
    }

    /// Finds the collector's socket (again), and whose it is: a new collector has none of what
    /// the last one did not acknowledge, so all of it is sent again.
    fn connect(&mut self) {
        let path = &self.settings.collector;
        match std::fs::metadata(path) {
            Ok(socket) => {
                self.collector_uid = Some(socket.uid());
                self.link = Link::Up;
                let again = self.window.rewind();
                if again > 0 {
                    tracing::info!(
                        datagrams = again,
                        "connected to {}: resending {again} unacknowledged datagrams",
                        path.display()
                    );
                }
            }
            Err(err) => self.send_failed(&err),
        }
    }

    /// No acknowledgement for `--ack-timeout`: go back to the oldest unacknowledged datagram.
    /// The acknowledgement timeout: everything unacknowledged is sent again, unless an
    /// acknowledgement is queued by now (the task woke late), or a send of the window is still
    /// under way (a resend, or new datagrams the collector's full queue holds up). Rewound
    /// again there, with an --ack-timeout shorter than a resend of the window takes, the
    /// window was never all sent, and the ring, which `fill` leaves until it is, never emptied.
    fn ack_timeout(&mut self) {
        self.take_acks();
        if self.window.awaits_ack()
            && !self.window.has_unsent()
            && self.progress + self.settings.ack_timeout <= Instant::now()
        {
            self.resend_unacked();
        }
    }

    fn resend_unacked(&mut self) {
        let again = self.window.rewind();
        tracing::debug!(
            datagrams = again,
            "no acknowledgement for {:?}: resending {again} datagrams",
            self.settings.ack_timeout
        );
    }

    /// Reads acknowledgements (`read_acks`), and fills what they free of a window that was full:
    /// a tick that came with them went first, to the full window, and the ring would otherwise
    /// wait a flush interval more.
    fn take_acks(&mut self) {
        let was_full = self.window.is_full();
        self.read_acks();
        if was_full && !self.window.is_full() {
            self.fill();
        }
    }

    /// Reads the acknowledgements queued on the socket, `ACKS_A_WAKE` at most.
    fn read_acks(&mut self) {
        let mut buf = [0u8; MAX_ACK + 1];
        for _ in 0..ACKS_A_WAKE {
            let fd = self.socket.as_fd();
            let read = self
                .socket
                .try_io(Interest::READABLE, || shared::socket::recv(fd, &mut buf));
            match read {
                Ok(ack) => {
                    // Longer than any acknowledgement: cut, and refused as trailing bytes.
                    let uid = ack.creds.map(|c| c.uid);
                    match self.take_ack(&buf[..ack.len], uid) {
                        Ok(()) => {}
                        Err(AckError::OtherSender(sender)) => {
                            self.metrics.acks_stale.inc();
                            tracing::debug!(
                                "an acknowledgement for sender {sender:016x}, not this one"
                            );
                        }
                        Err(AckError::Refused(why)) => {
                            self.metrics.acks_rejected.inc();
                            if let Some(held) = self.refused_log.allow() {
                                tracing::warn!(
                                    reason = %why,
                                    held,
                                    "refused an acknowledgement: {why} ({held} more not logged)"
                                );
                            }
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    if let Some(held) = self.refused_log.allow() {
                        tracing::warn!(
                            error = %e,
                            held,
                            "reading acknowledgements: {e} ({held} more not logged)"
                        );
                    }
                    return;
                }
            }
        }
    }

    fn recheck_collector_uid(&mut self) {
        let now = Instant::now();
        if self
            .uid_rechecked
            .is_some_and(|at| now - at < Duration::from_secs(1))
        {
            return;
        }
        self.uid_rechecked = Some(now);
        if let Ok(socket) = std::fs::metadata(&self.settings.collector) {
            self.collector_uid = Some(socket.uid());
        }
    }

    /// Applies one acknowledgement, or says why it is not (and changes nothing).
    fn take_ack(&mut self, bytes: &[u8], uid: Option<u32>) -> Result<(), AckError> {
        if uid.is_some() && uid != self.collector_uid {
            // A new collector under another user, found without a failed send (a socket
            // passed by systemd stays in place): look again, at most once a second.
            self.recheck_collector_uid();
        }
        if uid.is_none() || uid != self.collector_uid {
            return Err(AckError::Refused(format!(
                "from uid {uid:?}, not the collector's ({:?})",
                self.collector_uid
            )));
        }
        let ack =
            protocol::wire::decode_ack(bytes).map_err(|e| AckError::Refused(e.to_string()))?;
        if ack.sender != self.encoder.sender() {
            return Err(AckError::OtherSender(ack.sender));
        }
        let applied = match self.window.apply(ack.committed, ack.resend_from) {
            Ok(applied) => applied,
            Err(refused) => {
                // Until an acknowledgement confirmed the adopted window, a refusal says the
                // collector's record is past it; after, it is a peer's bad answer.
                if let Some(adopted) = self.unconfirmed.take() {
                    self.abandon_history(&refused, adopted.tail);
                }
                return Err(AckError::Refused(refused.to_string()));
            }
        };
        if self.unconfirmed.is_some_and(|u| u.confirmed_by(&ack)) {
            self.unconfirmed = None;
            self.sender.confirmed();
        }
        if applied.released.datagrams > 0 {
            self.metrics.clicks_acked.inc_by(applied.released.clicks);
            self.progress = Instant::now();
        }
        match (ack.resend_from, applied.rewound) {
            (Some(seq), Some(Rewound::Resend(again))) => {
                tracing::debug!(
                    seq,
                    datagrams = again,
                    "the collector asks to resend from seq {seq}: {again} datagrams"
                )
            }
            (
                Some(seq),
                Some(Rewound::Resync {
                    first,
                    clicks_before,
                }),
            ) => self.resync(seq, first, clicks_before),
            _ => {}
        }
        self.metrics.acks.inc();
        Ok(())
    }

    /// An acknowledgement refused while the adopted window is unconfirmed knows a seq of the
    /// sender that the region never held: another process of the sender went further than the
    /// region says, which was rolled back (restored from an older copy). What the region held
    /// (the window, the ring up to `adopted_tail`, its tail at adoption) may be committed
    /// already, and the seqs from here on were: it is dropped, counted as `stale_region`, and
    /// the sender goes on under a new id, with the clicks served since. Otherwise the collector
    /// took the new datagrams up to its record for ones it had, and their clicks were freed
    /// unwritten.
    fn abandon_history(&mut self, refused: &protocol::window::Refused, adopted_tail: u64) {
        // Nothing was sealed since adoption (`unconfirmed`): the encoder is empty. What goes is
        // counted and logged before anything goes: a process killed midway has said so (the
        // next start finds the rest again, and says it again).
        let mut upto = self.cursor;
        let mut dropped = self.window.clicks();
        while upto < adopted_tail {
            match self.ring.read(upto) {
                // Not after adoption's repair: kept for the new id, to be safe.
                Read::Empty => break,
                Read::Torn => {}
                Read::Click(_) => dropped += 1,
            }
            upto += 1;
        }
        let old = self.encoder.sender();
        tracing::error!(
            dropped,
            "the collector {refused}: this sender ({old:016x}) went further than its region \
             says, which was rolled back; dropping the {dropped} clicks it held as stale_region \
             (they may have been written) and going on as a new sender with the clicks served \
             since"
        );
        self.common
            .clicks_dropped
            .add(Dropped::StaleRegion, dropped);
        // The ring first: killed before the window is emptied, the next start finds the same
        // window again.
        self.cursor = upto;
        self.ring.release(self.cursor);
        self.window.discard();
        let sender = self.sender.renew(&mut self.window);
        self.encoder.restart_as(sender);
        tracing::info!("going on as sender {sender:016x}");
    }

    /// The collector asked for `asked`, acknowledged already: it lost its record of this
    /// sender. Tells it where the window starts; the window follows, from its start.
    fn resync(&mut self, asked: u64, first: u64, clicks_before: u64) {
        let resync = Resync::new(self.encoder.sender(), first, clicks_before).encode();
        let fd = self.socket.as_raw_fd();
        let sent = nix::sys::socket::sendto(fd, &resync, &self.collector, MsgFlags::MSG_DONTWAIT);
        match sent {
            Ok(_) => {
                self.metrics.resyncs.inc();
                tracing::warn!(
                    asked,
                    first,
                    clicks_before,
                    "the collector asks for seq {asked}, acknowledged already: it lost its \
                     record of this sender; resyncing from seq {first} ({clicks_before} clicks \
                     acknowledged before it)"
                )
            }
            // The collector asks again, and is answered again.
            Err(e) => tracing::debug!(error = %e, "sending a resync: {e}"),
        }
    }

    /// Logs the first failure of a streak and then one line per `REPORT_EVERY` while it lasts,
    /// so a send that never works (permissions, say) stays visible while the ring fills and
    /// drops. A full queue is ordinary backpressure, not a warning.
    fn note_failure(&mut self, kind: SendErrorKind, err: &io::Error) {
        if self.failing.replace(kind) != Some(kind) {
            self.failures.end();
        }
        let again = match self.failures.hit() {
            None => return,
            Some(Pass::First) => None,
            // The failures since the last report, this one included.
            Some(Pass::Again { held, lasting }) => Some((held + 1, lasting)),
        };
        let held = self.ring.len() as u64 + self.window.clicks();
        let path = self.settings.collector.display();
        let label = kind.as_str();
        match (again, kind == SendErrorKind::QueueFull) {
            (None, true) => tracing::debug!("collector queue full; waiting ({held} clicks held)"),
            (Some((failures, lasting)), true) => tracing::debug!(
                "collector queue full for {}: {failures} more waits ({held} clicks held)",
                seconds(lasting)
            ),
            (None, false) => tracing::warn!(
                kind = label,
                error = %err,
                held,
                "sending to {path}: {err} ({label}); keeping {held} clicks and retrying"
            ),
            (Some((failures, lasting)), false) => tracing::warn!(
                kind = label,
                error = %err,
                held,
                failures,
                "sending to {path} still fails after {}: {err} ({label}); {failures} failures \
                 since the last report, {held} clicks held, {} dropped so far for a full ring",
                seconds(lasting),
                self.common.clicks_dropped.get(Dropped::RingFull)
            ),
        }
    }
}

/// See `Drain::unconfirmed`.
#[derive(Debug, Clone, Copy)]
struct Unconfirmed {
    tail: u64,
    end: u64,
}

impl Unconfirmed {
    /// Whether `ack`, accepted, says the collector's record of the sender is not past the
    /// adopted window: it committed all of it, or it asks to resend from a seq up to its end
    /// (so it has not taken the window's last; below the window, a resync). An acknowledgement
    /// of less may come from a collector that took more and has not committed it yet.
    fn confirmed_by(&self, ack: &protocol::wire::Ack) -> bool {
        ack.resend_from.is_some()
            || ack
                .committed
                .is_some_and(|seq| seq.saturating_add(1) >= self.end)
    }
}

/// Whether a failed send is tried again within milliseconds: after EAGAIN (the collector's
/// queue full, which it empties fast) only; after ENOBUFS (the kernel short of memory) the
/// drain waits out the longer backoff.
fn retries_soon(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::WouldBlock
}

/// A duration to the second, for log lines.
fn seconds(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(Duration::from_secs(d.as_secs()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::libc;

    /// A drain of `region` with `settings` and metrics of its own.
    fn unmetered(region: Region, settings: Settings) -> Drain {
        let sockets = Sockets::bind(&settings).unwrap();
        Drain::new(region, sockets, Arc::default(), Arc::default(), settings).unwrap()
    }

    /// Torn cells behind a window that still holds unsent datagrams (so the drain has not
    /// passed over them) are not counted again in what a stop leaves.
    #[tokio::test]
    async fn a_stop_leaves_the_clicks_not_the_torn_cells() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let geometry = crate::state::Geometry {
            ring: 16,
            window: 4,
            slot_size: protocol::wire::DEFAULT_DATAGRAM as u64,
        };
        let drain = |region, n: u32| {
            let settings = Settings {
                collector: dir.path().join("nobody.sock"),
                ack_socket: dir.path().join(format!("ack-{n}.sock")),
                ack_socket_mode: 0o600,
                flush_every: Duration::from_millis(5),
                ack_timeout: Duration::from_secs(3600),
            };
            unmetered(region, settings)
        };
        let human = Default::default();
        let mut first = drain(Region::file(&path, geometry).unwrap(), 1);
        first.ring.push("a", 1, &human).unwrap();
        first.ring.push("b", 2, &human).unwrap();
        first.fill();
        first.ring.push("c", 3, &human).unwrap();
        first.fill();
        assert_eq!(
            first.left(),
            Left {
                unsent: 3,
                unacked: 0
            }
        );
        drop(first);
        crate::state::claim_unpublished(&path);
        let region = Region::file(&path, geometry).unwrap();
        assert_eq!((region.recovered, region.torn), (3, 1));
        let mut second = drain(region, 2);
        second.fill();
        assert_eq!(
            second.left(),
            Left {
                unsent: 3,
                unacked: 0
            }
        );
    }

    /// A drain whose collector is not there, and `n` datagrams of garbage queued on its ack
    /// socket (the socket's queue holds 10 unless `net.unix.max_dgram_qlen` says otherwise).
    async fn flooded(dir: &std::path::Path, n: usize) -> Drain {
        let settings = Settings {
            collector: dir.join("nobody.sock"),
            ack_socket: dir.join("ack.sock"),
            ack_socket_mode: 0o600,
            flush_every: Duration::from_millis(5),
            ack_timeout: Duration::from_secs(3600),
        };
        let region = Region::in_process(16, 4).unwrap();
        let drain = unmetered(region, settings);
        let garbage = std::os::unix::net::UnixDatagram::unbound().unwrap();
        garbage.set_nonblocking(true).unwrap();
        for i in 0..n {
            let sent = garbage.send_to(&[0xff], dir.join("ack.sock"));
            sent.unwrap_or_else(|e| panic!("queueing datagram {i} of {n}: {e}"));
        }
        drain.socket.readable().await.unwrap();
        drain
    }

    /// A tick of an hour, overdue: a turn of the timer wheel past it (and past whatever else
    /// is due within 10 ms), so that it is due when first polled.
    async fn overdue_tick() -> tokio::time::Interval {
        let mut tick = tokio::time::interval(Duration::from_secs(3600));
        tick.tick().await;
        tick.reset_immediately();
        tokio::time::sleep(Duration::from_millis(10)).await;
        tick
    }

    /// The ack socket refuses datagrams carrying descriptors at their sender, on a kernel that
    /// can (Linux 6.16 on): closing one as it is read could block the drain.
    #[tokio::test]
    async fn the_ack_socket_refuses_datagrams_carrying_descriptors() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let _drain = flooded(dir.path(), 1).await;
        let sender = std::os::unix::net::UnixDatagram::unbound().unwrap();
        let (_read, write) = nix::unistd::pipe().unwrap();
        let ack = dir.path().join("ack.sock");
        let sent = testkit::send_with_fds(&sender, &ack, b"fds", &[write.as_raw_fd()]);
        // Whether this kernel knows the option, asked of a socket of the test's own.
        let can = shared::socket::refuse_descriptors(&sender).unwrap();
        let refused = can.then_some(nix::errno::Errno::EPERM);
        assert_eq!(
            sent.err(),
            refused,
            "sent at a kernel that can refuse: {can}"
        );
    }

    /// Garbage written to the ack socket as fast as it is read neither keeps a wake reading
    /// nor keeps the timers from their turn.
    #[tokio::test]
    async fn a_full_ack_socket_is_read_a_few_at_a_wake_after_the_timers() {
        let dir = tempfile::tempdir().unwrap();
        let mut drain = flooded(dir.path(), ACKS_A_WAKE + 1).await;
        drain.read_acks();
        assert_eq!(drain.metrics.acks_rejected.get(), ACKS_A_WAKE as u64);
        // A tick overdue, and the socket still holding one.
        let mut tick = overdue_tick().await;
        let (_stop, mut stopped) = watch::channel(None);
        let wake = drain.next_wake(&mut tick, &mut stopped, None).await;
        assert!(matches!(wake, Wake::Tick), "{wake:?}");
        let wake = drain.next_wake(&mut tick, &mut stopped, None).await;
        assert!(matches!(wake, Wake::Readable), "{wake:?}");
        drain.read_acks();
        assert_eq!(drain.metrics.acks_rejected.get(), ACKS_A_WAKE as u64 + 1);
    }

    /// A drain of a window of `window` datagrams and `ack_timeout`, connected to a collector
    /// socket of the test's, and the tick an hour apart.
    fn connected(
        dir: &std::path::Path,
        window: u64,
        ack_timeout: Duration,
    ) -> (Drain, std::os::unix::net::UnixDatagram) {
        let settings = Settings {
            collector: dir.join("collector.sock"),
            ack_socket: dir.join("ack.sock"),
            ack_socket_mode: 0o600,
            flush_every: Duration::from_secs(3600),
            ack_timeout,
        };
        let collector = std::os::unix::net::UnixDatagram::bind(&settings.collector).unwrap();
        let region = Region::in_process(16, window).unwrap();
        let mut drain = unmetered(region, settings);
        drain.connect();
        (drain, collector)
    }

    /// A tick comes before an acknowledgement timeout that is past as well: with an
    /// --ack-timeout shorter than a resend of the window takes, the timeout is past at every
    /// wake, and a tick behind it never came (the ring filled, and dropped clicks).
    #[tokio::test]
    async fn a_tick_is_not_held_off_by_an_acknowledgement_timeout_always_past() {
        let dir = tempfile::tempdir().unwrap();
        let (mut drain, _collector) = connected(dir.path(), 4, Duration::from_millis(1));
        drain.ring.push("a", 1, &Default::default()).unwrap();
        drain.fill();
        drain.pump().await;
        assert!(drain.window.awaits_ack());
        // Both past when first polled.
        let mut tick = overdue_tick().await;
        let (_stop, mut stopped) = watch::channel(None);
        let wake = drain.next_wake(&mut tick, &mut stopped, None).await;
        assert!(matches!(wake, Wake::Tick), "{wake:?}");
        let wake = drain.next_wake(&mut tick, &mut stopped, None).await;
        assert!(matches!(wake, Wake::AckTimeout), "{wake:?}");
    }

    /// An acknowledgement timeout while a resend is under way lets it finish rather than
    /// start it over: rewound at every timeout shorter than a resend takes, the window was
    /// never all sent, and the ring never emptied into it (`fill` waits for that). Two
    /// datagrams sent, a timeout, one of them sent again, a timeout: the other goes once more,
    /// not both.
    #[tokio::test]
    async fn an_acknowledgement_timeout_lets_a_resend_under_way_finish() {
        let dir = tempfile::tempdir().unwrap();
        let timeout = Duration::from_millis(1);
        let (mut drain, collector) = connected(dir.path(), 4, timeout);
        collector.set_nonblocking(true).unwrap();
        let human = Default::default();
        for (code, at) in [("a", 1), ("b", 2)] {
            drain.ring.push(code, at, &human).unwrap();
            drain.fill();
            drain.pump().await;
        }
        let received = |collector: &std::os::unix::net::UnixDatagram| {
            let mut buf = [0u8; 256];
            std::iter::from_fn(|| collector.recv(&mut buf).ok()).count()
        };
        assert_eq!(received(&collector), 2);
        tokio::time::sleep(2 * timeout).await;
        drain.ack_timeout();
        drain.sent();
        assert!(drain.window.has_unsent(), "one of the two sent again");
        tokio::time::sleep(2 * timeout).await;
        drain.ack_timeout();
        drain.pump().await;
        assert_eq!(
            received(&collector),
            1,
            "the resend finished, not begun again"
        );
        drain.ring.push("c", 3, &human).unwrap();
        drain.fill();
        assert!(drain.window.has_unsent(), "c sealed into the window");
    }

    /// A click pushed, sealed into the window and sent; then another pushed, and sealed too if
    /// the window has room for it, not sent.
    async fn sent_then_sealed(drain: &mut Drain) {
        let human = Default::default();
        drain.ring.push("a", 1, &human).unwrap();
        drain.fill();
        drain.pump().await;
        drain.ring.push("b", 2, &human).unwrap();
        drain.fill();
    }

    /// While a send is held up (the collector's queue full) past the acknowledgement timeout,
    /// the next wake is the retry, not the timeout, which `ack_timeout` would pass over: the
    /// loop woke at once and again until the retry, a core spinning for as long as the
    /// collector did not read.
    #[tokio::test]
    async fn a_send_held_up_past_the_acknowledgement_timeout_waits_for_its_retry() {
        let dir = tempfile::tempdir().unwrap();
        let timeout = Duration::from_millis(1);
        let (mut drain, _collector) = connected(dir.path(), 4, timeout);
        sent_then_sealed(&mut drain).await;
        assert!(drain.window.awaits_ack() && drain.window.has_unsent());
        let retry_at = Instant::now() + Duration::from_millis(100);
        drain.link = Link::Blocked(retry_at);
        tokio::time::sleep(2 * timeout).await;
        let mut tick = tokio::time::interval(Duration::from_secs(3600));
        tick.tick().await;
        let (_stop, mut stopped) = watch::channel(None);
        let wake = drain.next_wake(&mut tick, &mut stopped, None).await;
        assert!(matches!(wake, Wake::Retry), "{wake:?}");
        assert!(Instant::now() >= retry_at, "woken before the retry");
    }

    /// A run of full queues moves the queue's backoff alone: the collector going away after
    /// it is tried again after the first reconnect wait, not the longest.
    #[tokio::test]
    async fn full_queues_leave_the_reconnect_backoff_where_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let mut drain = flooded(dir.path(), 1).await;
        let full = io::Error::from(io::ErrorKind::WouldBlock);
        for _ in 0..20 {
            drain.send_failed(&full);
        }
        let before = Instant::now();
        drain.send_failed(&io::Error::from_raw_os_error(libc::ECONNREFUSED));
        let Link::Away(at) = drain.link else {
            panic!("not away: {:?}", drain.link)
        };
        assert!(at <= Instant::now() + RECONNECT_FIRST, "{:?}", at - before);
    }

    /// An acknowledgement that frees a full window fills it from the ring at once, rather than
    /// a flush interval later.
    #[tokio::test]
    async fn an_acknowledgement_that_frees_a_full_window_fills_it_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let (mut drain, collector) = connected(dir.path(), 1, Duration::from_secs(3600));
        sent_then_sealed(&mut drain).await;
        assert!(
            drain.window.is_full() && !drain.window.has_unsent(),
            "b waits in the ring"
        );
        let mut buf = [0u8; 256];
        let (_, from) = collector.recv_from(&mut buf).unwrap();
        let ack = protocol::wire::Ack::new(drain.encoder.sender(), Some(0), None).encode();
        collector
            .send_to(&ack, from.as_pathname().unwrap())
            .unwrap();
        drain.socket.readable().await.unwrap();
        drain.take_acks();
        assert_eq!(drain.metrics.clicks_acked.get(), 1);
        assert!(drain.window.has_unsent(), "b sealed into the window freed");
    }

    /// The collector's acknowledgement for another sender id (a previous process's, late) is
    /// counted apart and changes nothing; one for seqs this sender never sent is refused.
    #[tokio::test]
    async fn an_acknowledgement_for_another_sender_is_stale_not_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (mut drain, collector) = connected(dir.path(), 1, Duration::from_secs(3600));
        drain.ring.push("a", 1, &Default::default()).unwrap();
        drain.fill();
        drain.pump().await;
        let mut buf = [0u8; 256];
        let (_, from) = collector.recv_from(&mut buf).unwrap();
        let me = drain.encoder.sender();
        for ack in [
            protocol::wire::Ack::new(me ^ 1, Some(0), None),
            protocol::wire::Ack::new(me, Some(5), None),
        ] {
            let sent = collector.send_to(&ack.encode(), from.as_pathname().unwrap());
            sent.unwrap();
            drain.socket.readable().await.unwrap();
            drain.take_acks();
        }
        assert_eq!(drain.metrics.acks_stale.get(), 1);
        assert_eq!(drain.metrics.acks_rejected.get(), 1, "seq 5 never sent");
        assert_eq!(drain.metrics.clicks_acked.get(), 0);
    }

    /// An adopted window of seqs up to 4: only an acknowledgement of all of it, or a request to
    /// resend from a seq in it, says the collector took no more.
    #[test]
    fn only_the_whole_adopted_window_acknowledged_or_a_resend_request_confirms_it() {
        let adopted = Unconfirmed { tail: 0, end: 5 };
        let ack = |committed, resend_from| protocol::wire::Ack::new(1, committed, resend_from);
        assert!(!adopted.confirmed_by(&ack(None, None)));
        assert!(!adopted.confirmed_by(&ack(Some(3), None)));
        assert!(adopted.confirmed_by(&ack(Some(4), None)));
        assert!(adopted.confirmed_by(&ack(Some(u64::MAX), None)));
        assert!(adopted.confirmed_by(&ack(None, Some(2))));
    }

    #[test]
    fn only_eagain_retries_soon_enobufs_waits_out_the_backoff() {
        let eagain = io::Error::from_raw_os_error(libc::EAGAIN);
        let enobufs = io::Error::from_raw_os_error(libc::ENOBUFS);
        assert_eq!(SendErrorKind::of(&enobufs), SendErrorKind::QueueFull);
        assert!(retries_soon(&eagain));
        assert!(!retries_soon(&enobufs));
    }
}
