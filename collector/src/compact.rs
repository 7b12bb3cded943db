//! Folding the per-batch counts into click_counts, on a connection of its own, so that the
//! batch path only appends and each (code, day) key is upserted once per fold, not per batch.
//!
//! What a fold costs is mostly one upsert per distinct key (a few microseconds each, HOT or
//! not), whatever the number of clicks behind it; so folds are spaced out: one when the
//! backlog reaches `--compact-backlog` counts, or when the oldest has waited
//! `--compact-interval`. `click_totals` is exact whatever the backlog (it adds the unfolded
//! counts); the backlog bounds what a reader of it has to add up.
//!
//! Every collector of a database runs this task; one folds at a time (a transaction-level
//! advisory lock taken with `try`), and the others skip that turn. The fold only deletes
//! batch counts and upserts click_counts, neither of which a batch's transaction touches, so
//! batch writes of every collector go on while it runs.

use std::time::Duration;

use tokio_postgres::Client;

/// One statement: moves every committed count, of both shapes (a batch's arrays, and the rows
/// of click_count_deltas that collectors before version 5 of the schema write), sums per key,
/// upserts in key order (so two folds never deadlock), and returns how many counts it moved.
const FOLD: &str = "
    WITH batches AS (DELETE FROM click_count_batches RETURNING day, codes, counts, entries),
    rows AS (DELETE FROM click_count_deltas RETURNING code, day, clicks),
    moved AS (
        SELECT u.code, b.day, u.clicks
        FROM batches AS b, unnest(b.codes, b.counts) AS u(code, clicks)
        UNION ALL
        SELECT code, day, clicks FROM rows),
    folded AS (
        INSERT INTO click_counts (code, day, clicks)
        SELECT code, day, sum(clicks) FROM moved GROUP BY code, day ORDER BY code, day
        ON CONFLICT (code, day) DO UPDATE SET clicks = click_counts.clicks + EXCLUDED.clicks)
    SELECT (SELECT coalesce(sum(entries), 0) FROM batches)::int8 + (SELECT count(*) FROM rows)";

/// The backlog: counts waiting (without reading the arrays), and how long the oldest has
/// waited, in seconds (a row of click_count_deltas has no time: it counts as due at once).
const BACKLOG: &str = "
    SELECT (SELECT coalesce(sum(entries), 0) FROM click_count_batches)::int8
             + (SELECT count(*) FROM click_count_deltas),
           CASE WHEN EXISTS (SELECT FROM click_count_deltas) THEN 1e9::float8
                ELSE coalesce(extract(epoch FROM now() - (SELECT min(written_at)
                                                           FROM click_count_batches)), 0)::float8
           END";

/// Held for the fold's transaction, so one collector folds at a time; the others skip their
/// turn instead of waiting (or deadlocking) on rows another fold is moving. A fixed key, not
/// the migrations' and not any instance lock's ("compact" in ASCII).
const TRY_FOLD_LOCK: &str = "SELECT pg_try_advisory_xact_lock(27988538521903988)";

/// Pruned with each fold and at least once an interval: the link change log past a day (a
/// redirector away longer loads the table whole), and bookkeeping rows nobody has touched for
/// 30 days: a redirector's seq row (one per process start) and a collector's batch-number row
/// (one per process start); without this both tables grow with every restart. A redirector
/// idle that long comes back under a new sender id.
pub const PRUNE: &str = "
    SELECT prune_link_changes(interval '1 day');
    DELETE FROM click_senders WHERE updated_at < now() - interval '30 days';
    DELETE FROM click_writers WHERE updated_at < now() - interval '30 days';";

/// When to fold.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Fold once the oldest waiting count is this old.
    pub interval: Duration,
    /// Fold once this many counts wait.
    pub backlog: i64,
}

/// The counts waiting to be folded, and the age of the oldest, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backlog {
    pub counts: i64,
    pub oldest_secs: f64,
}

impl Backlog {
    pub fn due(&self, policy: &Policy) -> bool {
        self.counts >= policy.backlog
            || (self.counts > 0 && self.oldest_secs >= policy.interval.as_secs_f64())
    }
}

/// The backlog, whichever collector wrote it.
pub async fn backlog(client: &Client) -> Result<Backlog, tokio_postgres::Error> {
    let row = client.query_one(BACKLOG, &[]).await?;
    Ok(Backlog {
        counts: row.get(0),
        oldest_secs: row.get(1),
    })
}

/// One fold and the pruning of idle bookkeeping rows, in one transaction, unless another
/// collector is folding (`None`); the counts it moved.
pub async fn fold(client: &mut Client) -> Result<Option<i64>, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    if !tx.query_one(TRY_FOLD_LOCK, &[]).await?.get::<_, bool>(0) {
        return Ok(None);
    }
    let moved = tx.query_one(FOLD, &[]).await?.get(0);
    tx.batch_execute(PRUNE).await?;
    tx.commit().await?;
    Ok(Some(moved))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fold_is_due_at_the_backlog_or_the_interval() {
        let policy = Policy {
            interval: Duration::from_secs(60),
            backlog: 1_000,
        };
        let at = |counts, oldest_secs| {
            Backlog {
                counts,
                oldest_secs,
            }
            .due(&policy)
        };
        assert!(!at(0, 100.0), "nothing to fold");
        assert!(!at(999, 59.0));
        assert!(at(1_000, 0.0), "the backlog reached");
        assert!(at(1, 60.0), "the oldest waited the interval");
    }
}
