//! What replication does to the writer's commits: whether they wait for a standby, a commit
//! stuck waiting for one, and commits a failover lost.
//!
//! - At each connect the writer reads `synchronous_standby_names` (its own session sets
//!   `synchronous_commit = on`, `store::Conn::prepare`): with a name there, a commit returns
//!   only once a synchronous standby has it, so a failover to that standby loses nothing
//!   acknowledged. Logged, and the gauge `collector_database_synchronous`. Read again after a
//!   write every [`SETTINGS_EVERY`], and by the watch as it names a wait: a reload changes it
//!   under a session that stays (a failover manager clears it when the standby goes).
//! - A commit waits for a synchronous standby forever when none confirms it (none connected,
//!   or a promoted standby that kept its primary's `synchronous_standby_names`). Its backend
//!   then holds the instance lock, so without a look from outside it reads as a timeout and
//!   then as a lock held by another session. [`Watch::run`], on a second session, looks at
//!   the writer's backends (by pid and start) in `pg_stat_activity` while a write takes
//!   long, and names a `SyncRep` wait: logged with the setting to look at,
//!   `collector_replication_waiting`, `collector_replication_waits_total`.
//! - With asynchronous replication, a standby promoted after its primary died may lack
//!   commits this collector made and acknowledged: the senders have forgotten those clicks.
//!   On every new connection the writer compares `click_senders` there with what it
//!   committed itself, and with what the processes of its instance before it had committed
//!   as it started ([`Committed`]: a restart just before a failover must not hide their last
//!   commits; a row missing for a sender last committed 29 days ago or more may have been
//!   pruned, and is passed over); what is missing is counted in
//!   `collector_clicks_unaccounted_total` (as a resync counts it after a restart), but the
//!   clicks the lost batches passed over (counted as they committed, in no row), and the
//!   record put back, so that nothing is counted twice and no sender is asked for what it no
//!   longer holds.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use crate::db::{describe, Db};
use crate::metrics::Common;
use crate::write::batch::{Batch, Noted, SenderColumns};
use crate::write::store::{BatchNumber, ADVANCE_SENDERS};
use crate::write::Metrics;

/// How often the watch looks while a write is in flight.
const POLL: Duration = Duration::from_millis(500);
/// A write slower than this is looked at: a commit that waits on a standby that answers takes
/// milliseconds, so by then a `SyncRep` wait is a standby that does not.
const LOOK_AFTER: Duration = Duration::from_secs(1);
/// A `SyncRep` wait this long is named. Short enough to be named well within the write
/// timeout (30 s by default), long enough that a standby catching up is not.
pub const NAMED_AFTER: Duration = Duration::from_secs(2);
/// How often the writer reads its session's replication settings again, after a write.
const SETTINGS_EVERY: Duration = Duration::from_secs(5);

/// What a named SyncRep wait's warning tells the operator to look at, and the usual fix.
pub const SYNCREP_ADVICE: &str = "Look at synchronous_standby_names on the server and at \
     pg_stat_replication: a standby down, or a promoted standby that kept its primary's \
     setting (clear it: ALTER SYSTEM SET synchronous_standby_names = ''; SELECT \
     pg_reload_conf())";

/// Which of `backends` the server still runs (the same pid started at the same time), and one
/// of them waiting in `SyncRep`.
async fn look(
    client: &Client,
    backends: &[Backend],
) -> Result<(Vec<Backend>, Option<Backend>), tokio_postgres::Error> {
    let pids: Vec<i32> = backends.iter().map(|b| b.pid).collect();
    let starts: Vec<i64> = backends.iter().map(|b| b.started_us).collect();
    let rows = client
        .query(
            &format!(
                "SELECT pid, {STARTED_US}, coalesce(wait_event, '') = 'SyncRep' \
                   FROM pg_stat_activity \
                  WHERE (pid, {STARTED_US}) IN (SELECT * FROM unnest($1::int4[], $2::int8[]))"
            ),
            &[&pids, &starts],
        )
        .await?;
    let live: Vec<Backend> = rows
        .iter()
        .map(|r| Backend {
            pid: r.get(0),
            started_us: r.get(1),
        })
        .collect();
    let waiting = live
        .iter()
        .zip(&rows)
        .find(|(_, r)| r.get(2))
        .map(|(b, _)| *b);
    Ok((live, waiting))
}

/// The replication settings a session sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub standby_names: String,
    pub commit: String,
}

