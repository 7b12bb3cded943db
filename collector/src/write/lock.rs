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

use std::time::Duration;

use shared::throttle::Throttle;
use tokio_postgres::Client;

/// The lock's key: a 64-bit hash of the instance name, prefixed so that it cannot meet the
/// migrations' key. `hashtextextended` is stable across platforms and versions (hash
/// partitioning depends on it), so every collector computes the same key for a name.
const TRY_LOCK: &str =
    "SELECT pg_try_advisory_lock(hashtextextended('clicks collector ' || $1, 0))";

/// How often a waiting collector asks again. Asking (rather than queueing in
/// `pg_advisory_lock`) leaves no lock request behind in the server when a wait is abandoned.
const POLL: Duration = Duration::from_millis(100);

/// Takes the lock of `instance` for `client`'s session, waiting while another session holds
/// it. Kept until the session ends. `wait` (a fresh [`Throttle::per_outage`]) is in a run
/// while another session holds the lock, so that a caller that gives up can tell that from a
/// database that does not answer; the wait is logged once, and its end.
pub async fn take(
    client: &Client,
    instance: &str,
    wait: &mut Throttle,
) -> Result<(), tokio_postgres::Error> {
    loop {
        let row = client.query_one(TRY_LOCK, &[&instance]).await?;
        if row.get::<_, bool>(0) {
            if wait.end().is_some() {
                tracing::info!(
                    instance,
                    "took the lock of instance {instance:?}: the other writer is gone"
                );
            }
            return Ok(());
        }
        if wait.hit().is_some() {
            tracing::info!(
                instance,
                "waiting for the lock of instance {instance:?}: another collector of this \
                 instance, or an abandoned connection of this one, is still writing"
            );
        }
        tokio::time::sleep(POLL).await;
    }
}
