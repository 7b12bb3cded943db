//! Reading the links from a hot standby (`--links-database-url` naming a replica): it refuses
//! LISTEN, so the loader finds out at connect and follows the change log by polling instead.
//! Its snapshots list no transaction in progress (`pg_current_snapshot()` leaves out the
//! subtransactions a standby files them all under), so a read there takes every transaction
//! from the snapshot's xmin on as perhaps unseen (`Head::horizon`), and reads their changes
//! again until the oldest running transaction on the primary ends. Everything else a read does
//! (one snapshot per statement, a REPEATABLE READ full load) works on a standby as on the
//! primary.

use tokio_postgres::Client;

use super::Options;

/// Whether the session is on a server in recovery (a hot standby).
pub(super) async fn in_recovery(client: &Client) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .query_one("SELECT pg_is_in_recovery()", &[])
        .await?
        .get(0))
}

/// Says, once per session, how a standby is followed.
pub(super) fn following(options: &Options) {
    tracing::info!(
        "the links database is a hot standby, which cannot LISTEN: reading the change log every \
         {:?} (--reload-interval); a change is served within that plus the replication lag",
        options.poll
    );
}
