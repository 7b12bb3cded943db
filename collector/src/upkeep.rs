//! The periodic tasks, each on a connection of its own (`maintenance`): the fold of the
//! per-batch counts (`compact`, from the sums the writer keeps in `write::unfolded`) and the daily
//! partitions of `clicks` (`partitions`).

pub mod compact;
pub mod maintenance;
pub(crate) mod partitions;
