//! The collector: receives click datagrams on a Unix socket and writes them to PostgreSQL.
//!
//! `ingest` (the socket and its stop fence, decode, seq check, into a batch) -> `write` (the
//! writer task: its connection, the instance lock, retries; one transaction per batch in the
//! binary COPY format) -> `upkeep` (folding the per-batch counts, the daily partitions);
//! `service` wires them with signals; `config` is the command line, `db` the connection
//! settings, `metrics` what all of them count.

pub mod config;
pub mod db;
pub mod ingest;
pub mod metrics;
pub mod service;
pub mod upkeep;
pub mod write;
