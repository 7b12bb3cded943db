//! The instance lock: a session-level advisory lock, keyed by the collector's instance name,
//! held by the writer's connection. Collectors of different instances (one per host) write to
//! one database at once; two of the same instance never do.
//!
//! What it prevents: a collector that restarts while its predecessor on the same host still
//! drains (whose socket path is already unlinked) would load the senders' seqs before the
//! predecessor's last batches commit, and misjudge the datagrams in them. Waiting for the lock
//! means the predecessor has written everything and exited. Should the lock's session be lost
//! anyway (a database restart, a killed session) while both run, the successor may load seqs
//! the predecessor's batches still under way will move past, and a datagram both then hold be
//! written by each: a batch's claim is its own writer's (`store`), and senders' seqs only
//! keep from moving back. systemd's stop before a start keeps the two from running at once.

use std::time::{Duration, Instant};

use shared::metrics::Gauge;
use shared::throttle::Throttle;
use tokio_postgres::Client;

use crate::write::replication::{NAMED_AFTER, SYNCREP_ADVICE};

/// The lock's key: a 64-bit hash of the instance name, prefixed so that it cannot meet the
/// migrations' key. `hashtextextended` is stable across platforms and versions (hash
/// partitioning depends on it), so every collector computes the same key for a name.
const TRY_LOCK: &str =
    "SELECT pg_try_advisory_lock(hashtextextended('clicks collector ' || $1, 0))";

/// How often a waiting collector asks again. Asking (rather than queueing in
/// `pg_advisory_lock`) leaves no lock request behind in the server when a wait is abandoned.
const POLL: Duration = Duration::from_millis(100);

/// Every how many asks a waiting collector looks at what the lock's holder waits for.
const LOOK_EVERY: u32 = 5;

/// Whether the session that holds the lock of instance $1 waits for synchronous replication,
/// and in which transaction (its start, in Unix microseconds; NULL when it does not wait): a
/// commit of a collector's process before (restarted meanwhile), stuck in `SyncRep`, holds it
/// until a standby confirms the commit. pg_locks shows an advisory lock's 64-bit key as two
/// 32-bit halves.
const HOLDER_WAITS_ON_REPLICATION: &str = "
    SELECT max((extract(epoch FROM a.xact_start) * 1e6)::int8)
               FILTER (WHERE a.wait_event = 'SyncRep')
      FROM (SELECT hashtextextended('clicks collector ' || $1, 0) AS key) AS k,
           pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid
     WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND l.classid = ((k.key >> 32) & 4294967295)::oid
       AND l.objid = (k.key & 4294967295)::oid";

