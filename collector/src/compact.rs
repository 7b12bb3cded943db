//! Folding click_count_deltas into click_counts, on a connection of its own, so the batch
//! path only appends and each (code, day) key is upserted once per interval.

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

/// Bookkeeping rows nobody has touched for 30 days: a redirector's seq row (one per process
/// start) and a collector's batch-number row (one per process start). Without this both tables
/// grow with every restart. A sender idle that long that comes back after a collector restart
/// is only counted as a gap; its clicks are still written.
const PRUNE: &str = "
    SELECT prune_link_changes(interval '1 day');
    DELETE FROM click_senders WHERE updated_at < now() - interval '30 days';
    DELETE FROM click_writers WHERE updated_at < now() - interval '30 days';";

/// Delta rows waiting to be folded, for the gauge's starting value.
pub async fn pending(client: &Client) -> Result<i64, tokio_postgres::Error> {
    let row = client
        .query_one("SELECT count(*) FROM click_count_deltas", &[])
        .await?;
    Ok(row.get(0))
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
            Ok(moved) => {
                let took = started.elapsed();
                metrics.compactions.inc();
                metrics.compaction_seconds.observe(took);
                tracing::debug!("folded {moved} delta rows in {took:?}");
                metrics.deltas_pending.add(-moved);
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

/// One compaction on `conn`, opened first if needed, and the pruning of idle bookkeeping rows.
async fn compact(db: &Db, conn: &mut Option<Client>) -> Result<i64, tokio_postgres::Error> {
    let client = match conn {
        Some(client) => client,
        slot => slot.insert(db.connect().await?),
    };
    let moved = client.query_one(COMPACT, &[]).await?.get(0);
    client.batch_execute(PRUNE).await?;
    Ok(moved)
}
