//! Batches out: a batch's rows and counts (`batch`) in the binary COPY format (`copy`), its one
//! transaction (`store`), the writer task (`writer`) with the instance lock (`lock`) its
//! connection holds, and the sums of what it committed and not folded yet (`unfolded`).

pub mod batch;
pub mod copy;
pub mod lock;
pub mod store;
pub mod unfolded;
pub mod writer;
