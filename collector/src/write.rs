//! Batches out: a batch's rows and counts (`batch`, its counts in `code_map`s) in the binary
//! COPY format (`copy`), its one transaction (`store`), the writer task (`writer`) with the
//! instance lock (`lock`) its connection holds, the sums of what it committed and not folded
//! yet (`unfolded`), and what its sessions' replication does (`replication`).

pub mod batch;
pub(crate) mod code_map;
pub mod copy;
pub mod lock;
pub mod replication;
pub mod store;
pub mod unfolded;
pub mod writer;

use shared::metrics::{Counter, Gauge, Histogram, LabeledCounter};

use batch::SetAside;

shared::metrics! {
    /// What the writer counts: batches and the clicks they commit or set aside.
    pub struct Metrics {
        clicks_written: Counter = "clicks_written", "Clicks committed to PostgreSQL.";
        clicks_set_aside: LabeledCounter<SetAside> = "clicks_set_aside",
            "Clicks not written into clicks but into clicks_set_aside, by reason.";
        batches: Counter = "batches", "Batches committed.";
        batch_seconds: Histogram = "batch_seconds", "Time to write one batch, retries included.";
        commit_lag: Histogram = "commit_lag_seconds",
            "Per click committed: commit time minus click time (the redirector's clock).";
        database_synchronous: Gauge = "database_synchronous",
            "1 when the writer's commits wait for a synchronous standby \
             (synchronous_standby_names set), 0 when a failover can lose acknowledged ones.";
        replication_waiting: Gauge = "replication_waiting",
            "1 while a commit of this collector has waited over 2 s for synchronous replication \
             (wait_event SyncRep): no synchronous standby confirms it.";
        replication_waits: Counter = "replication_waits",
            "Commits named as waiting for synchronous replication (SyncRep) over 2 s.";
        instance_lock_waiting: Gauge = "instance_lock_waiting",
            "1 while this collector waits for its --instance's lock, which another session \
             holds (another collector of this instance, or an abandoned session of this one): \
             it writes nothing meanwhile.";
    }
}
