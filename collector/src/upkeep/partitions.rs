//! The daily partitions of `clicks` (migration 6): created ahead of the clicks that need them,
//! dropped once older than `--retention` (with those days' breakdowns, migration 14), and vacuumed, analyzed and indexed by code once their
//! day is over (migration 11: autovacuum stays off them while they fill).
//!
//! Days are PostgreSQL's day numbers (days since 2000-01-01, as `copy::pg_day` gives them), so
//! that a test can pass any "today" and watch days go by. Every statement is idempotent:
//! creating is serialized in `ensure_click_partition`, and waits for its lock (an attach's,
//! which no batch or reader holds) only briefly (`CREATE_LOCK_WAIT`); dropping and indexing
//! use the `CONCURRENTLY` forms and vacuuming a plain VACUUM, none of which takes a lock that
//! would stop a batch from being written (and so they run outside any transaction). All but
//! creating would block each other between collectors: `maintenance::run_partitions` runs
//! them in one collector at a time.

use std::time::{Duration, Instant};

use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

/// Days created ahead beyond the window's last: a batch never finds its day missing, even
/// across a midnight with the database briefly away.
pub(crate) const SPARE_DAYS: i32 = 2;

/// What to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Partitions for every day from `first` to `last` must exist.
    pub(crate) first: i32,
    pub(crate) last: i32,
    /// Partitions wholly before this day are dropped (`None`: keep everything).
    pub(crate) drop_before: Option<i32>,
}

impl Plan {
    /// For `today`: the days clicks may be accepted for (`back` days before today to `ahead`
    /// after: the window, rounded up to whole days) and `SPARE_DAYS` more; and retention,
    /// never inside the window nor the day before it: that day's clicks were accepted until
    /// midnight, and those still on their way then (a batch held while the database was away)
    /// would find their partition gone and be set aside as refused.
    pub(crate) fn for_today(
        today: i32,
        back: i32,
        ahead: i32,
        retention_days: Option<i32>,
    ) -> Plan {
        let first = today - back;
        Plan {
            first,
            last: today + ahead + SPARE_DAYS,
            drop_before: retention_days.map(|keep| (today - keep).min(first - 1)),
        }
    }
}

/// What one round of maintenance did.
#[derive(Debug, Default)]
pub(crate) struct Done {
    pub(crate) created: u64,
    /// Creating waited `CREATE_LOCK_WAIT` for its lock and gave up: tried again next round.
    pub(crate) creation_deferred: bool,
    /// The names of days of the plan held by tables that are not partitions (`BLOCKED`);
    /// `None` when the round could not look (its gauge then keeps what it said).
    pub(crate) blocked: Option<Vec<String>>,
    /// Each table dropped, and how long detaching and dropping it took.
    pub(crate) dropped: Vec<(String, Duration)>,
    /// Rows of click_breakdown_counts and click_breakdown_lists deleted by retention.
    pub(crate) breakdowns_expired: u64,
    /// Rows of clicks_set_aside deleted for being older than the retention.
    pub(crate) set_aside_expired: u64,
    pub(crate) indexed: Vec<String>,
    /// Whose index build ran past the statement timeout: given up ([`GAVE_UP`]).
    pub(crate) gave_up: Vec<String>,
    /// Vacuumed and analyzed once their day was over, and handed back to autovacuum.
    pub(crate) settled: Vec<String>,
    /// The steps that failed, the first first.
    pub(crate) failed: Vec<Failed>,
    /// The database's clock (microseconds since the Unix epoch) when retention read its day
    /// (`retention_day`), to tell a host's clock ahead of it.
    pub(crate) database_now_us: Option<i64>,
}

/// The database's clock, in microseconds since the Unix epoch (its day: `copy::pg_day`).
const DATABASE_NOW: &str = "SELECT (extract(epoch FROM now()) * 1000000)::int8";

/// How long creating a partition waits for its lock on `clicks`. Attaching a day's table
/// (migration 24) takes SHARE UPDATE EXCLUSIVE on it, which no reader or writer conflicts
/// with: only another session attaching or detaching a partition (a detach concurrently
/// waiting for old snapshots holds it), or a VACUUM or ANALYZE of `clicks` itself. Past this
/// it gives up, to be tried again next round (days are created `SPARE_DAYS` ahead;
/// `maintain`). (`CREATE TABLE ... PARTITION OF`, before, took the strongest lock there is,
/// which waited for every transaction that had read `clicks`, with every batch's COPY queued
/// behind the wait.)
const CREATE_LOCK_WAIT: &str = "2s";

/// The lock wait is set for this statement's transaction alone (`set_config(..., true)`, the
/// function scan run before any row reaches the filter).
const ENSURE: &str = "SELECT count(*) FILTER (WHERE ensure_click_partition(date '2000-01-01' + d))
                      FROM set_config('lock_timeout', $3, true), generate_series($1::int, $2::int) AS d";

/// Whether the table `c` holds clicks wholly before day $1 (a number of days since
/// 2000-01-01): a daily one by its name, the one holding everything from before partitioning
/// by where it ends. A macro, so that the queries of what to drop share one text.
macro_rules! wholly_before {
    () => {
        "((c.relname ~ '^clicks_p[0-9]{8}$'
           AND to_date(substr(c.relname, 9), 'YYYYMMDD') < date '2000-01-01' + $1::int)
          OR (c.relname = 'clicks_before_partitioning'
              AND (SELECT start FROM click_partitions_start)
                  <= ((date '2000-01-01' + $1::int)::timestamp AT TIME ZONE 'UTC')))"
    };
}

