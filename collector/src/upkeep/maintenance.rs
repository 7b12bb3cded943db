//! The collector's periodic work on the database, beside the writer's: folding the per-batch
//! counts (`compact`) when due and pruning idle bookkeeping rows (`run`), and keeping the
//! daily partitions of `clicks` (`partitions`, `run_partitions`), each task on a connection of
//! its own. Every collector of a database runs them; each piece is safe to run from several
//! at once.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use shared::throttle::Throttle;
use tokio::time::Instant;
use tokio_postgres::Client;

use crate::db::{timed, Db, Failure};
use crate::metrics::Shared;
use crate::upkeep::compact::{self, Backlog};
use crate::upkeep::link_triggers;
use crate::upkeep::partitions::{self, Plan};
use crate::upkeep::Metrics;
use crate::write::unfolded::Unfolded;

/// How often the backlog is looked at (at most; more often with a shorter interval).
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// How often the partitions are seen to (they are created days ahead).
const PARTITIONS_EVERY: Duration = Duration::from_secs(60);
/// The statement timeout of the partitions' session: long enough to vacuum and index a large
/// day (CREATE INDEX CONCURRENTLY of 5.4 M clicks takes seconds, of a billion many minutes).
const PARTITIONS_TIMEOUT: Duration = Duration::from_secs(3600);
/// The task's own deadline for a round is this much longer, so that the server has stopped the
/// statement first; past it, a session that stopped answering is dropped.
const PARTITIONS_GRACE: Duration = Duration::from_secs(60);
/// The shortest wait for each lock of the look at the modes of the triggers on `links` worth
/// making after a pruning (a quarter of what the round has left); under it, that look waits
/// for the next round.
const MIN_LOCK_WAIT: Duration = Duration::from_millis(10);
/// Held (for the session, until the round is done or its connection goes) by the collector
/// seeing to the partitions, so that one collector of the database does at a time: two would
/// queue their VACUUM, ANALYZE and index builds of the same day behind each other's locks (a
/// CREATE INDEX CONCURRENTLY also waits for the other's transactions: a deadlock), and take
/// an index the other is building for a broken one. A fixed key ("partitio" in ASCII), not
/// the fold's or the migrations'.
pub const PARTITIONS_LOCK: i64 = 8097879449299872111;

/// What the task does, and when.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    pub fold: compact::Policy,
    /// Days back and ahead a click may be dated (the window, rounded up to whole days).
    pub window_back_days: i32,
    pub window_ahead_days: i32,
    /// Drop partitions older than this many days (`None`: keep everything).
    pub retention_days: Option<i32>,
    /// One deadline for each round of work.
    pub timeout: Duration,
}

impl Policy {
    /// The partitions to keep for `today` (a PostgreSQL day number).
    pub(crate) fn partitions(&self, today: i32) -> Plan {
        Plan::for_today(
            today,
            self.window_back_days,
            self.window_ahead_days,
            self.retention_days,
        )
    }
}

/// Runs until aborted; a failure is logged (once per outage), counted and tried again on a
/// new connection, at the first look after a capped backoff (a look may come every
/// millisecond: `--compact-interval`).
pub(crate) async fn run(
    db: Db,
    mut policy: Policy,
    own: Arc<Unfolded>,
    metrics: Arc<Metrics>,
    shared: Arc<Shared>,
) {
    let mut looks = tokio::time::interval(policy.fold.interval.min(LOOK_EVERY));
    looks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut conn = None;
    // One warning per outage; each look's retry would repeat it.
    let mut outage = Throttle::per_outage();
    let mut backoff = crate::db::backoff();
    let mut pruning = Pruning {
        // Pruning rides on a fold or on the first look after an interval without one.
        last: Instant::now() - policy.fold.interval,
        trigger_failures: Throttle::per_outage(),
    };
    loop {
        // Sums growing fast (many distinct codes) can pass their memory bound within a look.
        tokio::select! {
            _ = looks.tick() => {}
            () = own.due_by_memory() => {}
        }
        let round = round(&db, &mut conn, &policy, &own, &metrics, &mut pruning);
        let result = timed(policy.timeout, round).await;
        let before = policy.fold.slice;
        policy.fold = policy.fold.after_round(result.is_ok());
        if policy.fold.slice < before {
            tracing::info!(
                slice = policy.fold.slice,
                "a round failed: its folds take at most {} entries of each backlog until \
                 rounds go through again",
                policy.fold.slice
            );
        }
        match result {
            Ok(()) => {
                backoff.reset();
                shared.health.upkeep.store(true, Relaxed);
                if outage.end().is_some() {
                    tracing::info!("the database's periodic work goes on again");
                }
            }
            Err(failure) => {
                conn = None;
                shared.counts.db_errors.inc();
                shared.health.upkeep.store(false, Relaxed);
                if outage.hit().is_some() {
                    tracing::warn!(error = %failure, "folding or pruning: {failure}; retrying");
                } else {
                    tracing::debug!(error = %failure, "folding or pruning: {failure}");
                }
                backoff.wait().await;
            }
        }
    }
}

