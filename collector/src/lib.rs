//! The collector: receives click datagrams on a Unix socket and writes them to PostgreSQL.

pub mod migrations;