/// Takes the lock of `instance` for `client`'s session, waiting while another session holds
/// it. Kept until the session ends. `wait` (a fresh [`Throttle::per_outage`]) is in a run
/// while another session holds the lock, so that a caller that gives up can tell that from a
/// database that does not answer; the wait is logged once, and its end. A holder whose commit
/// waits for synchronous replication is named as such, and shown in `replication_waiting`
/// (`collector_replication_waiting`) until the lock is taken: a collector restarted while
/// its commit was stuck would otherwise blame a lock, and the alert on the gauge clear.
/// `lock_waiting` (`collector_instance_lock_waiting`) is 1 while another session holds it
/// (the log's line alone said so, and the collector's admin listener answers all the while),
/// and 0 once it is taken or the wait fails; left as it is when the wait is dropped at a
/// deadline, as the writer's next attempt waits on (the writer sets it after each).
pub async fn take(
    client: &Client,
    instance: &str,
    wait: &mut Throttle,
    (replication_waiting, lock_waiting): (&Gauge, &Gauge),
) -> Result<(), tokio_postgres::Error> {
    let mut holder = Holder {
        replication_waiting,
        since: None,
        named: false,
    };
    let mut asked: u32 = 0;
    loop {
        asked = asked.wrapping_add(1);
        let row = match client.query_one(TRY_LOCK, &[&instance]).await {
            Ok(row) => row,
            Err(e) => {
                lock_waiting.set(0);
                return Err(e);
            }
        };
        if row.get::<_, bool>(0) {
            lock_waiting.set(0);
            if wait.end().is_some() {
                tracing::info!(
                    instance,
                    "took the lock of instance {instance:?}: the other writer is gone"
                );
            }
            return Ok(());
        }
        lock_waiting.set(1);
        if wait.hit().is_some() {
            tracing::info!(
                instance,
                "waiting for the lock of instance {instance:?}: another collector of this \
                 instance, or an abandoned connection of this one, is still writing"
            );
        }
        // Not when the writer's watch has named it (its own abandoned session): once is
        // enough.
        let look = holder.named || replication_waiting.get() == 0;
        if look && asked % LOOK_EVERY == 0 {
            if let Some(waits) = holder_waits(client, instance).await {
                holder.saw(waits, instance);
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// What a wait for the lock saw of its holder: the transaction it has waited in SyncRep at
/// every look since when, and whether that is named (`replication_waiting` at 1). Named only
/// after [`NAMED_AFTER`] of one transaction's wait, as the writer's watch does: a healthy
/// standby's commit waits there for milliseconds, and a holder committing batch after batch
/// over a slow link may be seen there at every look, in a new transaction each time.
/// Unnamed once a look finds it no longer waits, and however the wait for the lock ends
/// (taken, an error, the attempt dropped at its deadline).
struct Holder<'a> {
    replication_waiting: &'a Gauge,
    /// The waiting transaction's start (Unix microseconds), and when a look first saw it wait.
    since: Option<(i64, Instant)>,
    named: bool,
}

impl Holder<'_> {
    /// A look's answer: the holder waits in SyncRep in the transaction that began at
    /// `waits` (Unix microseconds), or does not (`None`).
    fn saw(&mut self, waits: Option<i64>, instance: &str) {
        let Some(xact) = waits else {
            self.since = None;
            if std::mem::take(&mut self.named) {
                self.replication_waiting.set(0);
                tracing::info!("the lock's holder no longer waits for synchronous replication");
            }
            return;
        };
        let since = match self.since {
            Some((same, since)) if same == xact => since,
            _ => self.since.insert((xact, Instant::now())).1,
        };
        if self.named || since.elapsed() < NAMED_AFTER {
            return;
        }
        self.named = true;
        self.replication_waiting.set(1);
        tracing::warn!(
            instance,
            "the session that holds the lock of instance {instance:?} (a commit of this \
             instance's process before) has waited over {NAMED_AFTER:?} for synchronous \
             replication (wait_event SyncRep): no synchronous standby confirms it. \
             {SYNCREP_ADVICE}"
        );
    }
}

impl Drop for Holder<'_> {
    fn drop(&mut self) {
        if self.named {
            self.replication_waiting.set(0);
        }
    }
}

/// [`HOLDER_WAITS_ON_REPLICATION`]; `None` if the look fails (unknown: the next ask will
/// say why).
async fn holder_waits(client: &Client, instance: &str) -> Option<Option<i64>> {
    match client
        .query_one(HOLDER_WAITS_ON_REPLICATION, &[&instance])
        .await
    {
        Ok(row) => Some(row.get(0)),
        Err(e) => {
            tracing::debug!("looking at the lock's holder: {}", crate::db::describe(&e));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One look in SyncRep is not a wait (a healthy standby's commit passes through it); one
    /// that lasts is named, and unnamed when it ends or when the wait for the lock ends
    /// however it does.
    #[test]
    fn a_holder_is_named_after_a_wait_that_lasts_and_unnamed_however_the_wait_ends() {
        let gauge = Gauge::default();
        let long_ago = |xact| Some((xact, Instant::now() - NAMED_AFTER));
        let mut holder = Holder {
            replication_waiting: &gauge,
            since: None,
            named: false,
        };
        holder.saw(Some(1), "i");
        assert_eq!(gauge.get(), 0, "a single look");
        holder.since = long_ago(1);
        holder.saw(Some(2), "i");
        assert_eq!(gauge.get(), 0, "another transaction's wait starts over");
        holder.since = long_ago(2);
        holder.saw(Some(2), "i");
        assert_eq!(gauge.get(), 1, "one transaction waited NAMED_AFTER");
        holder.saw(None, "i");
        assert_eq!(gauge.get(), 0, "no longer waits");
        holder.saw(Some(3), "i");
        assert_eq!(gauge.get(), 0, "a new wait starts over");
        holder.since = long_ago(3);
        holder.saw(Some(3), "i");
        assert_eq!(gauge.get(), 1);
        drop(holder);
        assert_eq!(gauge.get(), 0, "the wait for the lock ended");
    }
}
