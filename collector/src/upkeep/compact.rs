//! Folding the per-batch counts into click_counts, on a connection of its own, so that the
//! batch path only appends and each (code, day) key is written once per fold, not per batch.
//!
//! A collector folds the batches it wrote from the sums it kept of them in memory
//! (`unfolded`): PostgreSQL deletes their rows by number and adds one sum per key (`MERGE`).
//! What it does not hold (its own batches it lost track of, other writers' rows left behind by a
//! collector that stopped, rows of earlier versions) goes the SQL way, `FOLD_ROWS`: unnest,
//! sum, upsert, which costs the database about a microsecond per count on top of the upsert
//! per key. Folds are spaced out: one when the batches summed hold `--compact-backlog` counts,
//! when the oldest has waited `--compact-interval`, or when the sums take half of
//! `--compact-memory` (`unfolded` says what happens at the whole of it). `click_totals` is
//! exact whatever the backlog (it adds the unfolded counts); the backlog bounds what a reader
//! of it has to add up.
//!
//! The breakdowns (migration 14) are folded in the same transaction, always the SQL way and a
//! slice at a time (`FOLD_BREAKDOWNS`), and `click_breakdown` is exact at every moment as `click_totals` is.
//!
//! Every collector of a database runs this task; one folds at a time (a transaction-level
//! advisory lock taken with `try`), and the others skip that turn. The fold only deletes
//! batch counts and upserts click_counts, neither of which a batch's transaction touches, so
//! batch writes of every collector go on while it runs.

use std::time::{Duration, Instant};

use tokio_postgres::Client;

use crate::write::unfolded::{Taken, Unfolded};