/// Partitions wholly before day $1.
const EXPIRED: &str = concat!(
    "SELECT c.relname FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
     WHERE i.inhparent = 'clicks'::regclass AND ",
    wholly_before!(),
    " ORDER BY 1"
);

/// A slice of the breakdowns of days before $1 (a number of days since 2000-01-01), folded and
/// not yet folded, at most $2 rows of each table: retention keeps no day of them that it keeps
/// no clicks of, but the agent's, which are kept as click_counts keeps every day's total (the
/// view derives the humans from both). How many rows of each went. A fold that moves an
/// expired day's list between two slices may leave its counts row, which a later one deletes.
const EXPIRE_BREAKDOWNS: &str = "
    WITH counts AS (
        DELETE FROM click_breakdown_counts
        WHERE ctid = ANY (ARRAY(
            SELECT ctid FROM click_breakdown_counts
            WHERE day < date '2000-01-01' + $1::int AND dimension <> 'agent' LIMIT $2))
        RETURNING 1),
    lists AS (
        DELETE FROM click_breakdown_lists
        WHERE ctid = ANY (ARRAY(
            SELECT ctid FROM click_breakdown_lists
            WHERE day < date '2000-01-01' + $1::int AND dimension <> 'agent' LIMIT $2))
        RETURNING 1)
    SELECT (SELECT count(*) FROM counts), (SELECT count(*) FROM lists)";

/// Rows of each breakdown table one slice of `EXPIRE_BREAKDOWNS` deletes at most: a short
/// hold of the folds' lock.
const EXPIRE_SLICE: i64 = 10_000;

/// How long a round goes on expiring breakdowns, a slice after another: a first expiry over a
/// long history (retention first set on it) goes over many rounds, folding going on between
/// them, rather than holding every fold off for its whole length.
const EXPIRE_TIME: Duration = Duration::from_secs(5);

/// Clicks set aside before day $1: retention keeps them no longer than the clicks it drops
/// (how many rows went). The table has no index by time, so this runs only in a round that
/// dropped a day (once a day): what a day's drop leaves, the next one takes.
const EXPIRE_SET_ASIDE: &str = "
    WITH gone AS (
        DELETE FROM clicks_set_aside
        WHERE set_aside_at < ((date '2000-01-01' + $1::int)::timestamp AT TIME ZONE 'UTC')
        RETURNING 1)
    SELECT count(*) FROM gone";

/// Detaches left half done by an interrupted `DETACH ... CONCURRENTLY`, of any day: finishing
/// one is what whoever began it asked for, and while one is pending no other detach of clicks
/// can begin (retention's would fail every round). What is dropped after is `DETACHED`'s.
const PENDING_DETACH: &str = "
    SELECT c.relname FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'clicks'::regclass AND i.inhdetachpending";

/// What retention writes on a day's partition before it detaches it (`COMMENT ON TABLE`), so
/// that a drop interrupted after the detach is finished by a later round, and no table of a
/// day's name that an operator detached to keep is taken for one.
const RETIRING: &str = "detached by the collector for retention, to be dropped";

/// Partition tables of days wholly before day $1 that retention detached but did not drop (an
/// interrupted drop): marked `RETIRING`. Not an operator's, detached to archive it or made to
/// fill before attaching it, whatever its day.
const DETACHED: &str = concat!(
    "SELECT c.relname FROM pg_class AS c
     WHERE c.relkind = 'r' AND c.relnamespace = 'public'::regnamespace
       AND NOT EXISTS (SELECT FROM pg_inherits AS i WHERE i.inhrelid = c.oid)
       AND obj_description(c.oid, 'pg_class') = $2 AND ",
    wholly_before!()
);

/// Partitions of days before $1 without a valid index on (code, clicked_at): an invalid one
/// is what an interrupted `CREATE INDEX CONCURRENTLY` leaves. The newest day first, and the
/// clicks from before partitioning (migration 6) last: on a long history their build may run
/// past the round's hour, and every day waited behind it, round after round.
const UNINDEXED: &str = "
    SELECT c.relname,
           EXISTS (SELECT FROM pg_class AS x WHERE x.relname = c.relname || '_code') AS broken
    FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'clicks'::regclass
      AND (c.relname = 'clicks_before_partitioning'
           OR (c.relname ~ '^clicks_p[0-9]{8}$'
               AND to_date(substr(c.relname, 9), 'YYYYMMDD') < date '2000-01-01' + $1::int))
      AND NOT EXISTS (
          SELECT FROM pg_index AS ix JOIN pg_class AS x ON x.oid = ix.indexrelid
          WHERE ix.indrelid = c.oid AND x.relname = c.relname || '_code'
            AND (ix.indisvalid OR obj_description(x.oid, 'pg_class') = $2))
    ORDER BY c.relname = 'clicks_before_partitioning', c.relname DESC";

