//! The periodic tasks, each on a connection of its own (`maintenance`): the fold of the
//! per-batch counts and the pruning after it (`compact`, from the sums the writer keeps in
//! `write::unfolded`), the modes of the triggers on `links` (`link_triggers`), and the daily
//! partitions of `clicks` (`partitions`).

pub mod compact;
pub(crate) mod link_triggers;
pub mod maintenance;
pub(crate) mod partitions;

use std::future::Future;
use std::time::Instant;

use shared::metrics::{Counter, Gauge, Histogram};

shared::metrics! {
    /// What the periodic tasks count: partitions, folds and what waits for one.
    pub struct Metrics {
        partitions_created: Counter = "partitions_created",
            "Daily partitions of clicks created ahead.";
        partitions_dropped: Counter = "partitions_dropped",
            "Partitions of clicks dropped for being older than --retention.";
        partitions_deferred: Counter = "partitions_deferred",
            "Rounds of the partitions task whose creation of partitions ahead gave up waiting \
             for its lock on clicks (another session attaches, detaches or analyzes clicks): \
             tried again next round.";
        partitions_blocked: Gauge = "partitions_blocked",
            "Days from the window's first to two past its last whose partition's name is held by \
             a table that is not a partition of clicks (one detached and kept, or made by hand): \
             no partition can be created for them, and their clicks wait until it is renamed.";
        compactions: Counter = "compactions", "Folds of the per-batch counts into click_counts.";
        compaction_seconds: Histogram = "compaction_seconds", "Time one fold took.";
        deltas_pending: Gauge = "deltas_pending",
            "Per-batch counts (code, day, clicks) not folded into click_counts yet.";
        deltas_oldest_seconds: Gauge = "deltas_oldest_seconds",
            "How long the oldest count not folded yet has waited.";
        breakdowns_pending: Gauge = "breakdowns_pending",
            "Per-batch breakdown entries (code, day, dimension, value, clicks) not folded into \
             click_breakdown_counts yet.";
        breakdowns_oldest_seconds: Gauge = "breakdowns_oldest_seconds",
            "How long the oldest breakdown entry not folded yet has waited.";
        unfolded_bytes: Gauge = "unfolded_bytes",
            "Estimated memory of this collector's sums of unfolded counts, a fold's under way \
             included; a fold is due at half of --compact-memory.";
        link_trigger_modes_set_back: Counter = "link_trigger_modes_set_back",
            "Triggers on links found firing in the wrong sessions (ALTER TABLE links ENABLE \
             TRIGGER ALL resets them) and set back, with the TRUNCATE epoch bumped so that every \
             redirector loads links in full.";
        link_triggers_off: Gauge = "link_triggers_off",
            "Triggers on links of migration 21 disabled, missing, or in another mode that could \
             not be set back, at the latest look (at start and after each pruning): what they \
             log or announce goes unseen by the redirectors.";
        link_trigger_checks_failed: Counter = "link_trigger_checks_failed",
            "Looks at the modes of the triggers on links that failed (a lock not had in time, \
             a role that does not own links): tried again after the next pruning.";
        unfolded_dropped: Counter = "unfolded_dropped",
            "Times the sums of unfolded counts reached --compact-memory before a fold took \
             them: they were dropped, and their batches folded from their rows (the SQL way).";
    }
}

/// Deletes a backlog a slice at a time: runs `slice` (one statement that deletes at most a
/// slice, and says how many rows went and whether a whole slice did) until one finds less than
/// a whole slice or `until` has passed (then not even once). Each slice commits on its own, so
/// a backlog of millions of rows goes over several rounds, none of them failing or holding
/// anything up for long; what a slice deleted stays deleted, and is added to `deleted` (a
/// slice that fails after others leaves their count there).
pub(crate) async fn in_slices<F, Fut>(
    until: Instant,
    deleted: &mut u64,
    mut slice: F,
) -> Result<(), tokio_postgres::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(u64, bool), tokio_postgres::Error>>,
{
    let mut more = true;
    while more && Instant::now() < until {
        let (rows, whole) = slice().await?;
        *deleted += rows;
        more = whole;
    }
    Ok(())
}