/// A subquery for FOLD_ROWS and FOLD_BREAKDOWNS: the time up to which the oldest of `$rows`
/// (a table and its condition) hold at most `$entries` entries, or the oldest rows' alone if
/// they hold more; null if there are none. A fold's round has a deadline (--write-timeout)
/// and the SQL way costs the database per entry: a large backlog taken whole in one statement
/// outlasted it at every round, and so was never folded.
macro_rules! slice {
    ($rows:literal, $entries:literal) => {
        concat!(
            "(SELECT coalesce(max(written_at) FILTER (WHERE through <= ",
            $entries,
            "), min(written_at))
              FROM (SELECT written_at, sum(entries) OVER (ORDER BY written_at) AS through
                    FROM ",
            $rows,
            ") AS o)"
        )
    };
}

/// One statement: moves the committed counts the collector does not hold in memory (the rows
/// of batches $1's sums lost track of, up to batch $2; rows older than $3 seconds of other
/// writers, which a live collector would have folded itself (those of a previous life or of a
/// host gone), and of $1's batches before $5, the first its sums hold, which it folded itself
/// (left by a fold that an asynchronous failover lost after its commit returned), the oldest
/// of them up to $4 entries (`slice!`); and what collectors of earlier
/// versions write, during a rolling upgrade: rows of click_count_batches (arrays, before
/// migration 10; the oldest up to $4 entries too) and up to $4 rows of click_count_deltas
/// (before migration 5; they have no time to order by, nor need one)), sums per key, upserts
/// in key order, and returns how many counts it moved. Each source is sliced: an upgrade that
/// left tens of millions of counts of an earlier build, taken whole, outlasted the fold's
/// deadline at every round.
const FOLD_ROWS: &str = concat!(
    "
    WITH lists AS (
        DELETE FROM click_count_lists
        WHERE (writer = $1 AND batch <= $2)
           OR ((writer <> $1 OR batch < $5) AND written_at <= ",
    slice!(
        "click_count_lists
                WHERE (writer <> $1 OR batch < $5)
                  AND written_at < now() - $3::float8 * interval '1 second'",
        "$4"
    ),
    ")
        RETURNING day, code_list, count_list, entries),
    batches AS (
        DELETE FROM click_count_batches
        WHERE (writer IS NULL
               OR (writer <> $1 AND written_at < now() - $3::float8 * interval '1 second'))
          AND written_at <= ",
    slice!(
        "click_count_batches
                WHERE writer IS NULL
                   OR (writer <> $1 AND written_at < now() - $3::float8 * interval '1 second')",
        "$4"
    ),
    "
        RETURNING day, codes, counts, entries),
    rows AS (
        DELETE FROM click_count_deltas
        WHERE ctid = ANY (ARRAY(SELECT ctid FROM click_count_deltas LIMIT $4))
        RETURNING code, day, clicks),
    moved AS (
        SELECT u.code, l.day, u.clicks
        FROM lists AS l,
             unnest(string_to_array(l.code_list, ' '), string_to_array(l.count_list, ' ')::int8[])
                 AS u(code, clicks)
        UNION ALL
        SELECT u.code, b.day, u.clicks
        FROM batches AS b, unnest(b.codes, b.counts) AS u(code, clicks)
        UNION ALL
        SELECT code, day, clicks FROM rows),
    folded AS (
        INSERT INTO click_counts (code, day, clicks)
        SELECT code, day, sum(clicks) FROM moved GROUP BY code, day ORDER BY code, day
        ON CONFLICT (code, day) DO UPDATE SET clicks = click_counts.clicks + EXCLUDED.clicks)
    SELECT (SELECT coalesce(sum(entries), 0) FROM lists)::int8
         + (SELECT coalesce(sum(entries), 0) FROM batches)::int8 + (SELECT count(*) FROM rows)"
);

/// One statement: moves the committed breakdown lists (migration 14), the oldest up to $4
/// entries (`slice!`), into click_breakdown_counts, summed per key and upserted in key order,
/// and returns how many entries it moved. Always the SQL way: breakdowns are not summed in
/// memory (their keys are several per click, and the lists are read only here and by the
/// view), so whichever collector folds takes every writer's; a list committed after the
/// statement's snapshot, or past the slice, waits for the next fold (still due). In the fold's
/// transaction, so the view sees the lists and the counts they went into, never both nor
/// neither.
const FOLD_BREAKDOWNS: &str = concat!(
    "
    WITH lists AS (
        DELETE FROM click_breakdown_lists WHERE written_at <= ",
    slice!("click_breakdown_lists", "$1"),
    "
        RETURNING day, dimension, code_list, value_list, count_list, entries),
    folded AS (
        INSERT INTO click_breakdown_counts (code, day, dimension, value, clicks)
        SELECT u.code, l.day, l.dimension, u.value, sum(u.clicks)
        FROM lists AS l,
             unnest(string_to_array(l.code_list, ' '), string_to_array(l.value_list, ' '),
                    string_to_array(l.count_list, ' ')::int8[]) AS u(code, value, clicks)
        GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
        ON CONFLICT (code, day, dimension, value)
           DO UPDATE SET clicks = click_breakdown_counts.clicks + EXCLUDED.clicks)
    SELECT coalesce(sum(entries), 0)::int8 FROM lists"
);

/// The rows of batches $2..=$3 of writer $1, whose sums the collector holds: how many went.
const DELETE_OWN: &str = "
    DELETE FROM click_count_lists WHERE writer = $1 AND batch BETWEEN $2 AND $3";

/// Stray batches are folded in slices, as `slice!` has other writers' rows folded: the last of writer
/// $1's batches up to $2 whose rows, with those of the batches before it, hold at most $3
/// entries (the first batch if it alone holds more; none if there are no rows). Sums dropped
/// under a flood of distinct codes left millions of entries stray.
const STRAY_SLICE: &str = "
    SELECT coalesce(max(batch) FILTER (WHERE through <= $3), min(batch))
    FROM (SELECT batch, sum(entries) OVER (ORDER BY batch) AS through
          FROM click_count_lists WHERE writer = $1 AND batch <= $2) AS l";

/// The most entries one fold takes the SQL way from each of: this collector's stray batches,
/// other writers' orphaned rows, the arrays and the deltas of earlier builds, and the
/// breakdown lists (the oldest rows' alone, if more).
/// The maintenance rounds take less after a round that failed (`Policy::slice`).
pub const SLICE_ENTRIES: i64 = 1_000_000;
/// The least [`Policy::slice`] comes down to.
pub const MIN_SLICE_ENTRIES: i64 = 10_000;

/// The sums of those rows, one per key (days as PostgreSQL's day numbers), on PostgreSQL 15
/// and later: one join of the sums with click_counts, each key updated or inserted. A join
/// lets the planner hash the sums against click_counts where an upsert probes the index once
/// per key; it still probes when the table is much larger than the sums. With 250,000 sums
/// into a click_counts twice their size it took less time than UPSERT_SUMS (BENCHMARKS.md,
/// "Totals"). One
/// fold runs at a time (TRY_FOLD_LOCK); a key that a collector from before that lock inserts
/// meanwhile, during an upgrade, fails the fold (MERGE has no ON CONFLICT), which is rolled
/// back and its batches folded the SQL way next time.
const MERGE_SUMS: &str = "
    MERGE INTO click_counts AS c
    USING (SELECT code, DATE '2000-01-01' + day AS day, clicks
           FROM unnest($1::text[], $2::int4[], $3::int8[]) AS u(code, day, clicks)) AS s
    ON c.code = s.code AND c.day = s.day
    WHEN MATCHED THEN UPDATE SET clicks = c.clicks + s.clicks
    WHEN NOT MATCHED THEN INSERT (code, day, clicks) VALUES (s.code, s.day, s.clicks)";

/// The same before PostgreSQL 15 (no MERGE): the keys click_counts holds updated through a
/// join, the others inserted, their ON CONFLICT for collectors from before TRY_FOLD_LOCK. The
/// updated keys are returned, sorted and anti-joined against the sums: that is what MERGE saves.
const UPSERT_SUMS: &str = "
    WITH sums AS (
        SELECT code, DATE '2000-01-01' + day AS day, clicks
        FROM unnest($1::text[], $2::int4[], $3::int8[]) AS u(code, day, clicks)),
    updated AS (
        UPDATE click_counts AS c SET clicks = c.clicks + s.clicks
        FROM sums AS s WHERE c.code = s.code AND c.day = s.day
        RETURNING c.code, c.day)
    INSERT INTO click_counts (code, day, clicks)
    SELECT s.code, s.day, s.clicks FROM sums AS s
    WHERE NOT EXISTS (SELECT FROM updated AS u WHERE u.code = s.code AND u.day = s.day)
    ON CONFLICT (code, day) DO UPDATE SET clicks = click_counts.clicks + EXCLUDED.clicks";

/// The backlog of counts (the breakdown lists are not in it: the metrics name counts):
/// counts waiting (without reading the lists), and how long the oldest has waited, in seconds (a row of click_count_deltas has no time: it counts as due at once).
const BACKLOG: &str = "
    SELECT (SELECT coalesce(sum(entries), 0) FROM click_count_lists)::int8
             + (SELECT coalesce(sum(entries), 0) FROM click_count_batches)::int8
             + (SELECT count(*) FROM click_count_deltas),
           CASE WHEN EXISTS (SELECT FROM click_count_deltas) THEN 1e9::float8
                ELSE coalesce(extract(epoch FROM now() - least(
                         (SELECT min(written_at) FROM click_count_lists),
                         (SELECT min(written_at) FROM click_count_batches))), 0)::float8
           END,
           (SELECT coalesce(sum(entries), 0) FROM click_breakdown_lists)::int8,
           coalesce(extract(epoch FROM now() - (SELECT min(written_at)
                                                FROM click_breakdown_lists)), 0)::float8";

/// Whether FOLD_ROWS would find anything but this collector's own batches from $5 on, or
/// breakdown lists are due by the policy's rule: the oldest written $3 seconds ago, or $4 entries
/// waiting. (A batch writes its breakdowns with its counts, so they are mostly due together;
/// a batch's breakdowns hold an entry per code and value of each dimension, often more than
/// its counts, which the in-memory rule of the counts does not see. A fold due for them alone
/// leaves this collector's sums until they are due.)
const OTHERS_DUE: &str = "
    SELECT EXISTS (SELECT FROM click_count_lists
                   WHERE (writer <> $1 OR batch < $5)
                     AND written_at < now() - $2::float8 * interval '1 second')
        OR EXISTS (SELECT FROM click_count_batches
                   WHERE writer IS NULL
                      OR (writer <> $1 AND written_at < now() - $2::float8 * interval '1 second'))
        OR EXISTS (SELECT FROM click_count_deltas)
        OR EXISTS (SELECT FROM click_breakdown_lists
                   WHERE written_at <= now() - $3::float8 * interval '1 second')
        OR (SELECT coalesce(sum(entries), 0) FROM click_breakdown_lists)::int8 >= $4";

/// Held for the fold's transaction, so one collector folds at a time; the others skip their
/// turn instead of waiting (or deadlocking) on rows another fold is moving. A fixed key, not
/// the migrations' and not any instance lock's ("compact" in ASCII); also taken by what must
/// not run beside a fold (`partitions::expire_breakdowns`).
pub(crate) const FOLD_LOCK: i64 = 27988538521903988;
const TRY_FOLD_LOCK: &str = "SELECT pg_try_advisory_xact_lock($1)";

/// Pruned after each fold and at least once an interval, outside the fold's transaction (a
/// prune that fails or runs out of time leaves the fold committed): bookkeeping rows nobody
/// has touched for 30 days, a redirector's seq row (one per process start) and a collector's
/// batch-number row (one per process start); without this both tables grow with every
/// restart. The collector's memory forgets an idle sender a day before
/// (`protocol::senders::IDLE`). Then the link change log: [`PRUNE_LINK_CHANGES`].
const PRUNE: &str = "
    DELETE FROM click_senders WHERE updated_at < now() - interval '30 days';
    DELETE FROM click_writers WHERE updated_at < now() - interval '30 days';";

/// The link change log past a day (a redirector away longer loads the table whole), a slice
/// of at most $1 rows a statement (migration 20): after a bulk change of millions of links,
/// each slice commits on its own, within any deadline.
const PRUNE_LINK_CHANGES: &str = "SELECT prune_link_changes(interval '1 day', $1)";

/// Rows of the change log one statement of [`PRUNE_LINK_CHANGES`] deletes at most: a short
/// statement, however large the backlog.
const PRUNE_SLICE: i64 = 10_000;

/// Prunes: the bookkeeping rows, then the change log slice by slice until `until`
/// (`super::in_slices`).
pub(crate) async fn prune(client: &Client, until: Instant) -> Result<(), tokio_postgres::Error> {
    client.batch_execute(PRUNE).await?;
    let slice = client.prepare(PRUNE_LINK_CHANGES).await?;
    let slice = &slice;
    super::in_slices(until, &mut 0, || async move {
        let deleted: i64 = client.query_one(slice, &[&PRUNE_SLICE]).await?.get(0);
        Ok((deleted as u64, deleted == PRUNE_SLICE))
    })
    .await
}

/// When to fold.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Fold once the oldest waiting count is this old.
    pub interval: Duration,
    /// Fold once this many counts wait.
    pub backlog: i64,
    /// The most entries a fold takes the SQL way from each source ([`SLICE_ENTRIES`] unless a
    /// round failed: see [`Policy::after_round`]).
    pub slice: i64,
}

impl Policy {
    /// The policy for the next round: after one that failed (ran out of time, or an error),
    /// a quarter of the slice, down to [`MIN_SLICE_ENTRIES`]; after one that went through, a
    /// quarter more, up to [`SLICE_ENTRIES`] (slowly, so that a slice just past what fits is
    /// tried again only every few rounds: each failure is a round's work undone). All the slices and the sums go in one transaction
    /// under one deadline (`--write-timeout`): with three full slices of slow entries
    /// (breakdowns, many codes) past it, every fold was rolled back and tried again whole,
    /// for ever, and pruning, which comes after the fold, never ran either.
    pub(crate) fn after_round(self, went_through: bool) -> Policy {
        let slice = if went_through {
            self.slice.saturating_add(self.slice / 4).min(SLICE_ENTRIES)
        } else {
            (self.slice / 4).max(MIN_SLICE_ENTRIES)
        };
        Policy { slice, ..self }
    }

    /// How old another writer's counts must be before this collector folds them: a live
    /// collector folds its own within about an interval, so what is older than a few is of
    /// a collector that stopped (a previous life of this one, or a host gone).
    pub(crate) fn orphaned_after(&self) -> Duration {
        3 * self.interval
    }
}

/// The counts waiting to be folded, and the age of the oldest, in seconds; the same of the
/// breakdowns' entries, which fold by a rule of their own (`OTHERS_DUE`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Backlog {
    pub(crate) counts: i64,
    pub(crate) oldest_secs: f64,
    pub(crate) breakdowns: i64,
    pub(crate) breakdowns_oldest_secs: f64,
}

