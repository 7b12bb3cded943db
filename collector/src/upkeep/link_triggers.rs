//! The modes of the triggers on `links` that log what a logical replication subscription
//! applies (migration 21), set back where they are not theirs: `ALTER TABLE links ENABLE
//! TRIGGER ALL` (a data-only `pg_restore --disable-triggers` ends with it) resets them, and
//! what the subscription applies then goes unseen by the redirectors. At start, and after
//! each pruning of the change log (`maintenance`).

use std::time::Duration;

use shared::throttle::Throttle;
use tokio_postgres::Client;

use super::Metrics;

/// The longest a look waits for each of its locks: on `links`, behind a writer's transaction
/// (every writer of links then waits behind it), and two more when it sets modes back.
pub(crate) const LOCK_WAIT: Duration = Duration::from_secs(1);

/// What a look logs.
#[derive(Debug)]
pub(crate) enum Report<'a> {
    /// Everything: modes set back, triggers disabled or missing, a failure (at start).
    All,
    /// Modes set back, and the first failure of a run of them (`failures`), after each
    /// pruning: a trigger disabled on purpose, or a failure that lasts, is not said again
    /// every interval.
    SetBack { failures: &'a mut Throttle },
}

/// Sets the modes back (`schema::restore_link_trigger_modes`, which reloads every redirector
/// then), waiting at most `lock_wait` for each of its locks, counts what it found in
/// `metrics`, and logs what `report` asks for. A failure (a lock not had in time, links owned
/// by a role this one is not) is counted, not the caller's: clicks need none of it, and the
/// next pruning tries again.
pub(crate) async fn set_back(
    client: &mut Client,
    mut report: Report<'_>,
    lock_wait: Duration,
    metrics: &Metrics,
) {
    let modes = match schema::restore_link_trigger_modes(client, lock_wait).await {
        Ok(modes) => modes,
        Err(e) => {
            metrics.link_trigger_checks_failed.inc();
            // What was not set back still counts (the transaction is rolled back by now).
            if let Ok(found) = schema::link_trigger_modes(client).await {
                metrics.link_triggers_off.set(found.not_firing() as i64);
            }
            let error = shared::db::describe(&e);
            let what = "setting back the modes of the triggers on links";
            let again = "tried again after each pruning";
            match report {
                Report::All => tracing::error!(%error, "{what}: {error}; {again}"),
                Report::SetBack { failures } => match failures.hit() {
                    Some(_) => {
                        tracing::warn!(%error, "{what}: {error}; {again}, said once until it works")
                    }
                    None => tracing::debug!(%error, "{what}: {error}"),
                },
            }
            return;
        }
    };
    if let Report::SetBack { failures } = &mut report {
        failures.end();
    }
    metrics.link_triggers_off.set(modes.not_firing() as i64);
    if let Some(statement) = &modes.set_back {
        metrics
            .link_trigger_modes_set_back
            .inc_by(modes.wrong.len() as u64);
        let wrong: Vec<String> = (modes.wrong.iter())
            .map(|(name, letter)| format!("{name} in mode {letter}"))
            .collect();
        tracing::warn!(
            "triggers on links fired in the wrong sessions ({}; ENABLE TRIGGER ALL leaves mode \
             O): what a logical replication subscription applied went unseen by the \
             redirectors; set back by `{statement}`, and every redirector loads links in full",
            wrong.join(", ")
        );
    }
    if matches!(report, Report::All) {
        for name in &modes.disabled {
            tracing::error!(
                "trigger {name} on links is disabled: what it logs or announces goes unseen by \
                 the redirectors until it is enabled (docs/schema.md)"
            );
        }
        for name in &modes.missing {
            tracing::error!(
                "trigger {name} is missing from links (migration 21 made it): what it logs or \
                 announces goes unseen by the redirectors"
            );
        }
    }
}
