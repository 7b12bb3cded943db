//! The modes of the triggers on `links` that log what a logical replication subscription
//! applies (migration 21), set back where they are not theirs: `ALTER TABLE links ENABLE
//! TRIGGER ALL` (a data-only `pg_restore --disable-triggers` ends with it) resets them, and
//! what the subscription applies then goes unseen by the redirectors. At start, and with each
//! pruning of the change log.

use tokio_postgres::Client;

/// What a look at the modes logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Report {
    /// Everything: a mode set back, a trigger disabled, a failure (at start).
    All,
    /// A mode set back only (each pruning: a trigger disabled on purpose, or a failure that
    /// lasts, is not said again every minute).
    SetBack,
}

/// Sets the modes back (`schema::restore_link_trigger_modes`) and logs what `report` asks
/// for. A failure (the lock on `links` not had within its second, `links` owned by a role this
/// one is not) is not the caller's: clicks need none of it, and the next look tries again.
pub(crate) async fn set_back(client: &Client, report: Report) {
    match schema::restore_link_trigger_modes(client).await {
        Ok(found) => {
            for (found, set_back) in found {
                match (set_back, report) {
                    (true, _) => tracing::warn!("{found}"),
                    (false, Report::All) => tracing::error!("{found}"),
                    (false, Report::SetBack) => tracing::debug!("{found}"),
                }
            }
        }
        Err(e) => {
            let error = shared::db::describe(&e);
            let what = "setting back the modes of the triggers on links";
            match report {
                Report::All => {
                    tracing::error!(%error, "{what}: {error}; tried again with the next pruning")
                }
                Report::SetBack => tracing::debug!(%error, "{what}: {error}"),
            }
        }
    }
}