/// The backlog, whichever collector wrote it.
pub(crate) async fn backlog(client: &Client) -> Result<Backlog, tokio_postgres::Error> {
    let row = client.query_one(BACKLOG, &[]).await?;
    Ok(Backlog {
        counts: row.get(0),
        oldest_secs: row.get(1),
        breakdowns: row.get(2),
        breakdowns_oldest_secs: row.get(3),
    })
}

/// Whether this collector has anything to fold: its own sums (`Unfolded::due`), counts that
/// only the SQL way folds, or breakdown lists.
pub async fn due(
    client: &Client,
    policy: &Policy,
    own: &Unfolded,
) -> Result<bool, tokio_postgres::Error> {
    if own.due(policy.backlog as usize, policy.interval) {
        return Ok(true);
    }
    let orphaned = policy.orphaned_after().as_secs_f64();
    let interval = policy.interval.as_secs_f64();
    let row = client
        .query_one(
            OTHERS_DUE,
            &[
                &own.writer(),
                &orphaned,
                &interval,
                &policy.backlog,
                &own.held_from(),
            ],
        )
        .await?;
    Ok(row.get(0))
}

/// How a fold applies the sums it holds: the statement the server has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Apply {
    /// PostgreSQL 15 and later: `MERGE_SUMS`.
    Merge,
    /// Before: `UPSERT_SUMS`.
    Upsert,
}