/// What the rounds keep of their prunings.
struct Pruning {
    /// When the last one ran.
    last: Instant,
    /// The failures of the look at the modes of the triggers on `links` after each.
    trigger_failures: Throttle,
}

/// One look on `conn` (opened first if needed), which has `policy.timeout` from its start: the
/// gauges, then a fold if due, pruning if due (`pruning`) and after it the modes of the
/// triggers on `links` (`link_triggers`), if the round has time left for them. The gauges
/// first: a fold that fails or runs out of time at every look is what they and their alerts
/// (CompactionBehind) are for, and after it they were never set. A fold's effect shows at the
/// next look.
async fn round(
    db: &Db,
    conn: &mut Option<Client>,
    policy: &Policy,
    own: &Unfolded,
    metrics: &Metrics,
    pruning: &mut Pruning,
) -> Result<(), tokio_postgres::Error> {
    // A quarter of the round's time left for the last slice of pruning and the rest.
    let deadline = Instant::now() + policy.timeout;
    let prune_until = deadline - policy.timeout / 4;
    let client = match conn {
        Some(client) => client,
        slot => {
            let client = db.connect().await?;
            // The server gives up when the round does: a statement the round's deadline
            // abandoned would otherwise run on, holding what it locked (the fold's lock). A
            // fold's commit is durable when it returns, whatever the server's default, as the
            // writer's are: its sums are let go then, and the rows of a fold a crash undid
            // would wait for this process's end to be folded again.
            let limit = shared::db::set_statement_timeout(policy.timeout);
            client
                .batch_execute(&format!("{limit}; SET synchronous_commit = on"))
                .await?;
            slot.insert(client)
        }
    };
    show(metrics, &compact::backlog(client).await?);
    let folded = compact::due(client, &policy.fold, own).await?
        && fold(client, policy, own, metrics).await?;
    if folded || pruning.last.elapsed() >= policy.fold.interval {
        // The rest of a backlog waits for the next round.
        compact::prune(client, prune_until.into_std()).await?;
        // A quarter of what the round has left, at most, for each of the three locks it may
        // wait for (`schema::restore_link_trigger_modes`): waiting may not undo the round.
        let wait = deadline.saturating_duration_since(Instant::now()) / 4;
        if wait >= MIN_LOCK_WAIT {
            let wait = wait.min(link_triggers::LOCK_WAIT);
            let failures = &mut pruning.trigger_failures;
            let report = link_triggers::Report::SetBack { failures };
            link_triggers::set_back(client, report, wait, metrics).await;
        }
        pruning.last = Instant::now();
    }
    Ok(())
}

