//! What the redirector, the collector and `clicktap` have in common: the wire format, the
//! socket and systemd plumbing, metrics and the admin listener.

pub mod admin;
pub mod backoff;
pub mod db;
pub mod metrics;
#[cfg(feature = "testkit")]
pub mod pgtest;
pub mod socket;
pub mod systemd;
pub mod tap;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod wire;

/// Now, in microseconds since the Unix epoch (the wire format's clock).
pub fn now_us() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
}

/// Logs to stderr through `tracing`, filtered by `RUST_LOG` (default `info`).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
}
