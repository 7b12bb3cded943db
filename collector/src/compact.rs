//! Folding click_count_deltas into click_counts, on a connection of its own, so the batch
//! path only appends and each (code, day) key is upserted once per interval.
//!
//! Every collector of a database runs this task; one folds at a time (a transaction-level
//! advisory lock taken with `try`), and the others skip that tick. The fold only deletes
//! deltas and upserts counts, neither of which a batch's transaction touches, so batch writes
//! of every collector go on while it runs.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Client;

use crate::db::{timed, Db};
use crate::metrics::Metrics;

/// One statement: moves every committed delta, sums per key, upserts in key order (so two
/// compactions never deadlock), and returns how many delta rows it moved.
const COMPACT: &str = "
    WITH moved AS (DELETE FROM click_count_deltas RETURNING code, day, clicks),
    folded AS (
        INSERT INTO click_counts (code, day, clicks)
        SELECT code, day, sum(clicks) FROM moved GROUP BY code, day ORDER BY code, day
        ON CONFLICT (code, day) DO UPDATE SET clicks = click_counts.clicks + EXCLUDED.clicks)
    SELECT count(*) FROM moved";

/// Held for the fold's transaction, so one collector folds at a time; the others skip the
/// tick instead of waiting (or deadlocking) on rows another fold is moving. A fixed key, not
/// the migrations' and not any instance lock's ("compact" in ASCII).
const TRY_FOLD_LOCK: &str = "SELECT pg_try_advisory_xact_lock(27988538521903988)";

/// Bookkeeping rows nobody has touched for 30 days: a redirector's seq row (one per process
/// start) and a collector's batch-number row (one per process start). Without this both tables
/// grow with every restart. A sender idle that long that comes back after a collector restart
/// is only counted as a gap; its clicks are still written.
const PRUNE: &str = "
    DELETE FROM click_senders WHERE updated_at < now() - interval '30 days';
    DELETE FROM click_writers WHERE updated_at < now() - interval '30 days';";

/// Delta rows waiting to be folded, whichever collector wrote them: the gauge's value.
pub async fn pending(client: &Client) -> Result<i64, tokio_postgres::Error> {
    let row = client
        .query_one("SELECT count(*) FROM click_count_deltas", &[])
        .await?;
    Ok(row.get(0))
}

/// What one tick did.
struct Tick {
    /// Delta rows this collector folded; `None` if another collector was folding.
    moved: Option<i64>,
    /// Delta rows left to fold afterwards, whoever wrote them.
    pending: i64,
}

/// Compacts every `interval` until aborted; a failed compaction is logged, counted and tried
/// again at the next tick on a new connection.
pub async fn run(db: Db, interval: Duration, timeout: Duration, metrics: Arc<Metrics>) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut conn = None;
    let mut failing = false;
    loop {
        ticks.tick().await;
        let started = std::time::Instant::now();
        let failure = match timed(timeout, compact(&db, &mut conn)).await {
            Ok(tick) => {
                if let Some(moved) = tick.moved {
                    let took = started.elapsed();
                    metrics.compactions.inc();
                    metrics.compaction_seconds.observe(took);
                    tracing::debug!("folded {moved} delta rows in {took:?}");
                } else {
                    tracing::debug!("another collector is folding; skipped this tick");
                }
                metrics.deltas_pending.set(tick.pending);
                metrics.db_reachable.store(true, Relaxed);
                if std::mem::take(&mut failing) {
                    tracing::info!("compacting click_count_deltas works again");
                }
                continue;
            }
            Err(failure) => failure,
        };
        conn = None;
        metrics.db_errors.inc();
        metrics.db_reachable.store(false, Relaxed);
        // One warning per outage; each tick's retry would repeat it.
        if !std::mem::replace(&mut failing, true) {
            tracing::warn!("compacting click_count_deltas: {failure}; retrying every {interval:?}");
        } else {
            tracing::debug!("compacting click_count_deltas: {failure}");
        }
    }
}

/// One compaction on `conn`, opened first if needed, and the pruning of idle bookkeeping
/// rows, in one transaction, unless another collector is folding; then the deltas left.
async fn compact(db: &Db, conn: &mut Option<Client>) -> Result<Tick, tokio_postgres::Error> {
    let client = match conn {
        Some(client) => client,
        slot => slot.insert(db.connect().await?),
    };
    let tx = client.transaction().await?;
    let moved = if tx.query_one(TRY_FOLD_LOCK, &[]).await?.get::<_, bool>(0) {
        let moved = tx.query_one(COMPACT, &[]).await?.get(0);
        tx.batch_execute(PRUNE).await?;
        Some(moved)
    } else {
        None
    };
    tx.commit().await?;
    // Every collector's gauge tells the database's backlog, whichever of them folds.
    let pending = pending(client).await?;
    Ok(Tick { moved, pending })
}