/// The comment on an index whose build ran past the partitions session's statement timeout
/// (the legacy `clicks_before_partitioning` of a large history, or a very large day): the build
/// is not tried again, round after round, each time for that long; an operator builds it
/// (docs/operating.md), or drops the index to have it tried again.
pub(crate) const GAVE_UP: &str =
    "given up by the collector: its build ran past the statement timeout; build it by hand";

/// Partitions of days before $1 that autovacuum was kept off while they filled (migration 11):
/// not yet vacuumed once their day was over.
const UNSETTLED: &str = "
    SELECT c.relname FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'clicks'::regclass AND c.relname ~ '^clicks_p[0-9]{8}$'
      AND to_date(substr(c.relname, 9), 'YYYYMMDD') < date '2000-01-01' + $1::int
      AND 'autovacuum_enabled=false' = ANY (c.reloptions)
    ORDER BY 1";

/// The name of day `d`'s partition (a number of days since 2000-01-01), as
/// `ensure_click_partition` names it.
macro_rules! partition_name {
    () => {
        "('clicks_p' || to_char(date '2000-01-01' + d, 'YYYYMMDD'))"
    };
}

/// Days of $1..=$2 (numbers of days since 2000-01-01) without their partition, leaving out
/// those wholly before partitioning began, which have none (as `ensure_click_partition` does).
const MISSING: &str = concat!(
    "SELECT count(*) FROM generate_series($1::int, $2::int) AS d
     WHERE to_regclass(",
    partition_name!(),
    ") IS NULL
       AND ((date '2000-01-01' + d + 1)::timestamp AT TIME ZONE 'UTC')
           > (SELECT start FROM click_partitions_start)"
);

/// Tables named as the partition of a day of $1..=$2 that are not partitions of `clicks` (one
/// detached and kept, or made by hand), or are being detached (a `DETACH ... CONCURRENTLY`
/// interrupted): `ensure_click_partition` finds the name taken and creates nothing, and no row
/// is routed to a partition being detached, so that day has none until the table is renamed
/// (or the detach finalized and then the table renamed).
const BLOCKED: &str = concat!(
    "SELECT name FROM (SELECT ",
    partition_name!(),
    " AS name FROM generate_series($1::int, $2::int) AS d) AS days
     WHERE to_regclass(name) IS NOT NULL
       AND NOT EXISTS (SELECT FROM pg_inherits
                        WHERE inhrelid = to_regclass(name) AND inhparent = 'clicks'::regclass
                          AND NOT inhdetachpending)
     ORDER BY 1"
);

/// At start: creates what `plan` lacks, as [`create`] does. A creation that gave up on its
/// lock fails the start only if a day a click may be dated lacks its partition: when only
/// the spare days are missing, the partitions task (whose first round is at once) tries again,
/// rather than the start retrying, never ready.
pub(crate) async fn create_at_start(
    client: &Client,
    plan: &Plan,
) -> Result<u64, tokio_postgres::Error> {
    let waited = match create(client, plan).await? {
        Created::Made(created) => return Ok(created),
        Created::Deferred(waited) => waited,
    };
    let last = plan.last - SPARE_DAYS;
    let missing: i64 = client
        .query_one(MISSING, &[&plan.first, &last])
        .await?
        .get(0);
    if missing > 0 {
        return Err(waited);
    }
    tracing::warn!(
        "creating the spare partitions of clicks ahead waited for its lock on clicks and gave \
         up (another session attaches, detaches or analyzes clicks): the partitions task \
         tries again"
    );
    Ok(0)
}

/// What [`create`] did.
pub(crate) enum Created {
    /// Created so many partitions (0: none lacked).
    Made(u64),
    /// Gave up waiting `CREATE_LOCK_WAIT` for its lock on `clicks` (the lock timeout's error).
    Deferred(tokio_postgres::Error),
}

/// Creates the partitions `plan` lacks.
pub(crate) async fn create(client: &Client, plan: &Plan) -> Result<Created, tokio_postgres::Error> {
    let bounds = [&plan.first as _, &plan.last as _, &CREATE_LOCK_WAIT as _];
    match client.query_one(ENSURE, &bounds).await {
        Ok(created) => Ok(Created::Made(created.get::<_, i64>(0) as u64)),
        Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => Ok(Created::Deferred(e)),
        Err(e) => Err(e),
    }
}

/// Creates what is missing of `plan`, drops what it expires (partitions and breakdowns), and
/// vacuums, analyzes and indexes the partitions of days before `today`. Each step, and each
/// table, on its own: one that fails (a view that depends on an expired day, an index build
/// out of disk) is in `Done::failed`, and the rest of the round goes on, rather than every
/// round stopping there for as long as it fails. A closed connection ends the round.
pub(crate) async fn maintain(client: &Client, plan: &Plan, today: i32, builds: BuildTime) -> Done {
    let mut done = Done::default();
    // A creation that gave up on its lock is no failure of the round: the rest of it goes on,
    // and the next round (a minute on, days ahead still) tries again, rather than the round
    // being retried at once and queueing every batch behind the lock again and again.
    match done.ok("creating the partitions ahead", create(client, plan).await) {
        Some(Created::Made(created)) => done.created = created,
        Some(Created::Deferred(_)) => done.creation_deferred = true,
        None if done.cut_off(client) => return done,
        None => {}
    }
    let blocked = client.query(BLOCKED, &[&plan.first, &plan.last]).await;
    if let Some(rows) = done.ok("looking for tables named as partitions", blocked) {
        done.blocked = Some(rows.iter().map(|row| row.get(0)).collect());
    }
    if done.cut_off(client) {
        return done;
    }
    let drop = match plan.drop_before {
        Some(day) => done.ok(
            "reading the database's day",
            retention_day(client, day, today).await,
        ),
        None => None,
    };
    if let Some((day, database_now_us)) = drop {
        done.database_now_us = Some(database_now_us);
        drop_before(client, day, &mut done).await;
        let expired = |sql| async move {
            let row = client.query_one(sql, &[&day]).await?;
            Ok::<_, tokio_postgres::Error>(row.get::<_, i64>(0) as u64)
        };
        let until = Instant::now() + EXPIRE_TIME;
        let expired_rows = &mut done.breakdowns_expired;
        let breakdowns = expire_breakdowns(client, day, (EXPIRE_SLICE, until), expired_rows);
        let breakdowns = breakdowns.await;
        done.ok("deleting expired breakdowns", breakdowns);
        if !done.dropped.is_empty() {
            let set_aside = expired(EXPIRE_SET_ASIDE).await;
            done.set_aside_expired = done
                .ok("deleting expired clicks_set_aside rows", set_aside)
                .unwrap_or(0);
        }
    }
    if !done.cut_off(client) {
        settle_closed_days(client, today, &mut done).await;
    }
    if !done.cut_off(client) {
        index_closed_days(client, today, builds, &mut done).await;
    }
    done
}

/// The first day retention keeps, `day` by this host's `today`, moved back by as many days as
/// this host's clock is ahead of the database's (and those days): on a clock stepped days
/// ahead (a virtual machine restored, a bad clock chip, an NTP step) the days every host still
/// writes to would be dropped, for the whole fleet, with their breakdowns. A host's clock
/// behind the database's only keeps more.
async fn retention_day(
    client: &Client,
    day: i32,
    today: i32,
) -> Result<(i32, i64), tokio_postgres::Error> {
    let database_now_us: i64 = client.query_one(DATABASE_NOW, &[]).await?.get(0);
    let database_day = crate::write::copy::pg_day(database_now_us);
    let ahead = (today - database_day).max(0);
    Ok((day - ahead, database_now_us))
}

/// A step of a round that failed; the round went on without it.
#[derive(Debug)]
pub(crate) struct Failed {
    /// What it was doing: "dropping clicks_p20261101".
    pub(crate) what: String,
    pub(crate) error: tokio_postgres::Error,
}

impl Done {
    /// `result`'s value, or `None` with its error noted as `what` failing.
    fn ok<T>(&mut self, what: &str, result: Result<T, tokio_postgres::Error>) -> Option<T> {
        result
            .map_err(|error| {
                let what = what.to_owned();
                self.failed.push(Failed { what, error })
            })
            .ok()
    }

    /// Whether the round cannot go on: its connection is gone.
    fn cut_off(&self, client: &Client) -> bool {
        !self.failed.is_empty() && client.is_closed()
    }
}

/// Drops the partitions wholly before `day`, and finishes what an earlier drop left undone;
/// each table dropped, with how long detaching and dropping it took, goes into `done`.
async fn drop_before(client: &Client, day: i32, done: &mut Done) {
    let pending = client.query(PENDING_DETACH, &[]).await;
    for row in done
        .ok("looking for detaches left pending", pending)
        .unwrap_or_default()
    {
        let name: String = row.get(0);
        let finalize = format!(
            "ALTER TABLE clicks DETACH PARTITION {} FINALIZE",
            ident(&name)
        );
        let finalized = client.batch_execute(&finalize).await;
        done.ok(&format!("finishing the detach of {name}"), finalized);
        if done.cut_off(client) {
            return;
        }
    }
    let expired = client.query(EXPIRED, &[&day]).await;
    for row in done
        .ok("looking for expired partitions", expired)
        .unwrap_or_default()
    {
        let name: String = row.get(0);
        let started = Instant::now();
        if detach_expired(client, &name, done).await {
            drop_table(client, name, started, done).await;
        }
        if done.cut_off(client) {
            return;
        }
    }
    // Detached before an interruption (or a failed drop), never dropped.
    let detached = client.query(DETACHED, &[&day, &RETIRING]).await;
    for row in done
        .ok("looking for expired days detached", detached)
        .unwrap_or_default()
    {
        drop_table(client, row.get(0), Instant::now(), done).await;
        if done.cut_off(client) {
            return;
        }
    }
}

/// Detaches the expired day `name`, marked `RETIRING` first, so that a later round drops it if
/// this one is cut off; whether it is detached. A detach that failed and left nothing pending
/// has its mark taken off: the table is still a partition (tried again next round), or an
/// operator detached it meanwhile, to keep it.
async fn detach_expired(client: &Client, name: &str, done: &mut Done) -> bool {
    let table = ident(name);
    let mark = format!("COMMENT ON TABLE {table} IS '{RETIRING}'");
    // Waits for transactions that may still see the partition, but blocks no writer of the
    // other partitions (it takes no lock that conflicts with an INSERT or a COPY).
    let detach = format!("ALTER TABLE clicks DETACH PARTITION {table} CONCURRENTLY");
    let marked = client.batch_execute(&mark).await;
    if done
        .ok(&format!("marking {name} for retention"), marked)
        .is_none()
    {
        return false;
    }
    let detached = client.batch_execute(&detach).await;
    if done.ok(&format!("detaching {name}"), detached).is_some() {
        return true;
    }
    let pending = client.query(PENDING_DETACH, &[]).await;
    if pending.is_ok_and(|rows| rows.iter().all(|row| row.get::<_, &str>(0) != name)) {
        let unmark = client
            .batch_execute(&format!("COMMENT ON TABLE {table} IS NULL"))
            .await;
        done.ok(&format!("taking the retention mark off {name}"), unmark);
    }
    false
}

/// Drops the detached day `name`, detached since `started`.
async fn drop_table(client: &Client, name: String, started: Instant, done: &mut Done) {
    let dropped = client
        .batch_execute(&format!("DROP TABLE {}", ident(&name)))
        .await;
    if done.ok(&format!("dropping {name}"), dropped).is_some() {
        done.dropped.push((name, started.elapsed()));
    }
}

/// How long a round's index builds may take: each is given what is left of the round's time
/// (`until`, before the task's own deadline cuts the session off), at most the session's
/// statement timeout (`statement`). A build cancelled having had all of `statement` is given
/// up ([`GAVE_UP`]); one cancelled sooner (the round's other steps took long) is tried again
/// next round, with the whole of it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BuildTime {
    pub(crate) statement: Duration,
    pub(crate) until: Instant,
}

