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

use tokio::time::Instant;

use crate::ingest::intake::Intake;
use crate::ingest::mirror::Mirror;
use crate::ingest::replies::Replies;
use crate::ingest::senders::{Reply, Senders};
use crate::ingest::socket::{Datagram, Inbox};
use crate::ingest::Metrics;
use crate::metrics::Shared;
use crate::write::batch::{Batch, DateWindow, Handoff};

mod events;
use events::Events;

/// Larger than any valid datagram (60 KiB), so a larger one is seen as truncated.
const BUF_SIZE: usize = 64 * 1024;

/// The writer stopped taking batches (it only does if it panicked).
#[derive(Debug, thiserror::Error)]
#[error("the database writer stopped; cannot write further batches")]
pub struct WriterGone;

pub(crate) struct Receiver {
    inbox: Inbox,
    /// Acknowledgements and resend requests leave from a socket per peer.
    replies: Replies,
    buf: Box<[u8]>,
    intake: Intake,
    mirror: Option<Mirror>,
    events: Events,
    batch_rows: usize,
    flush_interval: Duration,
    handoff: Handoff,
    /// The batch being filled; `None` while both are with the writer.
    current: Option<Batch>,
    /// A committed batch back from the writer, emptied, while another fills.
    spare: Option<Batch>,
}

/// What woke the loop.
enum Event {
    Stop,
    Due,
    /// Boxed: a batch is the largest thing the loop is woken with, by far.
    Committed(Option<Box<Batch>>),
    Received(io::Result<Option<Datagram>>),
}

/// When a batch is handed to the writer: at `batch_rows` clicks, at [`super::SENDERS_PER_BATCH`]
/// senders, or `flush_interval` after its first datagram, whichever comes first.
pub(crate) struct Settings {
    pub(crate) batch_rows: usize,
    pub(crate) flush_interval: Duration,
    /// Clicks dated outside it are set aside, not written into `clicks`.
    pub(crate) window: DateWindow,
    /// `--allow-uid`: datagrams of any other uid are rejected.
    pub(crate) allowed_uids: Option<Vec<u32>>,
}

impl Receiver {
    pub(crate) fn new(
        inbox: Inbox,
        senders: Senders,
        mirror: Option<Mirror>,
        metrics: Arc<Metrics>,
        shared: Arc<Shared>,
        settings: Settings,
        handoff: Handoff,
    ) -> Receiver {
        Receiver {
            inbox,
            replies: Replies::default(),
            buf: vec![0; BUF_SIZE].into_boxed_slice(),
            intake: Intake::new(senders, settings.window, settings.allowed_uids, BUF_SIZE),
            mirror,
            events: Events::new(metrics, shared),
            batch_rows: settings.batch_rows,
            flush_interval: settings.flush_interval,
            handoff,
            current: Some(Batch::default()),
            spare: None,
        }
    }

    /// Receives until `stop` completes, then fences the socket, drains what is queued (if
    /// the socket is ours to drain), hands over the last batch and acknowledges every batch
    /// the writer commits until it is done.
    pub(crate) async fn run(mut self, stop: impl Future<Output = ()>) -> Result<(), WriterGone> {
        let mut stop = pin!(stop);
        loop {
            match self.next_event(stop.as_mut()).await {
                Event::Stop => break,
                Event::Due => self.hand_over()?,
                Event::Committed(batch) => self.committed(*batch.ok_or(WriterGone)?),
                Event::Received(Ok(Some(datagram))) => self.take(datagram)?,
                Event::Received(Ok(None)) => {}
                Event::Received(Err(e)) => {
                    self.events.receive_failed(&e);
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
            batch = self.handoff.empty.recv(), if self.spare.is_none() => {
                Event::Committed(batch.map(Box::new))
            }
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
                    tracing::warn!(
                        error = %e,
                        "draining the socket: {e}; what is still queued stays unread"
                    );
                    break;
                }
            }
        }
        tracing::info!(drained, "read {drained} datagrams still queued at stop");
        Ok(())
    }

    /// After the last hand-over: acknowledges each batch the writer still commits, until it
    /// has committed them all and stopped.
    async fn acknowledge_the_rest(mut self) {
        // Closing the full end lets the writer stop once it has handed back what it holds.
        let (closed, _) = tokio::sync::mpsc::channel(1);
        drop(std::mem::replace(&mut self.handoff.full, closed));
        while let Some(batch) = self.handoff.empty.recv().await {
            self.acknowledge(&batch);
        }
    }

    /// A batch back from the writer, committed: acknowledges its senders, then keeps it,
    /// emptied, to fill next.
    fn committed(&mut self, mut batch: Batch) {
        self.acknowledge(&batch);
        batch.clear();
        match self.current {
            None => {
                // It reads again: what queued meanwhile is not judged yet.
                self.intake.senders().resumed(std::time::Instant::now());
                self.current = Some(batch);
            }
            Some(_) => self.spare = Some(batch),
        }
    }

    /// Handles one datagram in the buffer; hands the batch over if it is full.
    fn take(&mut self, datagram: Datagram) -> Result<(), WriterGone> {
        self.events.received();
        let bytes = &self.buf[..datagram.len];
        if let Some(mirror) = &self.mirror {
            self.events.mirrored(mirror.forward(bytes));
        }
        let batch = self
            .current
            .as_mut()
            .expect("take runs only with a batch to fill");
        let (now, now_us) = (std::time::Instant::now(), protocol::now_us());
        let (outcome, reply) = self.intake.take(bytes, &datagram, batch, now, now_us);
        let full =
            batch.received() >= self.batch_rows || batch.senders_len() >= super::SENDERS_PER_BATCH;
        if let Some(reply) = reply {
            self.reply(&reply, now);
        }
        self.events.outcome(outcome, self.intake.senders().len());
        if full {
            self.hand_over()?;
        }
        Ok(())
    }

    /// Sends the current batch to the writer and goes on with the spare one, if it is back.
    fn hand_over(&mut self) -> Result<(), WriterGone> {
        let Some(mut batch) = self.current.take() else {
            return Ok(());
        };
        let senders = self.intake.senders();
        batch.forget_only(|id| !senders.knows(id));
        // Only two batches exist and the channel holds two: it never is full.
        self.handoff.full.try_send(batch).map_err(|_| WriterGone)?;
        self.current = self.spare.take();
        Ok(())
    }
}

impl Receiver {
    /// Tells every sender of a committed batch what is committed.
    fn acknowledge(&mut self, batch: &Batch) {
        self.events.committed(batch.passed_over());
        let now = std::time::Instant::now();
        for (sender, seq) in batch.senders() {
            if let Some(reply) = self.intake.senders().commit(sender, seq, now) {
                self.reply(&reply, now);
            }
        }
    }

    /// Sends an acknowledgement or a resend request, never waiting; notes whether an
    /// acknowledgement reached its sender's socket.
    fn reply(&mut self, reply: &Reply, now: std::time::Instant) {
        let sent = self.replies.send(&self.inbox, reply, now);
        if reply.ack.resend_from.is_none() {
            let senders = self.intake.senders();
            senders.acknowledged(reply.ack.sender, sent.is_ok());
        }
        self.events.replied(reply, sent);
    }
}
