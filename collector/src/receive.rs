//! The receive loop: datagrams from the socket into the batch being filled, decoded and
//! judged by sender seq; full or due batches handed to the writer; acknowledgements for what
//! the writer committed; and the drain at stop.
//!
//! Exactly two batches exist: one being written while the other fills. When the filling one
//! is due and the writer still has the other, the loop stops reading, so the kernel queue
//! fills and senders keep their clicks (backpressure). A batch the writer hands back is
//! committed: its senders are acknowledged before it is filled again.

use std::future::Future;
use std::io;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use shared::throttle::Throttle;
use tokio::time::Instant;

use crate::batch::{Batch, Handoff, Window};
use crate::intake::{Intake, Outcome, Why};
use crate::metrics::Metrics;
use crate::mirror::Mirror;
use crate::senders::{Reply, Senders};
use crate::socket::{Datagram, Inbox};

/// Larger than any valid datagram (60 KiB), so a larger one is seen as truncated.
const BUF_SIZE: usize = 64 * 1024;

/// The writer stopped taking batches (it only does if it panicked).
#[derive(Debug, thiserror::Error)]
#[error("the database writer stopped; cannot write further batches")]
pub struct WriterGone;

pub struct Receiver {
    inbox: Inbox,
    buf: Box<[u8]>,
    intake: Intake,
    mirror: Option<Mirror>,
    metrics: Arc<Metrics>,
    batch_rows: usize,
    flush_interval: Duration,
    handoff: Handoff,
    /// The batch being filled; `None` while both are with the writer.
    current: Option<Batch>,
    /// A committed batch back from the writer, emptied, while another fills.
    spare: Option<Batch>,
    reject_log: Throttle,
    lost_log: Throttle,
    mirror_log: Throttle,
    recv_log: Throttle,
    reply_log: Throttle,
}

/// What woke the loop.
enum Event {
    Stop,
    Due,
    Committed(Option<Batch>),
    Received(io::Result<Option<Datagram>>),
}

/// When a batch is handed to the writer: at `batch_rows` clicks, or `flush_interval` after
/// its first datagram, whichever comes first.
pub struct Settings {
    pub batch_rows: usize,
    pub flush_interval: Duration,
    /// Clicks dated outside it are set aside, not written into `clicks`.
    pub window: Window,
    /// `--allow-uid`: datagrams of any other uid are rejected.
    pub allowed_uids: Option<Vec<u32>>,
}

impl Receiver {
    pub fn new(
        inbox: Inbox,
        senders: Senders,
        mirror: Option<Mirror>,
        metrics: Arc<Metrics>,
        settings: Settings,
        handoff: Handoff,
    ) -> Receiver {
        Receiver {
            inbox,
            buf: vec![0; BUF_SIZE].into_boxed_slice(),
            intake: Intake::new(senders, settings.window, settings.allowed_uids, BUF_SIZE),
            mirror,
            metrics,
            batch_rows: settings.batch_rows,
            flush_interval: settings.flush_interval,
            handoff,
            current: Some(Batch::default()),
            spare: None,
            reject_log: Throttle::default(),
            lost_log: Throttle::default(),
            mirror_log: Throttle::default(),
            recv_log: Throttle::default(),
            reply_log: Throttle::default(),
        }
    }

