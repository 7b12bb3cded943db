//! What the receive loop reports: one method per event, each with its metrics and its
//! throttled log line, so that the loop itself reads as I/O and hand-overs only (as Vector's
//! sources emit internal events).

use std::io;
use std::sync::Arc;

use shared::throttle::Throttle;

use crate::ingest::intake::{Outcome, Taken, Why};
use crate::ingest::senders::Reply;
use crate::ingest::{Metrics, Resync};
use crate::metrics::Shared;
use crate::write::batch::PassedOver;

pub(crate) struct Events {
    metrics: Arc<Metrics>,
    shared: Arc<Shared>,
    reject_log: Throttle,
    lost_log: Throttle,
    mirror_log: Throttle,
    recv_log: Throttle,
    reply_log: Throttle,
    resync_log: Throttle,
    passed_log: Throttle,
}

impl Events {
    pub(crate) fn new(metrics: Arc<Metrics>, shared: Arc<Shared>) -> Events {
        Events {
            metrics,
            shared,
            reject_log: Throttle::default(),
            lost_log: Throttle::default(),
            mirror_log: Throttle::default(),
            recv_log: Throttle::default(),
            reply_log: Throttle::default(),
            resync_log: Throttle::default(),
            passed_log: Throttle::default(),
        }
    }

    /// A batch was committed: the clicks its sender records pass over are lost for good.
    pub(crate) fn committed(&self, passed_over: PassedOver) {
        self.metrics.clicks_rejected.inc_by(passed_over.rejected);
        let unaccounted = &self.shared.counts.clicks_unaccounted;
        unaccounted.inc_by(passed_over.unaccounted);
    }

    /// A datagram was read from the socket.
    pub(crate) fn received(&self) {
        self.metrics.datagrams_received.inc();
    }

    /// Reading the socket failed: not a reason to stop.
    pub(crate) fn receive_failed(&mut self, e: &io::Error) {
        self.metrics.receive_errors.inc();
        if let Some(held) = self.recv_log.allow() {
            tracing::warn!(error = %e, held, "receiving: {e} ({held} more errors not logged)");
        }
    }

    /// A datagram went to `--mirror`, or did not.
    pub(crate) fn mirrored(&mut self, result: io::Result<()>) {
        match result {
            Ok(()) => {
                self.metrics.mirror_sent.inc();
            }
            Err(e) => {
                self.metrics.mirror_failed.inc();
                if let Some(held) = self.mirror_log.allow() {
                    tracing::warn!(error = %e, held, "mirror: {e} ({held} more failures not logged)");
                }
            }
        }
    }

    /// An acknowledgement or resend request was sent, or not.
    pub(crate) fn replied(&mut self, reply: &Reply, result: io::Result<()>) {
        let m = &self.metrics;
        match result {
            Ok(()) if reply.ack.resend_from.is_some() => {
                m.resend_requests.inc();
            }
            Ok(()) => {
                m.acks_sent.inc();
            }
            Err(e) => {
                m.acks_failed.inc();
                if let Some(held) = self.reply_log.allow() {
                    tracing::warn!(
                        sender = %format_args!("{:016x}", reply.ack.sender),
                        to = %reply.to,
                        error = %e,
                        held,
                        "acknowledging sender {:016x} at {}: {e} ({held} more failures not logged)",
                        reply.ack.sender,
                        reply.to
                    );
                }
            }
        }
    }

