//! The writer lock: a session-level advisory lock on the writer's connection, so that one
//! collector at a time writes to a database.
//!
//! Without it, a collector started while another still drains (whose socket path is already
//! unlinked) loads the senders' seqs before the other's last batches commit, and counts the
//! datagrams in those batches as lost. Should the lock's session be lost anyway (a database
//! restart, a killed session), nothing is skipped: a batch's claim is its writer's own batch
//! number (`copy`), and senders' seqs only move forward.

use std::time::Duration;

use tokio_postgres::Client;

/// Arbitrary, fixed, and not the migrations' key: "collect" in ASCII.
const KEY: i64 = 0x0063_6f6c_6c65_6374;

/// How often a waiting collector asks again. Asking (rather than queueing in
/// `pg_advisory_lock`) leaves no lock request behind in the server when a wait is abandoned.
const POLL: Duration = Duration::from_millis(100);

/// Takes the lock for `client`'s session, waiting while another session holds it. Kept until
/// the session ends. `*waiting` (false when called) is true while another session holds the
/// lock, so that a caller that gives up can tell that from a database that does not answer.
pub async fn take(client: &Client, waiting: &mut bool) -> Result<(), tokio_postgres::Error> {
    loop {
        let row = client
            .query_one("SELECT pg_try_advisory_lock($1)", &[&KEY])
            .await?;
        if row.get::<_, bool>(0) {
            if std::mem::take(waiting) {
                tracing::info!("took the writer lock: the other writer is gone");
            }
            return Ok(());
        }
        if !*waiting {
            tracing::info!(
                "waiting for the writer lock (advisory lock {KEY:#x}): another collector, or an \
                 abandoned connection of this one, is still writing to this database"
            );
            *waiting = true;
        }
        tokio::time::sleep(POLL).await;
    }
}
