//! The collector's metrics, each declared once; its health; and what the admin listener serves.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use protocol::RejectReason;
use shared::metrics::{Counter, Gauge, Histogram, LabeledCounter};

shared::label! {
    /// Why a click was set aside (`clicks_set_aside.reason`, and the metrics label).
    pub(crate) enum SetAside: "reason" {
        TooOld = "too_old",
        TooNew = "too_new",
        /// PostgreSQL refused its row for good (a data or constraint error); `write::store`
        /// finds it.
        Refused = "refused",
    }
}

shared::label! {
    /// What a sender's resync did.
    pub(crate) enum Resync: "outcome" {
        /// The record of the sender was behind: the gap was skipped and counted.
        Skipped = "skipped",
        /// The record was not behind (a repeated resync): nothing changed.
        Stale = "stale",
        /// It answered no resend request of this collector's (one in flight across a restart,
        /// or a forger's): ignored.
        Unasked = "unasked",
    }
}

shared::metrics! {
    pub struct Metrics, prefix "collector" {
        datagrams_received: Counter = "datagrams_received", "Datagrams received, valid or not.";
        datagrams_rejected: LabeledCounter<RejectReason> = "datagrams_rejected",
            "Datagrams rejected whole, by reason.";
        senders: Gauge = "senders", "Sender ids known (each redirector process has one).";
        senders_evicted: Counter = "senders_evicted",
            "Sender ids forgotten: idle for a day, or past the bounds of a flood of fresh ids.";
        datagrams_duplicate: Counter = "datagrams_duplicate",
            "Datagrams skipped because their sender's seq was already accepted.";
        datagrams_lost: Counter = "datagrams_lost",
            "Datagrams missing from gaps in a sender's seq.";
        datagrams_out_of_order: Counter = "datagrams_out_of_order",
            "Datagrams of a sender that expects acknowledgements, past the seq awaited: not \
             accepted; the sender resends from the missing one.";
        acks_sent: Counter = "acks_sent",
            "Acknowledgements sent: a sender's datagrams up to a seq are committed.";
        resend_requests: Counter = "resend_requests",
            "Requests to a sender to resend from the datagram awaited.";
        acks_failed: Counter = "acks_failed",
            "Acknowledgements and resend requests the socket did not take (the sender gone, \
             or the send buffer full); the next one covers them.";
        resyncs: LabeledCounter<Resync> = "resyncs",
            "Resyncs from senders asked for seqs they no longer hold, by outcome.";
        clicks_unaccounted: Counter = "clicks_unaccounted",
            "Clicks of datagrams a resync skipped: acknowledged to their sender once, and not in \
             this collector's record (committed before click_senders lost them, or lost with it).";
        clicks_received: Counter = "clicks_received", "Clicks accepted into a batch.";
        clicks_written: Counter = "clicks_written", "Clicks committed to PostgreSQL.";
        clicks_set_aside: LabeledCounter<SetAside> = "clicks_set_aside",
            "Clicks not written into clicks but into clicks_set_aside, by reason.";
        partitions_created: Counter = "partitions_created",
            "Daily partitions of clicks created ahead.";
        partitions_dropped: Counter = "partitions_dropped",
            "Partitions of clicks dropped for being older than --retention.";
        batches: Counter = "batches", "Batches committed.";
        batch_seconds: Histogram = "batch_seconds", "Time to write one batch, retries included.";
        commit_lag: Histogram = "commit_lag_seconds",
            "Per click committed: commit time minus click time (the redirector's clock).";
        db_errors: Counter = "db_errors", "Failed database attempts (connect, write, compaction, partitions).";
        pending_clicks: Gauge = "pending_clicks", "Clicks accepted and not committed yet.";
        compactions: Counter = "compactions", "Folds of the per-batch counts into click_counts.";
        compaction_seconds: Histogram = "compaction_seconds", "Time one fold took.";
        deltas_pending: Gauge = "deltas_pending",
            "Per-batch counts (code, day, clicks) not folded into click_counts yet.";
        deltas_oldest_seconds: Gauge = "deltas_oldest_seconds",
            "How long the oldest count not folded yet has waited.";
        mirror_sent: Counter = "mirror_sent", "Datagrams forwarded to the mirror socket.";
        mirror_failed: Counter = "mirror_failed", "Datagrams the mirror socket did not take.";
        admin_connections_closed: LabeledCounter<shared::admin::Closed> =
            "admin_connections_closed",
            "Admin listener connections it closed itself to stay within its bound, by reason.";
    }
}

/// What `/healthz` judges by; not exposed as metrics.
#[derive(Debug, Default)]
pub struct Health {
    /// The socket is open and the database was reached at start.
    pub(crate) started: AtomicBool,
    /// The writer's or the maintenance task's last attempt reached the database.
    pub db_reachable: AtomicBool,
}

impl Health {
    pub(crate) fn check(&self) -> Result<(), String> {
        if !self.started.load(Relaxed) {
            return Err("starting: socket or database not ready".into());
        }
        if !self.db_reachable.load(Relaxed) {
            return Err("the database is unreachable; batches are kept and retried".into());
        }
        Ok(())
    }
}

/// What `/metrics` and `/healthz` read.
pub(crate) struct AdminView {
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) health: Arc<Health>,
}

impl shared::admin::Admin for AdminView {
    fn metrics(&self) -> String {
        self.metrics.encode()
    }

    fn health(&self) -> Result<(), String> {
        self.health.check()
    }

    fn connection_closed(&self, why: shared::admin::Closed) {
        self.metrics.admin_connections_closed.inc(why);
    }
}