    /// What became of one datagram; `senders` is how many senders are known after it (set
    /// whatever the outcome: a sweep of idle senders runs at every datagram judged).
    pub(crate) fn outcome(&mut self, outcome: Outcome, senders: usize) {
        let m = &self.metrics;
        m.senders.set(senders as i64);
        match outcome {
            Outcome::Rejected(why) => self.rejected(&why),
            Outcome::PassedOver { taken, why, clicks } => {
                self.seq_accepted(taken);
                self.passed_over(&why, taken, clicks);
            }
            Outcome::Duplicate => {
                m.datagrams_duplicate.inc();
            }
            Outcome::Ahead => {
                m.datagrams_out_of_order.inc();
            }
            Outcome::StaleResync => {
                m.resyncs.inc(Resync::Stale);
            }
            Outcome::UnaskedResync => {
                m.resyncs.inc(Resync::Unasked);
            }
            Outcome::Resynced {
                sender,
                first,
                skipped,
                unaccounted,
                claimed,
                evicted,
            } => {
                m.resyncs.inc(Resync::Skipped);
                m.senders_evicted.inc_by(evicted as u64);
                // Throttled as the other events are: a peer can bring a resync of a fresh id
                // about at will (a datagram ahead, then the resync asked for).
                if let Some(held) = self.resync_log.allow() {
                    tracing::warn!(
                        sender = %format_args!("{sender:016x}"),
                        first,
                        skipped,
                        unaccounted,
                        held,
                        "sender {sender:016x} resynced: this collector's record of it was behind \
                         (click_senders lost or rolled back); going on from seq {first}, \
                         {skipped} datagrams of {unaccounted} clicks unaccounted for (committed \
                         before the record was lost, or lost with it); {held} more resyncs not \
                         logged"
                    );
                    if claimed > unaccounted {
                        tracing::warn!(
                            sender = %format_args!("{sender:016x}"),
                            claimed,
                            "sender {sender:016x} counts {claimed} clicks skipped, more than its \
                             {skipped} skipped datagrams can hold: the record's count of its \
                             clicks was short (a click_senders row from before migration 12 \
                             counts from 0), or the sender counts wrong; {unaccounted} counted"
                        );
                    }
                }
            }
            Outcome::Accepted { taken, clicks } => {
                m.clicks_received.inc_by(clicks as u64);
                self.shared.counts.pending_clicks.inc_by(clicks as i64);
                self.seq_accepted(taken);
            }
        }
    }

    /// A datagram's seq was `taken`.
    fn seq_accepted(&mut self, taken: Taken) {
        self.metrics.senders_evicted.inc_by(taken.evicted as u64);
        if taken.lost > 0 {
            self.lost(taken.sender, taken.seq, taken.lost);
        }
    }

    /// `sender`'s datagram at `seq`, rejected for `why`, was passed over: its `clicks` are lost.
    fn passed_over(&mut self, why: &Why, Taken { sender, seq, .. }: Taken, clicks: u64) {
        // Counted as rejected, and logged once, here; its clicks once committed (`committed`).
        self.metrics.datagrams_rejected.inc(why.reason());
        if let Some(held) = self.passed_log.allow() {
            tracing::error!(
                sender = %format_args!("{sender:016x}"),
                seq,
                clicks,
                held,
                "sender {sender:016x}: seq {seq} is rejected ({why}); passed over so that its \
                 sender goes on, its {clicks} clicks lost (clicks_rejected); {held} more not \
                 logged"
            );
        }
    }

    /// `lost` datagrams of `sender` were skipped before `seq`.
    fn lost(&mut self, sender: u64, seq: u64, lost: u64) {
        self.metrics.datagrams_lost.inc_by(lost);
        if let Some(held) = self.lost_log.allow() {
            tracing::warn!(
                sender = %format_args!("{sender:016x}"),
                seq,
                lost,
                "sender {sender:016x}: {lost} datagrams lost before seq {seq} ({held} more gaps \
                 not logged)"
            );
        }
    }

    /// A datagram was rejected; `why` is formatted only when the line is logged.
    fn rejected(&mut self, why: &Why) {
        let reason = why.reason();
        self.metrics.datagrams_rejected.inc(reason);
        let reason = reason.as_str();
        if let Some(held) = self.reject_log.allow() {
            tracing::warn!(
                reason,
                "rejected a datagram ({reason}): {why} ({held} more rejects not logged)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failed_read_is_counted_whether_or_not_it_is_logged() {
        let metrics = Arc::new(Metrics::register(&mut Default::default()));
        let mut events = Events::new(metrics.clone(), Arc::default());
        let e = io::Error::from_raw_os_error(libc::ENOMEM);
        for _ in 0..3 {
            events.receive_failed(&e);
        }
        assert_eq!(metrics.receive_errors.get(), 3);
    }
}
