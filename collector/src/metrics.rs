//! What the admin listener serves: the metrics more than one component counts (each
//! component's own are declared and registered with it: `ingest`, `write`, `upkeep`), the
//! health, and the view of both.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use shared::metrics::{Counter, Gauge, LabeledCounter, Registry};

shared::metrics! {
    /// What more than one component counts: the writer, the fold and start-up fail on the
    /// database; the receive loop adds the clicks the writer takes away; a resync (ingest) and
    /// a failover found at reconnect (write) count the clicks nobody can account for.
    pub struct Common {
        pending_clicks: Gauge = "pending_clicks", "Clicks accepted and not committed yet.";
        clicks_unaccounted: Counter = "clicks_unaccounted",
            "Clicks acknowledged to their sender once and not in this collector's record: skipped \
             by a resync (committed before click_senders lost them, or lost with it), or missing \
             from a new primary after an asynchronous failover.";
        db_errors: Counter = "db_errors", "Failed database attempts (connect, write, compaction, partitions).";
    }
}

/// What more than one component reports: to `/metrics` (`Common`) and to `/healthz` (`Health`).
#[derive(Debug, Default)]
pub struct Shared {
    pub counts: Common,
    pub health: Health,
}

impl Shared {
    /// `Common` registered into `registry`, and the health.
    pub(crate) fn register(registry: &mut Registry) -> Shared {
        Shared {
            counts: Common::register(registry),
            health: Health::default(),
        }
    }
}

/// What `/healthz` judges by; not exposed as metrics.
#[derive(Debug, Default)]
pub struct Health {
    /// The socket is open and the database was reached at start.
    pub(crate) started: AtomicBool,
    /// The writer's last attempt did not fail (one that waited for the instance lock held by
    /// another session did not). Apart from `upkeep`: the maintenance task's light queries
    /// working every second must not hide a writer that keeps failing.
    pub writes: AtomicBool,
    /// The maintenance task's last round (folding, pruning, the gauges) reached the database:
    /// what says so while no batch is being written.
    pub(crate) upkeep: AtomicBool,
}

impl Health {
    pub(crate) fn check(&self) -> Result<(), String> {
        if !self.started.load(Relaxed) {
            return Err("starting: socket or database not ready".into());
        }
        if !self.writes.load(Relaxed) {
            return Err("writing batches fails; they are kept and retried".into());
        }
        if !self.upkeep.load(Relaxed) {
            return Err("the database's periodic work (folding, pruning) fails; retried".into());
        }
        Ok(())
    }
}

shared::metrics! {
    /// The admin listener's own.
    struct Admin {
        connections_closed: LabeledCounter<shared::admin::Closed> =
            "admin_connections_closed",
            "Admin listener connections it closed itself to stay within its bound, by reason.";
    }
}

/// What `/metrics` and `/healthz` read: the registry every component registered its metrics
/// into, and the health.
pub(crate) struct AdminView {
    registry: Registry,
    admin: Admin,
    shared: Arc<Shared>,
}

impl AdminView {
    /// Serves `registry`, with the admin listener's own metrics registered into it.
    pub(crate) fn new(mut registry: Registry, shared: Arc<Shared>) -> AdminView {
        let admin = Admin::register(shared::metrics::sub_registry(&mut registry));
        AdminView {
            registry,
            admin,
            shared,
        }
    }
}

impl shared::admin::Admin for AdminView {
    fn metrics(&self) -> String {
        shared::metrics::encode(&self.registry)
    }

    fn health(&self) -> Result<(), String> {
        self.shared.health.check()
    }

    fn connection_closed(&self, why: shared::admin::Closed) {
        self.admin.connections_closed.inc(why);
    }
}