/// Indexes by (code, clicked_at) each partition of a day before `today` that lacks a valid
/// index: built once its day is over, so that today's partition, where every click lands,
/// stays without one and COPY keeps its speed.
async fn index_closed_days(client: &Client, today: i32, builds: BuildTime, done: &mut Done) {
    let unindexed = client.query(UNINDEXED, &[&today, &GAVE_UP]).await;
    for row in done
        .ok("looking for days to index", unindexed)
        .unwrap_or_default()
    {
        let (name, broken): (String, bool) = (row.get(0), row.get(1));
        let index = index_of(&name);
        if broken {
            // An interrupted build's, dropped first: a cancelled drop is no build given up.
            let drop = format!("DROP INDEX CONCURRENTLY IF EXISTS {index}");
            let Some(dropped) = builds.run(client, &drop).await else {
                return;
            };
            if done
                .ok(&format!("dropping {name}'s broken index"), dropped.0)
                .is_none()
            {
                if done.cut_off(client) {
                    return;
                }
                continue;
            }
        }
        let create = format!(
            "CREATE INDEX CONCURRENTLY {index} ON {} (code, clicked_at)",
            ident(&name)
        );
        let Some((built, given)) = builds.run(client, &create).await else {
            return;
        };
        match built {
            Ok(()) => done.indexed.push(name),
            Err(e) if e.code() == Some(&SqlState::QUERY_CANCELED) && given == builds.statement => {
                let comment = format!("COMMENT ON INDEX {} IS $${GAVE_UP}$$", index_of(&name));
                let marked = client.batch_execute(&comment).await;
                if done
                    .ok(&format!("giving up {name}'s index"), marked)
                    .is_some()
                {
                    done.gave_up.push(name);
                }
            }
            Err(e) => {
                done.ok::<()>(&format!("indexing {name}"), Err(e));
            }
        }
        if done.cut_off(client) {
            return;
        }
    }
}

