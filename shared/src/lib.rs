//! What the redirector, the collector and `clicktap` have in common around the protocol
//! (crate `protocol`): the socket and systemd plumbing, database connections, flags, metrics,
//! the admin listener, the hash index of their maps keyed by code, and cache hints.

pub mod admin;
pub mod backoff;
pub mod cache;
pub mod db;
pub mod flags;
pub mod hash_index;
pub mod metrics;
pub mod socket;
pub mod systemd;
pub mod throttle;

/// Completes with the signal's name on the first SIGTERM or SIGINT. The handlers are installed
/// before it returns, so a signal that arrives before the future is awaited is not lost.
pub fn stop_signal() -> std::io::Result<impl std::future::Future<Output = &'static str> + Send> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
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
