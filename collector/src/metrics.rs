//! The collector's counters, its health, and their rendering for the admin listener.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::intake::REJECT_REASONS;
use shared::metrics::{Counter, Gauge, Histogram, LabeledCounter, Text};

use crate::batch::SetAside;

/// `SetAside::as_str` of each reason, for the label values.
const SET_ASIDE_REASONS: [&str; SetAside::ALL.len()] = ["too_old", "too_new", "refused"];

#[derive(Debug)]
pub struct Metrics {
    pub datagrams_received: Counter,
    pub datagrams_rejected: LabeledCounter,
    /// Sender ids known, and those forgotten (idle, or past the bounds).
    pub senders: Gauge,
    pub senders_evicted: Counter,
    pub datagrams_duplicate: Counter,
    pub datagrams_lost: Counter,
    pub datagrams_out_of_order: Counter,
    pub acks_sent: Counter,
    pub acks_failed: Counter,
    pub resend_requests: Counter,
    pub clicks_received: Counter,
    pub clicks_written: Counter,
    /// Clicks not written into clicks but set aside, by reason.
    pub clicks_set_aside: LabeledCounter,
    pub partitions_created: Counter,
    pub partitions_dropped: Counter,
    pub batches: Counter,
    pub batch_seconds: Histogram,
    /// Per click: its commit time minus its click time.
    pub commit_lag: Histogram,
    pub db_errors: Counter,
    /// Clicks accepted but not committed yet.
    pub pending_clicks: Gauge,
    pub compactions: Counter,
    pub compaction_seconds: Histogram,
    /// Counts (code, day, clicks) not folded into click_counts yet, whoever wrote them.
    pub deltas_pending: Gauge,
    /// How long the oldest of them has waited, in seconds.
    pub deltas_oldest_seconds: Gauge,
    pub mirror_sent: Counter,
    pub mirror_failed: Counter,
    /// The socket is open and the database was reached at start.
    pub started: AtomicBool,
    /// The writer's last attempt reached the database.
    pub db_reachable: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            datagrams_received: Counter::default(),
            datagrams_rejected: LabeledCounter::new(&REJECT_REASONS),
            senders: Gauge::default(),
            senders_evicted: Counter::default(),
            datagrams_duplicate: Counter::default(),
            datagrams_lost: Counter::default(),
            datagrams_out_of_order: Counter::default(),
            acks_sent: Counter::default(),
            acks_failed: Counter::default(),
            resend_requests: Counter::default(),
            clicks_received: Counter::default(),
            clicks_written: Counter::default(),
            clicks_set_aside: LabeledCounter::new(&SET_ASIDE_REASONS),
            partitions_created: Counter::default(),
            partitions_dropped: Counter::default(),
            batches: Counter::default(),
            batch_seconds: Histogram::default(),
            commit_lag: Histogram::default(),
            db_errors: Counter::default(),
            pending_clicks: Gauge::default(),
            compactions: Counter::default(),
            compaction_seconds: Histogram::default(),
            deltas_pending: Gauge::default(),
            deltas_oldest_seconds: Gauge::default(),
            mirror_sent: Counter::default(),
            mirror_failed: Counter::default(),
            started: AtomicBool::new(false),
            db_reachable: AtomicBool::new(false),
        }
    }
}

impl shared::admin::Admin for Metrics {
    fn metrics(&self) -> String {
        Text::default()
            .counter(
                "collector_datagrams_received_total",
                "Datagrams received, valid or not.",
                self.datagrams_received.get(),
            )
            .labeled(
                "collector_datagrams_rejected_total",
                "Datagrams rejected whole, by reason.",
                "reason",
                &self.datagrams_rejected,
            )
            .gauge(
                "collector_senders",
                "Sender ids known (each redirector process has one).",
                self.senders.get(),
            )
            .counter(
                "collector_senders_evicted_total",
                "Sender ids forgotten: idle for a day, or past the bounds of a flood of fresh ids.",
                self.senders_evicted.get(),
            )
            .counter(
                "collector_datagrams_duplicate_total",
                "Datagrams skipped because their sender's seq was already accepted.",
                self.datagrams_duplicate.get(),
            )
            .counter(
                "collector_datagrams_lost_total",
                "Datagrams missing from gaps in a sender's seq.",
                self.datagrams_lost.get(),
            )
            .counter(
                "collector_datagrams_out_of_order_total",
                "Datagrams of a sender that expects acknowledgements, past the seq awaited: not \
                 accepted; the sender resends from the missing one.",
                self.datagrams_out_of_order.get(),
            )
            .counter(
                "collector_acks_sent_total",
                "Acknowledgements sent: a sender's datagrams up to a seq are committed.",
                self.acks_sent.get(),
            )
            .counter(
                "collector_resend_requests_total",
                "Requests to a sender to resend from the datagram awaited.",
                self.resend_requests.get(),
            )
            .counter(
                "collector_acks_failed_total",
                "Acknowledgements and resend requests the socket did not take (the sender gone, \
                 or the send buffer full); the next one covers them.",
                self.acks_failed.get(),
            )
            .counter(
                "collector_clicks_received_total",
                "Clicks accepted into a batch.",
                self.clicks_received.get(),
            )
            .counter(
                "collector_clicks_written_total",
                "Clicks committed to PostgreSQL.",
                self.clicks_written.get(),
            )
            .labeled(
                "collector_clicks_set_aside_total",
                "Clicks not written into clicks but into clicks_set_aside, by reason.",
                "reason",
                &self.clicks_set_aside,
            )
            .counter(
                "collector_partitions_created_total",
                "Daily partitions of clicks created ahead.",
                self.partitions_created.get(),
            )
            .counter(
                "collector_partitions_dropped_total",
                "Partitions of clicks dropped for being older than --retention.",
                self.partitions_dropped.get(),
            )
            .counter(
                "collector_batches_total",
                "Batches committed.",
                self.batches.get(),
            )
            .histogram(
                "collector_batch_seconds",
                "Time to write one batch, retries included.",
                &self.batch_seconds,
            )
            .histogram(
                "collector_commit_lag_seconds",
                "Per click committed: commit time minus click time (the redirector's clock).",
                &self.commit_lag,
            )
            .counter(
                "collector_db_errors_total",
                "Failed database attempts (connect, write, compaction).",
                self.db_errors.get(),
            )
            .gauge(
                "collector_pending_clicks",
                "Clicks accepted and not committed yet.",
                self.pending_clicks.get(),
            )
            .counter(
                "collector_compactions_total",
                "Folds of the per-batch counts into click_counts.",
                self.compactions.get(),
            )
            .histogram(
                "collector_compaction_seconds",
                "Time one fold took.",
                &self.compaction_seconds,
            )
            .gauge(
                "collector_deltas_pending",
                "Per-batch counts (code, day, clicks) not folded into click_counts yet.",
                self.deltas_pending.get(),
            )
            .gauge(
                "collector_deltas_oldest_seconds",
                "How long the oldest count not folded yet has waited.",
                self.deltas_oldest_seconds.get(),
            )
            .counter(
                "collector_mirror_sent_total",
                "Datagrams forwarded to the mirror socket.",
                self.mirror_sent.get(),
            )
            .counter(
                "collector_mirror_failed_total",
                "Datagrams the mirror socket did not take.",
                self.mirror_failed.get(),
            )
            .finish()
    }

    fn health(&self) -> Result<(), String> {
        if !self.started.load(Relaxed) {
            return Err("starting: socket or database not ready".into());
        }
        if !self.db_reachable.load(Relaxed) {
            return Err("the database is unreachable; batches are kept and retried".into());
        }
        Ok(())
    }
}