    /// Receives until `stop` completes, then fences the socket, drains what is queued (if
    /// the socket is ours to drain), hands over the last batch and acknowledges every batch
    /// the writer commits until it is done.
    pub async fn run(mut self, stop: impl Future<Output = ()>) -> Result<(), WriterGone> {
        let mut stop = pin!(stop);
        loop {
            match self.next_event(stop.as_mut()).await {
                Event::Stop => break,
                Event::Due => self.hand_over()?,
                Event::Committed(batch) => self.committed(batch.ok_or(WriterGone)?),
                Event::Received(Ok(Some(datagram))) => self.take(datagram)?,
                Event::Received(Ok(None)) => {}
                Event::Received(Err(e)) => {
                    if let Some(held) = self.recv_log.allow() {
                        tracing::warn!("receiving: {e} ({held} more errors not logged)");
                    }
                    // Not a reason to stop; a pause keeps a persistent error from spinning.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
        self.inbox.fence();
        if self.inbox.drains_at_stop() {
            self.drain().await?;
        }
        if self.current.as_ref().is_some_and(|b| b.started().is_some()) {
            self.hand_over()?;
        }
        self.acknowledge_the_rest().await;
        Ok(())
    }

    async fn next_event(&mut self, stop: std::pin::Pin<&mut impl Future<Output = ()>>) -> Event {
        let due = self
            .current
            .as_ref()
            .and_then(Batch::started)
            .map(|t| t + self.flush_interval);
        // Both batches with the writer: read nothing until one comes back.
        let reading = self.current.is_some();
        tokio::select! {
            biased;
            () = stop => Event::Stop,
            batch = self.handoff.empty.recv(), if self.spare.is_none() => Event::Committed(batch),
            () = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => Event::Due,
            r = self.inbox.recv(&mut self.buf), if reading => Event::Received(r),
        }
    }

    /// Reads what is queued on the fenced socket until it is empty.
    async fn drain(&mut self) -> Result<(), WriterGone> {
        let mut drained = 0u64;
        loop {
            if self.current.is_none() {
                let batch = self.handoff.empty.recv().await.ok_or(WriterGone)?;
                self.committed(batch);
            }
            match self.inbox.try_recv(&mut self.buf) {
                Ok(Some(datagram)) => {
                    drained += 1;
                    self.take(datagram)?;
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!("draining the socket: {e}; what is still queued stays unread");
                    break;
                }
            }
        }
        tracing::info!("read {drained} datagrams still queued at stop");
        Ok(())
    }

    /// After the last hand-over: acknowledges each batch the writer still commits, until it
    /// has committed them all and stopped.
    async fn acknowledge_the_rest(mut self) {
        let Handoff { full, mut empty } = self.handoff;
        // Closing the full end lets the writer stop once it has handed back what it holds.
        drop(full);
        while let Some(batch) = empty.recv().await {
            acknowledge(
                &self.inbox,
                self.intake.senders(),
                &batch,
                &mut self.reply_log,
                &self.metrics,
            );
        }
    }

    /// A batch back from the writer, committed: acknowledges its senders, then keeps it,
    /// emptied, to fill next.
    fn committed(&mut self, mut batch: Batch) {
        acknowledge(
            &self.inbox,
            self.intake.senders(),
            &batch,
            &mut self.reply_log,
            &self.metrics,
        );
        batch.clear();
        match self.current {
            None => self.current = Some(batch),
            Some(_) => self.spare = Some(batch),
        }
    }

    /// Handles one datagram in the buffer; hands the batch over if it is full.
    fn take(&mut self, datagram: Datagram) -> Result<(), WriterGone> {
        self.metrics.datagrams_received.inc();
        let bytes = &self.buf[..datagram.len];
        if let Some(mirror) = &self.mirror {
            forward(mirror, bytes, &self.metrics, &mut self.mirror_log);
        }
        let batch = self
            .current
            .as_mut()
            .expect("take runs only with a batch to fill");
        let (now, now_us) = (Instant::now(), shared::now_us());
        let (outcome, reply) = self.intake.take(bytes, &datagram, batch, now, now_us);
        let full = batch.received() >= self.batch_rows;
        if let Some(reply) = reply {
            send_reply(&self.inbox, reply, &mut self.reply_log, &self.metrics);
        }
        self.count(outcome);
        if full {
            self.hand_over()?;
        }
        Ok(())
    }

    /// The metrics and log lines of one datagram's outcome.
    fn count(&mut self, outcome: Outcome) {
        let m = &self.metrics;
        match outcome {
            Outcome::Rejected(why) => self.reject(&why),
            Outcome::Duplicate => m.datagrams_duplicate.inc(),
            Outcome::Ahead => m.datagrams_out_of_order.inc(),
            Outcome::Accepted {
                sender,
                seq,
                clicks,
                lost,
                evicted,
            } => {
                m.clicks_received.add(clicks as u64);
                m.pending_clicks.add(clicks as i64);
                m.senders_evicted.add(evicted as u64);
                m.senders.set(self.intake.senders().len() as i64);
                if lost > 0 {
                    m.datagrams_lost.add(lost);
                    if let Some(held) = self.lost_log.allow() {
                        tracing::warn!(
                            "sender {sender:016x}: {lost} datagrams lost before seq {seq} ({held} \
                             more gaps not logged)"
                        );
                    }
                }
            }
        }
    }

    /// Counts a rejected datagram; `why` is formatted only when the line is logged.
    fn reject(&mut self, why: &Why) {
        let reason = why.reason();
        self.metrics.datagrams_rejected.inc(reason);
        if let Some(held) = self.reject_log.allow() {
            tracing::warn!(
                "rejected a datagram ({reason}): {why} ({held} more rejects not logged)"
            );
        }
    }

    /// Sends the current batch to the writer and goes on with the spare one, if it is back.
    fn hand_over(&mut self) -> Result<(), WriterGone> {
        let Some(batch) = self.current.take() else {
            return Ok(());
        };
        // Only two batches exist and the channel holds two: it never is full.
        self.handoff.full.try_send(batch).map_err(|_| WriterGone)?;
        self.current = self.spare.take();
        Ok(())
    }
}

/// Tells every sender of a committed batch what is committed.
fn acknowledge(
    inbox: &Inbox,
    senders: &mut Senders,
    batch: &Batch,
    log: &mut Throttle,
    metrics: &Metrics,
) {
    let now = Instant::now();
    for (sender, seq) in batch.senders() {
        if let Some(reply) = senders.commit(sender, seq, now) {
            send_reply(inbox, reply, log, metrics);
        }
    }
}

/// Sends an acknowledgement or a resend request, never waiting; counts what was not sent.
fn send_reply(inbox: &Inbox, reply: Reply, log: &mut Throttle, metrics: &Metrics) {
    match inbox.send_to(&reply.ack.encode(), &reply.to) {
        Ok(()) if reply.ack.resend_from.is_some() => metrics.resend_requests.inc(),
        Ok(()) => metrics.acks_sent.inc(),
        Err(e) => {
            metrics.acks_failed.inc();
            if let Some(held) = log.allow() {
                tracing::warn!(
                    "acknowledging sender {:016x} at {}: {e} ({held} more failures not logged)",
                    reply.ack.sender,
                    reply.to
                );
            }
        }
    }
}

/// Forwards a datagram to `--mirror`, never waiting; counts what was not forwarded.
fn forward(mirror: &Mirror, bytes: &[u8], metrics: &Metrics, log: &mut Throttle) {
    match mirror.forward(bytes) {
        Ok(()) => metrics.mirror_sent.inc(),
        Err(e) => {
            metrics.mirror_failed.inc();
            if let Some(held) = log.allow() {
                tracing::warn!("mirror: {e} ({held} more failures not logged)");
            }
        }
    }
}
