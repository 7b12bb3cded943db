//! The collector: receives click datagrams on a Unix socket and writes them to PostgreSQL.
//!
//! `socket` (the inbox and its stop fence) -> `receive` (decode, seq check, `batch`) ->
//! `copy` (binary COPY, one transaction per batch, one writer per database: `lock`); `compact` folds the per-batch counts;
//! `service` wires them with signals; `config` is the command line.

pub mod batch;
pub mod compact;
pub mod config;
pub mod copy;
pub mod db;
pub mod lock;
pub mod metrics;
pub mod migrations;
pub mod mirror;
pub mod receive;
pub mod senders;
pub mod service;
pub mod socket;
