//! Batches out: a batch's rows and counts (`batch`) in the binary COPY format (`copy`), its one
//! transaction (`store`), the writer task (`writer`) with the instance lock (`lock`) its
//! connection holds, and the sums of what it committed and not folded yet (`unfolded`).

pub mod batch;
pub mod copy;
pub mod lock;
pub mod store;
pub mod unfolded;
pub mod writer;

use shared::metrics::{Counter, Histogram, LabeledCounter};

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
    }
}
