//! The collector: receives click datagrams on a Unix socket and writes them to PostgreSQL.
//!
//! `socket` (the inbox and its stop fence) -> `receive` (decode, seq check, into a `batch`) ->
//! `writer` (the task: its connection, the instance `lock`, retries) -> `store` (one
//! transaction per batch) in the binary format of `copy`; `compact` folds the per-batch counts;
//! `service` wires them with signals; `config` is the command line.

pub mod batch;
pub mod compact;
pub mod config;
pub mod copy;
pub mod db;
pub mod intake;
pub mod lock;
pub mod maintenance;
pub mod metrics;
pub mod mirror;
pub mod partitions;
pub mod receive;
pub mod replication;
pub(crate) mod replies;
pub mod senders;
pub mod service;
pub mod socket;
pub mod store;
pub mod unfolded;
pub mod userns;
pub mod writer;