impl Apply {
    /// The way for a server of `server_version_num` (e.g. 150018).
    pub(crate) fn for_version(server_version_num: i32) -> Apply {
        if server_version_num >= 150_000 {
            Apply::Merge
        } else {
            Apply::Upsert
        }
    }

    /// The way of the server `client` is connected to.
    pub async fn of(client: &Client) -> Result<Apply, tokio_postgres::Error> {
        Ok(Apply::for_version(schema::server_version(client).await?))
    }

    fn statement(self) -> &'static str {
        match self {
            Apply::Merge => MERGE_SUMS,
            Apply::Upsert => UPSERT_SUMS,
        }
    }
}

/// One fold (its own sums if due, the counts only the SQL way folds, then the breakdown lists,
/// each of those the oldest up to a slice), in one transaction, unless another collector is folding (`None`); the counts it moved (not
/// the breakdown entries, which it logs).
pub async fn fold(
    client: &mut Client,
    policy: &Policy,
    own: &Unfolded,
) -> Result<Option<i64>, tokio_postgres::Error> {
    let way = Apply::of(client).await?;
    fold_with(client, policy, own, way).await
}

/// `fold`, applying the sums as `apply` says.
pub async fn fold_with(
    client: &mut Client,
    policy: &Policy,
    own: &Unfolded,
    apply: Apply,
) -> Result<Option<i64>, tokio_postgres::Error> {
    let mut tx = client.transaction().await?;
    if !tx
        .query_one(TRY_FOLD_LOCK, &[&FOLD_LOCK])
        .await?
        .get::<_, bool>(0)
    {
        return Ok(None);
    }
    // This collector's sums only once they are due by their own rule: a fold due for other
    // writers' rows or for the breakdown lists (a slice a fold, while a backlog of them lasts)
    // must not fold them far more often than their interval, upserting each key as often.
    let due = own.due(policy.backlog as usize, policy.interval);
    let mut taking = Taking {
        own,
        taken: if due { own.take() } else { Taken::default() },
        committed: false,
    };
    // Taken or not, the sums start at this batch: this writer's rows before it are folded.
    let held_from = (taking.taken.sums.as_ref()).map_or_else(|| own.held_from(), |s| s.first);
    let writer = (own.writer(), held_from);
    let moved = fold_taken(&mut tx, policy, writer, &mut taking.taken, apply).await?;
    let breakdowns: i64 = tx
        .query_one(FOLD_BREAKDOWNS, &[&policy.slice])
        .await?
        .get(0);
    tracing::debug!(breakdowns, "folded {breakdowns} breakdown entries");
    tx.commit().await?;
    taking.commit();
    Ok(Some(moved))
}