impl Settings {
    /// Whether a commit waits for a standby.
    pub fn synchronous(&self) -> bool {
        !self.standby_names.trim().is_empty()
            && matches!(self.commit.as_str(), "on" | "remote_write" | "remote_apply")
    }
}

/// Reads the settings of `client`'s session (after `Conn::prepare` set `synchronous_commit`).
pub async fn settings(client: &Client) -> Result<Settings, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT current_setting('synchronous_standby_names'), \
                    current_setting('synchronous_commit')",
            &[],
        )
        .await?;
    Ok(Settings {
        standby_names: row.get(0),
        commit: row.get(1),
    })
}

/// What the writer and the watch share.
pub struct Watch {
    metrics: Arc<Metrics>,
    state: Mutex<State>,
}

/// A backend of the writer's, by its pid and when it started: after a failover the watch
/// looks on another server, where the pid of a session abandoned on the old one may be
/// another backend's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Backend {
    pid: i32,
    started_us: i64,
}

/// A backend's start in microseconds, the form [`Backend::started_us`] keeps.
const STARTED_US: &str = "(extract(epoch FROM backend_start) * 1000000)::int8";

#[derive(Default)]
struct State {
    /// Since when the writer has been writing the current batch (retries included).
    writing_since: Option<Instant>,
    /// The backends of the writer's sessions: the current one, and abandoned ones until they
    /// are gone (an abandoned commit stuck in `SyncRep` keeps its backend, and the lock).
    backends: Vec<Backend>,
    /// The settings last read (logged when they change), and when.
    settings: Option<Settings>,
    settings_read: Option<Instant>,
    /// Since when a backend of the writer is seen waiting in `SyncRep`.
    sync_wait: Option<Instant>,
    named: bool,
}