impl BuildTime {
    /// Runs `sql` given what is left of the round, at most the statement timeout, then sets
    /// the session's timeout back (a failure to, the statement's error if it had none): how it
    /// went, and how long it was given. `None`: the round's time is up, nothing run.
    async fn run(
        &self,
        client: &Client,
        sql: &str,
    ) -> Option<(Result<(), tokio_postgres::Error>, Duration)> {
        let given = (self.until.saturating_duration_since(Instant::now())).min(self.statement);
        if given.is_zero() {
            return None;
        }
        let timeout = |d: Duration| format!("SET statement_timeout = {}", d.as_millis().max(1));
        let ran = match client.batch_execute(&timeout(given)).await {
            Ok(()) => client.batch_execute(sql).await,
            Err(e) => Err(e),
        };
        let reset = client.batch_execute(&timeout(self.statement)).await;
        Some((ran.and(reset), given))
    }
}

/// Whether VACUUM left every page of $1 all-visible: it cannot while a transaction that may
/// not see a row yet is running, or when the page is newer than the VACUUM.
const ALL_VISIBLE: &str =
    "SELECT relallvisible >= relpages FROM pg_class WHERE oid = $1::text::regclass";

/// Vacuums each partition of a day before `today` that autovacuum was kept off while it
/// filled; once every page is all-visible, analyzes it and hands it back to autovacuum
/// (which then finds little to do: late clicks, within --max-click-age). Until then it is
/// vacuumed again at each round: a VACUUM skips the pages it found all-visible before. VACUUM
/// takes no lock that stops a COPY; a second collector doing the same waits for the first.
/// Not `VACUUM (FREEZE)`: freezing a day writes every page into the WAL again (15 M clicks:
/// 793 MB of WAL and 1.75 s of CPU, against 5.7 MB and 1.24 s), which a day dropped by
/// retention before PostgreSQL's freeze age never needs; anti-wraparound vacuums freeze the
/// rest as for any table.
async fn settle_closed_days(client: &Client, today: i32, done: &mut Done) {
    let unsettled = client.query(UNSETTLED, &[&today]).await;
    for row in done
        .ok("looking for days to vacuum", unsettled)
        .unwrap_or_default()
    {
        let name: String = row.get(0);
        let settled = settle_day(client, &name).await;
        match done.ok(&format!("vacuuming {name}"), settled) {
            Some(true) => done.settled.push(name),
            Some(false) => tracing::debug!(
                partition = %name,
                "{name}: not every page all-visible yet; vacuumed again next round"
            ),
            None if done.cut_off(client) => return,
            None => {}
        }
    }
}