/// Sees to the partitions once a minute until aborted, on a connection of its own beside the
/// folds': on the first minute of a day it may vacuum and index a whole day of clicks, which
/// on a large day takes minutes, so it has a deadline of its own and folds go on meanwhile.
/// One collector of the database does it at a time (`PARTITIONS_LOCK`; the others skip
/// their turn). A failure is counted, logged (once per outage) and tried again on a new
/// connection: after a capped backoff, or at the next tick where only steps of the round
/// failed (the round did the rest, `partitions::maintain`), so that a step that keeps failing
/// does not bring a whole round (its VACUUMs) every few seconds.
pub(crate) async fn run_partitions(
    db: Db,
    policy: Policy,
    metrics: Arc<Metrics>,
    shared: Arc<Shared>,
) {
    let mut every = tokio::time::interval(PARTITIONS_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut conn = None;
    let mut outage = Throttle::per_outage();
    let mut backoff = crate::db::backoff();
    // The first tick is at once: the start created what the first batch needs, the rest (a
    // day closed while the collector was away) is done now.
    every.tick().await;
    loop {
        let work = partitions_round(&db, &mut conn, &policy, &metrics);
        let (failure, stepped) = match timed(PARTITIONS_TIMEOUT + PARTITIONS_GRACE, work).await {
            Ok(None) => {
                backoff.reset();
                if outage.end().is_some() {
                    tracing::info!("the partitions are seen to again");
                }
                every.tick().await;
                continue;
            }
            Ok(Some(step)) => (Failure::Db(step), true),
            Err(failure) => (failure, false),
        };
        shared.counts.db_errors.inc();
        if outage.hit().is_some() {
            tracing::warn!(error = %failure, "seeing to the partitions: {failure}; retrying");
        } else {
            tracing::debug!(error = %failure, "seeing to the partitions: {failure}");
        }
        // A new session either way: whatever failed may be the session's (a server made read
        // only, a lock it kept).
        conn = None;
        if stepped {
            every.tick().await;
        } else {
            backoff.wait().await;
        }
    }
}

/// One round of `run_partitions` on `conn` (opened first if needed), unless another
/// collector's round is under way: the first error of the round's steps, if any (the round
/// went on past it); an error of its own (connecting, its lock) ends it.
async fn partitions_round(
    db: &Db,
    conn: &mut Option<Client>,
    policy: &Policy,
    metrics: &Metrics,
) -> Result<Option<tokio_postgres::Error>, tokio_postgres::Error> {
    let client = match conn {
        Some(client) => client,
        slot => {
            let client = db.connect().await?;
            // The server gives up a statement before this task does: a VACUUM or an index
            // build cut off here is stopped there, not left running with its locks.
            let limit = PARTITIONS_TIMEOUT.as_secs();
            client
                .batch_execute(&format!("SET statement_timeout = '{limit}s'"))
                .await?;
            slot.insert(client)
        }
    };
    if !client
        .query_one("SELECT pg_try_advisory_lock($1)", &[&PARTITIONS_LOCK])
        .await?
        .get::<_, bool>(0)
    {
        tracing::debug!("another collector is seeing to the partitions; skipped this turn");
        return Ok(None);
    }
    let kept = keep_partitions(client, policy, metrics, protocol::now_us()).await;
    let unlock = "SELECT pg_advisory_unlock($1)";
    client.query_one(unlock, &[&PARTITIONS_LOCK]).await?;
    Ok(kept.err())
}

/// Folds (unless another collector is); whether it did.
async fn fold(
    client: &mut Client,
    policy: &Policy,
    own: &Unfolded,
    metrics: &Metrics,
) -> Result<bool, tokio_postgres::Error> {
    let started = std::time::Instant::now();
    let Some(moved) = compact::fold(client, &policy.fold, own).await? else {
        tracing::debug!("another collector is folding; skipped this turn");
        return Ok(false);
    };
    let took = started.elapsed();
    metrics.compactions.inc();
    metrics.compaction_seconds.observe(took);
    tracing::debug!(moved, ?took, "folded {moved} counts in {took:?}");
    Ok(true)
}

/// How far this host's clock may be ahead of the database's before the partitions round says
/// so: an hour, past what the round's own statements take.
const CLOCK_AHEAD_WARNED_US: i64 = HOUR_US;
const HOUR_US: i64 = 3_600_000_000;

/// Creates, drops, vacuums and indexes partitions as the policy says for the day of `now_us`;
/// counts and logs what it did.
pub async fn keep_partitions(
    client: &Client,
    policy: &Policy,
    metrics: &Metrics,
    now_us: i64,
) -> Result<(), tokio_postgres::Error> {
    let today = crate::write::copy::pg_day(now_us);
    // The round's deadline is counted from before this (a connection, a lock): half the grace
    // is left for that.
    let builds = partitions::BuildTime {
        statement: PARTITIONS_TIMEOUT,
        until: std::time::Instant::now() + PARTITIONS_TIMEOUT + PARTITIONS_GRACE / 2,
    };
    let plan = policy.partitions(today);
    let mut done = partitions::maintain(client, &plan, today, builds).await;
    metrics.partitions_created.inc_by(done.created);
    metrics.partitions_dropped.inc_by(done.dropped.len() as u64);
    if done.created > 0 {
        tracing::info!(
            created = done.created,
            "created {} partitions of clicks ahead",
            done.created
        );
    }
    let ahead_us = done
        .database_now_us
        .map_or(0, |db| now_us.saturating_sub(db));
    if ahead_us > CLOCK_AHEAD_WARNED_US {
        let hours = ahead_us / HOUR_US;
        tracing::warn!(
            hours,
            "this host's clock is {hours} hours ahead of the database's: retention is reckoned \
             from the database's day where this host's is later"
        );
    }
    for (name, took) in &done.dropped {
        tracing::info!(
            partition = %name,
            ?took,
            "dropped partition {name} in {took:?}: older than the retention"
        );
    }
    if done.breakdowns_expired > 0 {
        tracing::info!(
            rows = done.breakdowns_expired,
            "deleted {} rows of click_breakdown_counts and click_breakdown_lists: days older \
             than the retention",
            done.breakdowns_expired
        );
    }
    if done.set_aside_expired > 0 {
        tracing::info!(
            rows = done.set_aside_expired,
            "deleted {} rows of clicks_set_aside: set aside before the retention",
            done.set_aside_expired
        );
    }
    if let Some(blocked) = &done.blocked {
        metrics.partitions_blocked.set(blocked.len() as i64);
    }
    for name in done.blocked.iter().flatten() {
        tracing::error!(
            table = %name,
            "{name} is not a partition of clicks (detached and kept, made by hand, or being \
             detached) and holds the name of its day's partition, which cannot be created: \
             that day's clicks wait until it is renamed (ALTER TABLE {name} RENAME TO ...; \
             a detach still pending first needs ALTER TABLE clicks DETACH PARTITION {name} \
             FINALIZE)"
        );
    }
    if done.creation_deferred {
        metrics.partitions_deferred.inc();
        tracing::warn!(
            "creating partitions of clicks waited for its lock on clicks and gave up (another \
             session attaches, detaches or analyzes clicks): tried again next round"
        );
    }
    for name in &done.indexed {
        tracing::info!(partition = %name, "indexed partition {name} by code: its day is over");
    }
    for name in &done.gave_up {
        tracing::warn!(
            partition = %name,
            "building the index by code of {name} was cancelled (by the statement timeout of \
             {}s, or by someone) and given up, not to be tried again round after round: its queries by code read \
             it whole until someone builds it (DROP INDEX CONCURRENTLY {name}_code; CREATE \
             INDEX CONCURRENTLY {name}_code ON {name} (code, clicked_at), in a session without \
             a statement timeout), or drops the index to have the collector try again",
            PARTITIONS_TIMEOUT.as_secs()
        );
    }
    for name in &done.settled {
        tracing::info!(partition = %name, "vacuumed partition {name}: its day is over");
    }
    failed(std::mem::take(&mut done.failed))
}

/// A round's failed steps, each logged with what it was doing (at every round: one that
/// keeps failing, such as a drop refused for a view on the day, needs someone to act); the
/// first is the round's error, counted by the caller.
fn failed(steps: Vec<partitions::Failed>) -> Result<(), tokio_postgres::Error> {
    for step in &steps {
        let error = shared::db::describe(&step.error);
        tracing::warn!(error = %error, "seeing to the partitions, {}: {error}", step.what);
    }
    steps
        .into_iter()
        .next()
        .map_or(Ok(()), |first| Err(first.error))
}

/// Sets the backlog's gauges.
pub(crate) fn show(metrics: &Metrics, waiting: &Backlog) {
    metrics.deltas_pending.set(waiting.counts);
    metrics
        .deltas_oldest_seconds
        .set(waiting.oldest_secs.min(1e9) as i64);
    metrics.breakdowns_pending.set(waiting.breakdowns);
    metrics
        .breakdowns_oldest_seconds
        .set(waiting.breakdowns_oldest_secs.min(1e9) as i64);
}