/// What a fold took from the sums, handed back to the SQL way unless the fold committed: on an
/// error, and also when the fold is dropped midway (the maintenance round's deadline), since
/// the rows it took the sums of are then still in the table. Either way its sums stop counting
/// against the memory bound, and the stray batches it left for the next fold stay stray.
struct Taking<'a> {
    own: &'a Unfolded,
    taken: Taken,
    committed: bool,
}

impl Taking<'_> {
    fn commit(mut self) {
        self.committed = true;
    }
}

impl Drop for Taking<'_> {
    fn drop(&mut self) {
        let t = &self.taken;
        if t.sums.is_none() && t.stray_upto.is_none() && t.left.is_none() {
            // Nothing taken (the sums not due): nothing to give back, nor memory to trim.
            return;
        }
        if !self.committed {
            self.own.give_back(&self.taken);
        }
        self.own.release(&self.taken);
    }
}

/// The fold's statements: the sums, unless another collector's fold took some of their rows
/// (then those batches go the SQL way), and the SQL way for the rest. The sums go a chunk a
/// statement, in key order, all in the fold's transaction; each chunk is freed once sent.
/// `writer`: this writer, and the first batch its sums hold.
async fn fold_taken(
    tx: &mut tokio_postgres::Transaction<'_>,
    policy: &Policy,
    (writer, held_from): (i64, i64),
    taken: &mut Taken,
    apply: Apply,
) -> Result<i64, tokio_postgres::Error> {
    let mut moved = 0;
    let mut stray_upto = taken.stray_upto.unwrap_or(0);
    if let Some(sums) = &mut taken.sums {
        let own = tx.savepoint("own").await?;
        let range = [&writer as _, &sums.first as _, &sums.last as _];
        let deleted = own.execute(DELETE_OWN, &range).await?;
        if deleted as i64 == sums.rows {
            for chunk in std::mem::take(&mut sums.chunks) {
                let codes: Vec<&str> = chunk.codes.iter().map(|c| &**c).collect();
                own.execute(apply.statement(), &[&codes, &chunk.days, &chunk.clicks])
                    .await?;
            }
            own.commit().await?;
            moved += sums.keys as i64;
        } else {
            tracing::info!(
                first = sums.first,
                last = sums.last,
                "batches {}..={} of this collector were folded in part by another: folding \
                 the rest of them from their rows",
                sums.first,
                sums.last
            );
            own.rollback().await?;
            stray_upto = stray_upto.max(sums.last);
        }
    }
    if stray_upto > 0 {
        let slice = [&writer as _, &stray_upto as _, &policy.slice as _];
        let upto: Option<i64> = tx.query_one(STRAY_SLICE, &slice).await?.get(0);
        if let Some(upto) = upto.filter(|&upto| upto < stray_upto) {
            taken.left = Some(stray_upto);
            stray_upto = upto;
        }
    }
    let orphaned = policy.orphaned_after().as_secs_f64();
    let row = tx
        .query_one(
            FOLD_ROWS,
            &[&writer, &stray_upto, &orphaned, &policy.slice, &held_from],
        )
        .await?;
    Ok(moved + row.get::<_, i64>(0))
}