impl Watch {
    pub fn new(metrics: Arc<Metrics>) -> Arc<Watch> {
        Arc::new(Watch {
            metrics,
            state: Mutex::new(State::default()),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new writer session (or start-up's, which the writer goes on with): its backend is
    /// watched, and its settings read ([`Watch::reread`]).
    pub async fn connected(&self, client: &Client) -> Result<(), tokio_postgres::Error> {
        let row = client
            .query_one(
                &format!(
                    "SELECT pid, {STARTED_US} FROM pg_stat_activity WHERE pid = pg_backend_pid()"
                ),
                &[],
            )
            .await?;
        let backend = Backend {
            pid: row.get(0),
            started_us: row.get(1),
        };
        {
            let mut state = self.state();
            if state.backends.last() != Some(&backend) {
                state.backends.push(backend);
            }
        }
        self.reread(client).await
    }

    /// Whether the writer's settings were read [`SETTINGS_EVERY`] ago or more.
    pub fn settings_due(&self) -> bool {
        let read = self.state().settings_read;
        read.map_or(true, |at| at.elapsed() >= SETTINGS_EVERY)
    }

    /// Reads the settings of the writer's session `client` again.
    pub async fn reread(&self, client: &Client) -> Result<(), tokio_postgres::Error> {
        self.note(settings(client).await?);
        Ok(())
    }

    /// Settings as read: shown in `collector_database_synchronous`, logged when they change.
    fn note(&self, settings: Settings) {
        self.metrics
            .database_synchronous
            .set(i64::from(settings.synchronous()));
        let mut state = self.state();
        state.settings_read = Some(Instant::now());
        if state.settings.as_ref() != Some(&settings) {
            if settings.synchronous() {
                tracing::info!(
                    "commits are replicated synchronously (synchronous_standby_names = {:?}, \
                     synchronous_commit = {}): a failover to a synchronous standby loses \
                     nothing acknowledged",
                    settings.standby_names,
                    settings.commit
                );
            } else {
                tracing::info!(
                    "commits are not replicated synchronously (synchronous_standby_names = \
                     {:?}): a failover to a standby can lose commits already acknowledged; \
                     they would be counted in collector_clicks_unaccounted_total",
                    settings.standby_names
                );
            }
            state.settings = Some(settings);
        }
    }

    /// The writer starts writing a batch (or start-up its first commits).
    pub fn writing(&self) {
        self.state().writing_since = Some(Instant::now());
    }

    /// The writer's batch is in.
    pub fn written(&self) {
        let mut state = self.state();
        state.writing_since = None;
        // Only the current session's backend stays watched: the others' are gone or ending.
        let keep = state.backends.len().saturating_sub(1);
        state.backends.drain(..keep);
        drop(state);
        self.waited_out();
    }

    /// What holds the writer up, if the watch has named it: for the writer's own lines about
    /// a timeout or a lock held, which would otherwise blame the database or a lock.
    pub fn cause(&self) -> Option<String> {
        let state = self.state();
        let names = state.settings.as_ref().map(|s| s.standby_names.as_str());
        state.named.then(|| {
            format!(
                "a commit of this collector waits for synchronous replication (SyncRep): no \
                 synchronous standby confirms it; see synchronous_standby_names ({:?}) and \
                 pg_stat_replication",
                names.unwrap_or("?")
            )
        })
    }

    /// The wait is over (or never was).
    fn waited_out(&self) {
        let mut state = self.state();
        let since = state.sync_wait.take();
        let named = std::mem::take(&mut state.named);
        drop(state);
        if named {
            self.metrics.replication_waiting.set(0);
            let lasted = since.map(|s| s.elapsed()).unwrap_or_default();
            tracing::info!(
                "the commit waiting for synchronous replication went on after {lasted:?}"
            );
        }
    }

    /// Watches the writer's backends from a session of its own, for as long as the process
    /// runs: while a write takes longer than [`LOOK_AFTER`], every [`POLL`].
    pub async fn run(self: Arc<Watch>, db: Db, timeout: Duration) {
        let mut session: Option<Client> = None;
        loop {
            tokio::time::sleep(POLL).await;
            let (slow, backends) = {
                let state = self.state();
                let slow = state
                    .writing_since
                    .is_some_and(|s| s.elapsed() >= LOOK_AFTER);
                (slow, state.backends.clone())
            };
            if !slow || backends.is_empty() {
                self.waited_out();
                continue;
            }
            let looking = async {
                let client = match session.take() {
                    Some(client) => client,
                    None => db.connect().await?,
                };
                let found = look(&client, &backends).await?;
                let names = client
                    .query_one("SELECT current_setting('synchronous_standby_names')", &[])
                    .await?
                    .get::<_, String>(0);
                session = Some(client);
                Ok::<_, tokio_postgres::Error>((found, names))
            };
            let ((live, waiting), names) = match tokio::time::timeout(timeout, looking).await {
                Ok(Ok(found)) => found,
                Ok(Err(e)) => {
                    tracing::debug!("looking at the writer's sessions: {}", describe(&e));
                    continue;
                }
                Err(_) => continue,
            };
            self.seen(&live, waiting, names);
        }
    }

    /// What one look found: the writer's backends still there, one waiting in `SyncRep`, and
    /// `synchronous_standby_names` as the server has it now (the writer's, read before the
    /// wait, may be from before a reload: the one that made it wait).
    fn seen(&self, live: &[Backend], waiting: Option<Backend>, names: String) {
        let mut state = self.state();
        // Abandoned backends that ended are no longer watched; the newest (current) always is.
        let current = state.backends.last().copied();
        state
            .backends
            .retain(|b| live.contains(b) || Some(*b) == current);
        let Some(Backend { pid, .. }) = waiting else {
            drop(state);
            self.waited_out();
            return;
        };
        let since = *state.sync_wait.get_or_insert_with(Instant::now);
        if state.named || since.elapsed() < NAMED_AFTER {
            return;
        }
        state.named = true;
        // The writer's own `synchronous_commit`: a session of the watch's has the server's.
        let commit = state.settings.as_ref().map(|s| s.commit.clone());
        drop(state);
        self.note(Settings {
            standby_names: names.clone(),
            commit: commit.unwrap_or_else(|| "on".to_owned()),
        });
        self.metrics.replication_waiting.set(1);
        self.metrics.replication_waits.inc();
        tracing::warn!(
            "a commit of this collector (backend {pid}) has waited over {NAMED_AFTER:?} for \
             synchronous replication (wait_event SyncRep): no synchronous standby confirms it. \
             The batch is kept, and its backend holds the instance lock until the commit is \
             confirmed. synchronous_standby_names is now {names:?}. {SYNCREP_ADVICE}"
        );
    }
}

/// Each sender's seq and clicks as this process committed them, to check a new connection's
/// database against: one that lacks them lost acknowledged commits in a failover.
#[derive(Debug, Default)]
pub struct Committed {
    /// Each sender's last commit: its seq, its clicks, and when the attempt that stored it
    /// began (no later than the transaction's `updated_at`, which the prune goes by).
    senders: HashMap<u64, Commit>,
    /// The latest of its batches whose sender records passed clicks over (a datagram rejected
    /// whole, or skipped by a resync: counted as the batch committed, in `clicks_rejected` or
    /// `clicks_unaccounted`, and in no row; or what a resync claimed past what its datagrams
    /// hold, in rows long before: `PassedOver::uncounted`): each one's number and those clicks
    /// per sender, oldest first, at most [`PASSED_OVER_KEPT`]. A failover that lost such a
    /// batch lost no clicks by them: they are not counted as unaccounted.
    passed_over: VecDeque<(i64, Vec<(u64, u64)>)>,
    /// Senders whose loss a check counted: the ranges of their clicks (after the first,
    /// through the last, in the sender's running count, which never goes back) counted,
    /// disjoint and in order. A later check counts of such a sender only what it lacks
    /// outside them: on the same server, when the put-back failed, nothing; after another
    /// failover to a server that lacks the put-back too, only what that one lacks more. Kept
    /// until the sender is forgotten: a server that has a record whole says nothing of its
    /// standbys.
    counted: HashMap<u64, Vec<(u64, u64)>>,
    /// Set by a new connection: check before the next write.
    check: bool,
}

/// Batches [`Committed::passed_over`] keeps: far more than an asynchronous standby lags by.
const PASSED_OVER_KEPT: usize = 1024;

impl Committed {
    /// What the processes of `instance` before this one committed, as `click_senders` has it
    /// at start: each sender's seq and clicks, and when it was committed. A new session is
    /// checked against these as against this process's own commits, so that a failover that
    /// lost the last commits of the process before (restarted just before it, so that this
    /// one committed nothing of those senders yet) is counted too: the senders' next
    /// datagrams would otherwise be taken at the seqs this process loaded, and the loss go
    /// unseen. Which of their batches passed clicks over is not known: if a failover lost one
    /// of those, its passed-over clicks are counted again, as unaccounted.
    pub(crate) async fn of_instance(
        client: &Client,
        instance: &str,
    ) -> Result<Committed, tokio_postgres::Error> {
        let rows = client
            .query(
                "SELECT sender, last_seq, clicks, \
                        (extract(epoch FROM now() - updated_at) * 1e6)::int8, \
                        reply_to, reply_uid \
                   FROM click_senders WHERE instance = $1 \
                  ORDER BY updated_at DESC LIMIT $2",
                &[&instance, &(protocol::senders::MAX_SENDERS as i64)],
            )
            .await?;
        let now = Instant::now();
        let senders = rows
            .iter()
            .map(|r| {
                // Stored as bigint: the u64 bits reinterpreted.
                let column = |i| r.get::<_, i64>(i) as u64;
                let age = Duration::from_micros(r.get::<_, i64>(3).max(0) as u64);
                // Put back after a failover, the record keeps its address.
                let noted = Noted::at(column(1), column(2)).replying(r, 4);
                let at = now.checked_sub(age);
                (column(0), Commit { noted, at })
            })
            .collect();
        Ok(Committed {
            senders,
            ..Committed::default()
        })
    }

    /// `batch` is about to be written: the senders it forgets are not checked from now on.
    /// Their rows go with its commit, which may land even though its answer is lost: the
    /// retry's check must not take them for rows a failover lost.
    pub fn forget(&mut self, batch: &Batch) {
        for sender in batch.forgotten_column() {
            self.senders.remove(&(sender as u64));
            self.counted.remove(&(sender as u64));
        }
    }

    /// `batch` committed as batch `number`, by an attempt that began `at`.
    pub fn add(&mut self, batch: &Batch, number: i64, at: Instant) {
        if batch.passed_over_by().len() > 0 {
            if self.passed_over.len() == PASSED_OVER_KEPT {
                self.passed_over.pop_front();
            }
            self.passed_over
                .push_back((number, batch.passed_over_by().collect()));
        }
        for (sender, noted) in batch.noted() {
            let commit = Commit {
                noted,
                at: Some(at),
            };
            let entry = self.senders.entry(sender).or_insert(commit);
            if commit.noted.seq >= entry.noted.seq {
                *entry = commit;
            }
        }
        // Noted and then forgotten while the batch filled: its row went with the batch.
        self.forget(batch);
    }

    /// The writer opened a new session (not its first): check it before writing.
    pub fn reconnected(&mut self) {
        self.check = !self.senders.is_empty();
    }

    /// On a new session: compares `click_senders` with what this process committed, counts
    /// what is missing as unaccounted (but the clicks that the batches missing, by
    /// `click_writers`, passed over), and puts the records back. `number`: this writer and its
    /// instance. Returns the clicks counted.
    pub(crate) async fn check(
        &mut self,
        client: &Client,
        number: &BatchNumber,
        counts: &Common,
    ) -> Result<u64, tokio_postgres::Error> {
        if !self.check {
            return Ok(0);
        }
        let last = "SELECT last_batch FROM click_writers WHERE writer = $1";
        let last = client.query_opt(last, &[&number.writer]).await?;
        let passed_over = self.passed_over_after(last.map_or(0, |r| r.get(0)));
        let ids: Vec<i64> = self.senders.keys().map(|&s| s as i64).collect();
        let rows = client
            .query(
                "SELECT sender, last_seq, clicks FROM click_senders WHERE sender = ANY($1)",
                &[&ids],
            )
            .await?;
        let there: HashMap<u64, (u64, u64)> = rows
            .iter()
            .map(|r| {
                let column = |i| r.get::<_, i64>(i) as u64;
                (column(0), (column(1), column(2)))
            })
            .collect();
        let Behind {
            senders: behind,
            datagrams,
            passed_over,
            ..
        } = self.behind(&there, &passed_over, Instant::now());
        let clicks = self.not_counted_yet(&behind);
        if !behind.is_empty() {
            let mut rows = SenderColumns::default();
            for (sender, noted, _) in &behind {
                rows.push(*sender, noted);
            }
            counts.clicks_unaccounted.inc_by(clicks);
            tracing::warn!(
                "the database lacks commits this collector made and acknowledged: {} senders \
                 behind by {datagrams} datagrams, {clicks} clicks (and {passed_over} passed \
                 over, counted as they committed or in rows before). It failed over to a \
                 standby that had not received them (asynchronous replication); the senders \
                 no longer hold them. \
                 Counted in collector_clicks_unaccounted_total; their records are put back, \
                 and writing goes on",
                behind.len()
            );
            client
                .execute(ADVANCE_SENDERS, &rows.params(&number.instance))
                .await?;
        }
        self.check = false;
        Ok(clicks)
    }

    /// Of what the senders `behind` lack (the last `lacks` of their `noted.clicks`), the
    /// clicks no earlier check counted; notes them as counted.
    fn not_counted_yet(&mut self, behind: &[(u64, Noted, u64)]) -> u64 {
        let mut clicks = 0;
        for &(sender, noted, lacks) in behind {
            let (from, to) = (noted.clicks.saturating_sub(lacks), noted.clicks);
            let ranges = self.counted.entry(sender).or_default();
            let already: u64 = ranges
                .iter()
                .map(|&(f, t)| to.min(t).saturating_sub(from.max(f)))
                .sum();
            clicks += lacks - already.min(lacks);
            add_range(ranges, (from, to));
        }
        clicks
    }

    /// The clicks passed over per sender by this process's batches after `last`, the last one
    /// the database has.
    fn passed_over_after(&self, last: i64) -> HashMap<u64, u64> {
        let mut by_sender = HashMap::new();
        for (_, passed) in self.passed_over.iter().filter(|(n, _)| *n > last) {
            for &(sender, clicks) in passed {
                let sum = by_sender.entry(sender).or_default();
                *sum = clicks.saturating_add(*sum);
            }
        }
        by_sender
    }

    /// What the database's rows (`there`) lack of this process's commits. A sender last
    /// committed longer ago than the collector's memory keeps an idle one may have had its row
    /// pruned (a day later than that, by `updated_at`): its missing row is no sign of a failover.
    /// A row behind is, at any age: the prune deletes rows, and a row never goes back. Of a
    /// sender's clicks missing, those its lost batches passed over (`passed_over`, per sender)
    /// were counted as they committed, or are in rows from before: apart.
    fn behind(
        &self,
        there: &HashMap<u64, (u64, u64)>,
        passed_over: &HashMap<u64, u64>,
        now: Instant,
    ) -> Behind {
        let mut behind = Behind::default();
        for (&sender, c) in &self.senders {
            let row = there.get(&sender).copied();
            let missing = row.is_none();
            let (db_seq, db_clicks) = row.unwrap_or((0, 0));
            let pruned_maybe = match c.at {
                Some(at) => now.saturating_duration_since(at) >= protocol::senders::IDLE,
                None => true,
            };
            if missing && pruned_maybe {
                continue;
            }
            let n = c.noted;
            if missing || db_seq < n.seq {
                let datagrams = n.seq.saturating_sub(db_seq) + u64::from(missing);
                behind.datagrams = behind.datagrams.saturating_add(datagrams);
                let missing = n.clicks.saturating_sub(db_clicks);
                let passed = passed_over.get(&sender).map_or(0, |&p| p.min(missing));
                behind.clicks = behind.clicks.saturating_add(missing - passed);
                behind.passed_over = behind.passed_over.saturating_add(passed);
                behind.senders.push((sender, n, missing - passed));
            }
        }
        behind
    }
}

/// Ranges of a sender's clicks [`Committed::counted`] keeps: past them the two lowest are
/// merged, the clicks between them taken as counted (a loss of those, a third failover later,
/// would go uncounted rather than be counted twice).
const COUNTED_RANGES: usize = 16;

/// Adds the clicks `(from, to]` to `ranges` (disjoint, in order), merged with those it meets.
fn add_range(ranges: &mut Vec<(u64, u64)>, (from, to): (u64, u64)) {
    if from >= to {
        return;
    }
    let (mut from, mut to) = (from, to);
    ranges.retain(|&(f, t)| {
        let meets = f <= to && from <= t;
        if meets {
            (from, to) = (from.min(f), to.max(t));
        }
        !meets
    });
    let at = ranges.partition_point(|&(f, _)| f < from);
    ranges.insert(at, (from, to));
    if ranges.len() > COUNTED_RANGES {
        let (_, second_to) = ranges.remove(1);
        ranges[0].1 = second_to;
    }
}

#[derive(Debug, Clone, Copy)]
struct Commit {
    noted: Noted,
    /// `None`: longer ago than an `Instant` reaches back (a record loaded at start). On Linux
    /// an `Instant` goes back past the boot, so a record older than the boot has one too, and
    /// `None` takes an age past any clock's.
    at: Option<Instant>,
}

/// Senders whose rows lack commits of this process, as committed, to put back, each with the
/// clicks it lacks; the datagrams and clicks missing, and apart the clicks missing that were
/// passed over.
#[derive(Debug, Default)]
struct Behind {
    senders: Vec<(u64, Noted, u64)>,
    datagrams: u64,
    clicks: u64,
    passed_over: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::write::batch::PassedOver;

    /// What a new session's rows lack of this process's commits is lost to a failover, except
    /// for the missing row of a sender last committed longer ago than memory keeps an idle
    /// one, which the prune may have taken; and the clicks passed over by the batches lost
    /// (after the database's last), each sender's at most what it lacks, are apart.
    #[test]
    fn a_row_missing_or_behind_counts_as_lost_unless_it_may_have_been_pruned() {
        let start = Instant::now();
        let hour_later = start + Duration::from_secs(3600);
        let batch = |senders: &[(u64, u64, u64)]| {
            let mut batch = Batch::default();
            for &(sender, seq, clicks) in senders {
                batch.note_sender(sender, Noted::at(seq, clicks));
            }
            batch
        };
        let passing = |mut batch: Batch, passed: &[(u64, u64, u64)]| {
            for &(sender, rejected, unaccounted) in passed {
                let clicks = PassedOver {
                    rejected,
                    unaccounted,
                    ..PassedOver::default()
                };
                batch.pass_over(sender, clicks);
            }
            batch
        };
        let mut c = Committed::default();
        let kept = batch(&[(1, 2, 20), (5, 3, 30), (6, 8, 80)]);
        c.add(&passing(kept, &[(6, 5, 0)]), 1, start);
        c.add(&batch(&[(1, 4, 40)]), 2, start);
        let recent = [(2, 9, 90), (3, 5, 50), (4, 7, 70), (5, 6, 60)];
        let recent = passing(
            batch(&recent),
            &[(4, 30, 0), (2, 0, 6), (3, 7, 0), (2, 4, 0)],
        );
        c.add(&recent, 3, hour_later);
        let there = HashMap::from([(3, (5, 50)), (4, (5, 52)), (6, (3, 30))]);
        let passed_over = c.passed_over_after(1);
        assert_eq!(passed_over, HashMap::from([(2, 10), (3, 7), (4, 30)]));
        let behind = c.behind(&there, &passed_over, start + protocol::senders::IDLE);
        let mut lacking: Vec<_> = behind
            .senders
            .iter()
            .map(|(sender, noted, _)| (*sender, noted.seq, noted.clicks))
            .collect();
        lacking.sort();
        // 1: old and missing, maybe pruned. 3: as committed. 5: committed again since.
        // 6: old, but behind rather than missing.
        let lost = [(2, 9, 90), (4, 7, 70), (5, 6, 60), (6, 8, 80)];
        assert_eq!(lacking, lost);
        assert_eq!(behind.datagrams, 10 + 2 + 7 + 5);
        // 2 lacks 90, 10 of them passed over; 4 lacks 18, all passed over (30 at most).
        assert_eq!(behind.clicks, 80 + 60 + 50);
        assert_eq!(behind.passed_over, 10 + 18);
    }

    /// A check whose put-back failed counted its senders' loss: the next one counts of each
    /// only what it lacks beyond that (nothing on the same server; on another, after a second
    /// failover, what that one lacks more), until the records are put back.
    /// Two failovers in a row: the first server lacked a sender's last commits, counted and
    /// put back; the second lacks the put-back too (it had not replicated yet). Counted once.
    #[tokio::test]
    async fn a_second_failover_that_lacks_the_put_back_counts_nothing_again() {
        let db = testkit::pgtest::test_db().await;
        let client = testkit::pgtest::connect(&db.url).await;
        let counts = Common::register(&mut Default::default());
        let number = BatchNumber {
            writer: 1,
            instance: "here".into(),
            batch: 1,
        };
        let mut c = Committed::default();
        let mut batch = Batch::default();
        batch.note_sender(7, Noted::at(5, 500));
        c.add(&batch, 1, Instant::now());
        let lost = "INSERT INTO click_senders (sender, last_seq, clicks, instance)
                    VALUES (7, 2, 200, 'here')
                    ON CONFLICT (sender) DO UPDATE SET last_seq = 2, clicks = 200";
        client.execute(lost, &[]).await.unwrap();
        c.reconnected();
        assert_eq!(c.check(&client, &number, &counts).await.unwrap(), 300);
        let row = "SELECT last_seq, clicks FROM click_senders WHERE sender = 7";
        let row = client.query_one(row, &[]).await.unwrap();
        assert_eq!(
            (row.get::<_, i64>(0), row.get::<_, i64>(1)),
            (5, 500),
            "put back"
        );

        client.execute(lost, &[]).await.unwrap();
        c.reconnected();
        assert_eq!(c.check(&client, &number, &counts).await.unwrap(), 0);
        assert_eq!(counts.clicks_unaccounted.get(), 300, "counted once");
    }

    /// The commits of the process before, lost in a failover, are put back with the address
    /// their sender replies at: without it, the next start would let any allowed process
    /// claim the sender's id first.
    #[tokio::test]
    async fn a_record_of_the_process_before_is_put_back_with_its_address() {
        let db = testkit::pgtest::test_db().await;
        let client = testkit::pgtest::connect(&db.url).await;
        let counts = Common::register(&mut Default::default());
        let recorded = "INSERT INTO click_senders
                            (sender, last_seq, clicks, instance, reply_to, reply_uid)
                        VALUES (7, 5, 500, 'here', '/run/redirector/ack.sock', 1000)";
        client.execute(recorded, &[]).await.unwrap();
        let mut c = Committed::of_instance(&client, "here").await.unwrap();
        client
            .execute("DELETE FROM click_senders WHERE sender = 7", &[])
            .await
            .unwrap();
        c.reconnected();
        let number = BatchNumber {
            writer: 1,
            instance: "here".into(),
            batch: 1,
        };
        assert_eq!(c.check(&client, &number, &counts).await.unwrap(), 500);
        let row = "SELECT last_seq, convert_from(reply_to, 'UTF8'), reply_uid
                     FROM click_senders WHERE sender = 7";
        let row = client.query_one(row, &[]).await.unwrap();
        assert_eq!(
            (
                row.get::<_, i64>(0),
                row.get::<_, String>(1),
                row.get::<_, i64>(2)
            ),
            (5, "/run/redirector/ack.sock".to_owned(), 1000),
            "put back whole"
        );
    }

    #[test]
    fn a_loss_counted_is_not_counted_again_until_a_check_finds_the_record_whole() {
        let mut c = Committed::default();
        // Each check: the sender's clicks committed, what the server lacks of them (None: the
        // record whole), the clicks to count, why.
        let checks = [
            (300, Some(100), 100, "a first loss"),
            (300, Some(100), 0, "the same server"),
            (300, Some(300), 200, "a server lacking more"),
            (300, Some(300), 0, "that server again"),
            (
                300,
                Some(100),
                0,
                "put back, then a failover to one that lacks the put-back",
            ),
            (
                400,
                Some(150),
                100,
                "committed on since, and that lost too: only what is new",
            ),
            (400, None, 0, "a check that finds it whole"),
            (
                400,
                Some(300),
                0,
                "whole on one server says nothing of its standby",
            ),
            (900, Some(100), 100, "a later loss, apart from the first"),
            (
                900,
                Some(800),
                400,
                "a server lacking both and what is between them",
            ),
        ];
        for (clicks, lacks, want, why) in checks {
            let behind: Vec<_> = lacks
                .map(|l| (7, Noted::at(3, clicks), l))
                .into_iter()
                .collect();
            assert_eq!(c.not_counted_yet(&behind), want, "{why}");
        }
    }

    #[test]
    fn counted_ranges_merge_where_they_meet_and_stay_bounded() {
        let mut ranges = Vec::new();
        add_range(&mut ranges, (10, 20));
        add_range(&mut ranges, (30, 40));
        add_range(&mut ranges, (0, 5));
        assert_eq!(ranges, [(0, 5), (10, 20), (30, 40)]);
        add_range(&mut ranges, (15, 30));
        assert_eq!(ranges, [(0, 5), (10, 40)]);
        add_range(&mut ranges, (7, 7));
        assert_eq!(ranges, [(0, 5), (10, 40)], "an empty range adds nothing");
        for i in 0..40 {
            add_range(&mut ranges, (100 + 10 * i, 105 + 10 * i));
        }
        assert_eq!(ranges.len(), COUNTED_RANGES);
        assert_eq!(ranges[0].0, 0);
        assert_eq!(ranges.last(), Some(&(490, 495)));
    }

    #[test]
    fn synchronous_only_with_a_standby_name_and_a_waiting_commit() {
        let s = |names: &str, commit: &str| Settings {
            standby_names: names.into(),
            commit: commit.into(),
        };
        assert!(s("*", "on").synchronous());
        assert!(s("FIRST 1 (a, b)", "remote_apply").synchronous());
        assert!(s("standby1", "remote_write").synchronous());
        assert!(!s("", "on").synchronous());
        assert!(!s(" ", "remote_apply").synchronous());
        assert!(!s("*", "local").synchronous());
        assert!(!s("*", "off").synchronous());
    }

    #[test]
    fn a_wait_is_named_once_after_a_while_and_cleared_when_it_ends() {
        let metrics = Arc::new(Metrics::default());
        let watch = Watch::new(metrics.clone());
        let b = |pid| Backend {
            pid,
            started_us: 1_000,
        };
        let names = || "standby1".to_owned();
        watch.state().backends = vec![b(7), b(8)];
        watch.seen(&[b(8)], Some(b(8)), names());
        assert_eq!(
            watch.state().backends,
            [b(8)],
            "the ended backend is no longer watched"
        );
        assert!(watch.cause().is_none(), "not named at once");
        watch.state().sync_wait = Some(Instant::now() - NAMED_AFTER);
        watch.seen(&[b(8)], Some(b(8)), names());
        watch.seen(&[b(8)], Some(b(8)), names());
        assert_eq!(metrics.replication_waits.get(), 1);
        assert_eq!(metrics.replication_waiting.get(), 1);
        let cause = watch.cause().unwrap();
        assert!(
            cause.contains(r#"synchronous_standby_names ("standby1")"#),
            "{cause}"
        );
        assert_eq!(metrics.database_synchronous.get(), 1, "the names seen");
        watch.seen(&[b(8)], None, names());
        assert_eq!(metrics.replication_waiting.get(), 0);
        assert!(watch.cause().is_none());
    }

    #[tokio::test]
    async fn a_backend_is_the_writers_only_with_the_start_it_was_seen_with() {
        let db = testkit::pgtest::test_db().await;
        let writer = testkit::pgtest::connect(&db.url).await;
        let metrics = Arc::new(Metrics::default());
        let watch = Watch::new(metrics);
        watch
            .connected(&writer)
            .await
            .expect("the writer's backend");
        let seen = watch.state().backends[0];
        let other = testkit::pgtest::connect(&db.url).await;
        let (live, waiting) = look(&other, &[seen]).await.expect("a look");
        assert_eq!(live, [seen]);
        assert_eq!(waiting, None);
        // The same pid started at another time: another server's backend after a failover.
        let reused = Backend {
            started_us: seen.started_us - 1,
            ..seen
        };
        let (live, _) = look(&other, &[reused]).await.expect("a look");
        assert_eq!(live, [], "a backend of the same pid but another start");
    }
}