/// Deletes the breakdowns of days before `day`, `slice` rows of each table at a time
/// (`EXPIRE_BREAKDOWNS`) until `until` (`super::in_slices`). Each slice waits for a fold in
/// progress and holds the next one off (a fold that finds the lock taken skips its turn): a
/// fold deletes lists and then upserts counts, this the other way round, and the two
/// deadlocked on a day that expired while its lists were being folded. How many rows went is
/// added to `expired`.
async fn expire_breakdowns(
    client: &Client,
    day: i32,
    (slice, until): (i64, Instant),
    expired: &mut u64,
) -> Result<(), tokio_postgres::Error> {
    let fold = super::compact::FOLD_LOCK;
    super::in_slices(until, expired, || async move {
        client
            .query_one("SELECT pg_advisory_lock($1)", &[&fold])
            .await?;
        let expired = client.query_one(EXPIRE_BREAKDOWNS, &[&day, &slice]).await;
        let unlocked = client
            .query_one("SELECT pg_advisory_unlock($1)", &[&fold])
            .await;
        let row = expired?;
        unlocked?;
        let (counts, lists): (i64, i64) = (row.get(0), row.get(1));
        Ok(((counts + lists) as u64, counts == slice || lists == slice))
    })
    .await
}

/// The index by code of the partition `name`, quoted.
fn index_of(name: &str) -> String {
    ident(&format!("{name}_code"))
}

/// Vacuums the day `name`; once every page is all-visible, analyzes it and hands it back to
/// autovacuum: whether it did.
async fn settle_day(client: &Client, name: &str) -> Result<bool, tokio_postgres::Error> {
    let table = ident(name);
    // One statement each: VACUUM cannot run inside the implicit transaction of several.
    // INDEX_CLEANUP ON: once the day has its index (a round whose VACUUM left pages not
    // all-visible indexes it), dead line pointers left by an aborted batch would otherwise
    // be skipped below 2 % of pages, and their pages never become all-visible.
    let vacuum = format!("VACUUM (INDEX_CLEANUP ON) {table}");
    client.batch_execute(&vacuum).await?;
    if !client
        .query_one(ALL_VISIBLE, &[&table])
        .await?
        .get::<_, bool>(0)
    {
        return Ok(false);
    }
    client.batch_execute(&format!("ANALYZE {table}")).await?;
    client
        .batch_execute(&format!("ALTER TABLE {table} RESET (autovacuum_enabled)"))
        .await?;
    Ok(true)
}