#[cfg(test)]
mod tests {
    use super::{Policy, MIN_SLICE_ENTRIES, SLICE_ENTRIES};
    use std::time::Duration;

    #[test]
    fn a_failed_round_takes_a_quarter_of_the_slice_and_one_that_went_through_a_quarter_more() {
        let full = Policy {
            interval: Duration::ZERO,
            backlog: 1,
            slice: SLICE_ENTRIES,
        };
        let failed = full.after_round(false);
        assert_eq!(failed.slice, SLICE_ENTRIES / 4);
        let floor = (0..10).fold(failed, |p, _| p.after_round(false));
        assert_eq!(floor.slice, MIN_SLICE_ENTRIES);
        assert_eq!(floor.after_round(true).slice, MIN_SLICE_ENTRIES * 5 / 4);
        let back = (0..30).fold(floor, |p, _| p.after_round(true));
        assert_eq!(back.slice, SLICE_ENTRIES);
        assert_eq!(full.after_round(true).slice, SLICE_ENTRIES);
    }

    /// click_senders keeps an idle sender's row a day longer than the collector's memory keeps
    /// the sender (see `protocol::senders::IDLE`).
    #[test]
    fn an_idle_senders_row_is_pruned_a_day_after_memory_forgets_it() {
        let days = protocol::senders::IDLE.as_secs() / 86_400 + 1;
        let prune =
            format!("DELETE FROM click_senders WHERE updated_at < now() - interval '{days} days'");
        assert!(super::PRUNE.contains(&prune), "{}", super::PRUNE);
    }

    /// The change log goes a slice at a time while the round has time: past `until`, not a
    /// slice; given time, slices until one finds less than a whole one (25,000 rows a day old:
    /// 10,000, 10,000, then the last 5,000).
    #[tokio::test]
    async fn the_change_log_is_pruned_in_slices_only_while_the_round_has_time() {
        let db = testkit::pgtest::test_db().await;
        let client = testkit::pgtest::connect(&db.url).await;
        client
            .batch_execute(
                "INSERT INTO links (code, url)
                     SELECT 'c' || n, 'https://x/' || n FROM generate_series(1, 25000) AS n;
                 UPDATE link_changes SET changed_at = now() - interval '2 days';",
            )
            .await
            .unwrap();
        testkit::pgtest::await_link_changes_prunable(&client).await;
        let count = "SELECT count(*) FROM link_changes";
        let left = || async { client.query_one(count, &[]).await.unwrap().get::<_, i64>(0) };
        super::prune(&client, super::Instant::now()).await.unwrap();
        assert_eq!(left().await, 25_000, "a slice past the round's time");
        let until = super::Instant::now() + std::time::Duration::from_secs(600);
        super::prune(&client, until).await.unwrap();
        assert_eq!(left().await, 0, "slices stopped before a short one");
    }
}