/// `name` quoted as an SQL identifier. The names come from the catalog, of the forms matched
/// above: quoting is a second line of defence, not the first.
fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The database's day `n` days ago, as the partitions count days (since 2000-01-01).
    async fn days_ago(client: &Client, n: i32) -> i32 {
        let sql = "SELECT current_date - $1::int - date '2000-01-01'";
        client.query_one(sql, &[&n]).await.unwrap().get(0)
    }

    /// The rows of click_breakdown_counts left: the agent's, and all.
    async fn breakdowns_left(client: &Client) -> (i64, i64) {
        let left = "SELECT count(*) FILTER (WHERE dimension = 'agent'), count(*)
                      FROM click_breakdown_counts";
        let row = client.query_one(left, &[]).await.unwrap();
        (row.get(0), row.get(1))
    }

    #[test]
    fn the_plan_covers_the_window_and_ahead_and_never_drops_inside_the_window() {
        let plan = Plan::for_today(100, 1, 1, Some(30));
        assert_eq!(
            (plan.first, plan.last, plan.drop_before),
            (99, 103, Some(70))
        );
        assert_eq!(Plan::for_today(100, 1, 1, None).drop_before, None);
        // A retention shorter than the window keeps the window and the day before it.
        assert_eq!(Plan::for_today(100, 3, 1, Some(1)).drop_before, Some(96));
        assert_eq!(Plan::for_today(100, 3, 1, Some(3)).drop_before, Some(96));
        assert_eq!(Plan::for_today(100, 3, 1, Some(5)).drop_before, Some(95));
        // A window far ahead gets its partitions too.
        assert_eq!(Plan::for_today(100, 1, 30, None).last, 132);
    }

    /// Expiry beside a fold that has deleted an expired day's list and is about to upsert its
    /// count (a fold's order): it waits for the fold, rather than deleting the count first and
    /// then waiting for the list (a deadlock, one of the two aborted).
    #[tokio::test]
    async fn expiring_breakdowns_waits_for_a_fold_rather_than_deadlocking() {
        let db = testkit::pgtest::test_db().await;
        let mut fold = testkit::pgtest::connect(&db.url).await;
        let (expiry, watch) = (
            testkit::pgtest::connect(&db.url).await,
            testkit::pgtest::connect(&db.url).await,
        );
        fold.batch_execute(
            "INSERT INTO click_breakdown_counts (code, day, dimension, value, clicks)
             VALUES ('c', current_date - 30, 'referrer', 'x.org', 1);
             INSERT INTO click_breakdown_lists
                 (day, dimension, entries, code_list, value_list, count_list, writer, batch)
             VALUES (current_date - 30, 'referrer', 1, 'c', 'x.org', '1', 1, 1)",
        )
        .await
        .unwrap();
        let day = days_ago(&expiry, 3).await;
        let pid_of = "SELECT pg_backend_pid()";
        let pid: i32 = expiry.query_one(pid_of, &[]).await.unwrap().get(0);
        let tx = fold.transaction().await.unwrap();
        let lock = "SELECT pg_try_advisory_xact_lock($1)";
        let fold_lock = super::super::compact::FOLD_LOCK;
        assert!(tx
            .query_one(lock, &[&fold_lock])
            .await
            .unwrap()
            .get::<_, bool>(0));
        let folded = "DELETE FROM click_breakdown_lists WHERE dimension = 'referrer'";
        tx.batch_execute(folded).await.unwrap();
        let until = Instant::now() + Duration::from_secs(60);
        let expiring = tokio::spawn(async move {
            let mut expired = 0;
            let done = expire_breakdowns(&expiry, day, (10, until), &mut expired).await;
            done.map(|()| expired)
        });
        let waits = "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1";
        testkit::eventually(
            "the expiry waiting",
            std::time::Duration::from_secs(20),
            || {
                let watch = &watch;
                async move {
                    let row = watch.query_one(waits, &[&pid]).await.unwrap();
                    row.get::<_, Option<bool>>(0).unwrap_or(false).then_some(())
                }
            },
        )
        .await;
        let counted = "UPDATE click_breakdown_counts SET clicks = clicks + 1 WHERE code = 'c'";
        tx.batch_execute(counted).await.unwrap();
        tx.commit().await.unwrap();
        let expired = expiring.await.unwrap();
        let expired = expired.unwrap_or_else(|e| panic!("{}", shared::db::describe(&e)));
        assert_eq!(expired, 1, "the count, the list having been folded");
    }

    /// Days to index come newest first, and the clicks from before partitioning last.
    #[tokio::test]
    async fn closed_days_are_indexed_newest_first_and_the_clicks_before_partitioning_last() {
        let db = testkit::pgtest::test_db().await;
        let client = testkit::pgtest::connect(&db.url).await;
        client
            .batch_execute(
                "CREATE TABLE clicks_before_partitioning PARTITION OF clicks
                     FOR VALUES FROM ('1990-01-01Z') TO ('1990-01-02Z');
                 CREATE TABLE clicks_p19900102 PARTITION OF clicks
                     FOR VALUES FROM ('1990-01-02Z') TO ('1990-01-03Z');
                 CREATE TABLE clicks_p19900103 PARTITION OF clicks
                     FOR VALUES FROM ('1990-01-03Z') TO ('1990-01-04Z')",
            )
            .await
            .unwrap();
        let today = days_ago(&client, 0).await;
        let names: Vec<String> = (client.query(UNINDEXED, &[&today, &GAVE_UP]).await.unwrap())
            .iter()
            .map(|row| row.get(0))
            .filter(|name: &String| name.contains("1990") || name.ends_with("partitioning"))
            .collect();
        let order = [
            "clicks_p19900103",
            "clicks_p19900102",
            "clicks_before_partitioning",
        ];
        assert_eq!(names, order);
    }

    /// An index build stopped by the statement timeout is given up, marked so on the index
    /// left invalid, and not tried again round after round; dropped, it is tried again. One
    /// stopped sooner, by the end of the round's time, is tried again next round, and so is
    /// the drop of the broken index that left, however long it was given.
    #[tokio::test]
    async fn an_index_build_past_the_statement_timeout_is_given_up_until_dropped() {
        let db = testkit::pgtest::test_db().await;
        let client = testkit::pgtest::connect(&db.url).await;
        let writer = testkit::pgtest::connect(&db.url).await;
        let day = "clicks_p19900102";
        client
            .batch_execute(&format!(
                "CREATE TABLE {day} PARTITION OF clicks
                     FOR VALUES FROM ('1990-01-02Z') TO ('1990-01-03Z')"
            ))
            .await
            .unwrap();
        // A writer's transaction open on the day: a build waits for it, past the timeout.
        let insert = format!("BEGIN; INSERT INTO {day} VALUES ('a', '1990-01-02 12:00Z')");
        writer.batch_execute(&insert).await.unwrap();
        let today = days_ago(&client, 0).await;
        let round = |statement, round_left| {
            let builds = BuildTime {
                statement,
                until: Instant::now() + round_left,
            };
            let client = &client;
            async move {
                let mut done = Done::default();
                index_closed_days(client, today, builds, &mut done).await;
                let old = |names: Vec<String>| names.into_iter().filter(|n| n == day).count();
                (old(done.gave_up), old(done.indexed), done.failed.len())
            }
        };
        let (short, long) = (Duration::from_millis(300), Duration::from_secs(600));
        // Cut off by what was left of the round, not having had the whole statement timeout.
        let cut_off = round(long, short).await;
        assert_eq!(cut_off, (0, 0, 1), "(given up, indexed, failed)");
        // The broken index it left: its drop, cancelled, is no build given up.
        assert_eq!(round(short, long).await, (0, 0, 1), "a drop cancelled");
        writer.batch_execute("ROLLBACK").await.unwrap();
        let drop = format!("DROP INDEX {day}_code");
        client.batch_execute(&drop).await.unwrap();
        writer.batch_execute(&insert).await.unwrap();
        assert_eq!(round(short, long).await, (1, 0, 0), "given up");
        writer.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(round(long, long).await, (0, 0, 0), "not tried again");
        client.batch_execute(&drop).await.unwrap();
        assert_eq!(
            round(long, long).await,
            (0, 1, 0),
            "tried again once dropped"
        );
    }

    /// Retention's delete of breakdowns visits only the rows it deletes (migration 18): each
    /// round runs it, and every agent row of every expired day is kept.
    #[tokio::test]
    async fn expiring_breakdowns_visits_no_agent_row() {
        let db = testkit::pgtest::test_db().await;
        let client = testkit::pgtest::connect(&db.url).await;
        client
            .batch_execute(
                "INSERT INTO click_breakdown_counts (code, day, dimension, value, clicks)
                 SELECT 'c' || n, current_date - 20 - n % 10, 'agent', 'bot', 1
                   FROM generate_series(1, 2000) AS n
                 UNION ALL
                 SELECT 'c' || n, current_date - 20 + 18 * (n % 2), 'referrer', 'x.org', 1
                   FROM generate_series(1, 20) AS n;
                 ANALYZE click_breakdown_counts;
                 -- As with millions of rows, where the planner would not read them all.
                 SET enable_seqscan = off",
            )
            .await
            .unwrap();
        let day = days_ago(&client, 3).await;
        let explain = format!("EXPLAIN (ANALYZE, COSTS OFF) {EXPIRE_BREAKDOWNS}");
        let plan: Vec<String> = client
            .query(&explain, &[&day, &EXPIRE_SLICE])
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        // The scan of click_breakdown_counts: its line and the ones indented under it.
        let at = plan
            .iter()
            .position(|l| l.contains("Scan") && l.contains("on click_breakdown_counts"))
            .unwrap_or_else(|| panic!("no scan of click_breakdown_counts in {plan:#?}"));
        let scan: Vec<&String> = plan[at..]
            .iter()
            .take_while(|l| !l.contains("->") || l.contains("on click_breakdown_counts"))
            .collect();
        // PostgreSQL 18 says `rows=10.00`.
        let ten = scan[0].contains("rows=10 ") || scan[0].contains("rows=10.00 ");
        assert!(
            ten && !scan.iter().any(|l| l.contains("Removed by Filter")),
            "the scan finds the 10 expired referrer rows and nothing else: {plan:#?}"
        );
        assert_eq!(breakdowns_left(&client).await, (2000, 2010));
    }

    /// Expiry goes a slice at a time, and only while the round has time: 25 expired referrer
    /// counts and 3 lists in slices of 10 are 10 and 3 in one statement; none with no time
    /// left; with time, the rest of them, the agent's kept.
    #[tokio::test]
    async fn breakdowns_expire_a_slice_at_a_time_while_the_round_has_time() {
        let db = testkit::pgtest::test_db().await;
        let client = testkit::pgtest::connect(&db.url).await;
        client
            .batch_execute(
                "INSERT INTO click_breakdown_counts (code, day, dimension, value, clicks)
                 SELECT 'c' || n, current_date - 20, d, 'x', 1
                   FROM generate_series(1, 25) AS n, unnest('{agent,referrer}'::text[]) AS d;
                 INSERT INTO click_breakdown_lists
                     (day, dimension, entries, code_list, value_list, count_list, writer, batch)
                 SELECT current_date - 20, 'referrer', 1, 'c', 'x.org', '1', 1, n
                   FROM generate_series(1, 3) AS n",
            )
            .await
            .unwrap();
        let day = days_ago(&client, 3).await;
        let row = client.query_one(EXPIRE_BREAKDOWNS, &[&day, &10i64]).await;
        let row = row.unwrap();
        assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (10, 3));
        let mut expired = 0;
        let past = expire_breakdowns(&client, day, (10, Instant::now()), &mut expired).await;
        past.unwrap();
        assert_eq!(expired, 0, "a slice past the round's time");
        let until = Instant::now() + Duration::from_secs(60);
        let expiring = expire_breakdowns(&client, day, (10, until), &mut expired).await;
        expiring.unwrap();
        assert_eq!(expired, 15, "the rest, in two slices");
        assert_eq!(breakdowns_left(&client).await, (25, 25));
    }

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(ident("clicks_p20261201"), "\"clicks_p20261201\"");
        assert_eq!(ident("a\"b"), "\"a\"\"b\"");
    }
}
