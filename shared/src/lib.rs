//! What the redirector, the collector and `clicktap` have in common around the protocol
//! (crate `protocol`): the socket and systemd plumbing, database connections, flags, metrics,
//! the admin listener, the hash index of their maps keyed by code, cache hints, and the
//! watch on the parts each process needs for its whole life.

pub mod admin;
pub mod backoff;
pub mod cache;
pub mod db;
pub mod flags;
pub mod hash_index;
pub mod metrics;
pub mod runtime;
pub mod socket;
pub mod systemd;
pub mod throttle;
pub mod vital;

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

/// Logs to stderr through `tracing`, filtered by `RUST_LOG` (default `info`; an empty value too,
/// which `tracing_subscriber` takes for no logging at all, as an `EnvironmentFile` line
/// `RUST_LOG=` would give). A value that is no filter logs at `info`, and says so.
pub fn init_logging() {
    let (filter, refused) = log_filter(std::env::var("RUST_LOG").ok().as_deref());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    if let Some(refused) = refused {
        tracing::warn!("{refused}");
    }
}

/// The filter `RUST_LOG`'s `value` asks for, or `info` and why not.
fn log_filter(value: Option<&str>) -> (tracing_subscriber::EnvFilter, Option<String>) {
    use tracing_subscriber::EnvFilter;
    // No directive at all (`""`, `","`) would turn every log off.
    let directives = |v: &str| v.split(',').any(|d| !d.trim().is_empty());
    match value.map(str::trim).filter(|v| directives(v)) {
        None => (EnvFilter::new("info"), None),
        Some(value) => match EnvFilter::try_new(value) {
            Ok(filter) => (filter, None),
            Err(e) => (
                EnvFilter::new("info"),
                Some(format!(
                    "RUST_LOG={value:?} is not a filter ({e}): logging at info"
                )),
            ),
        },
    }
}

/// Says why the process exits, as `format!` would: logged as an error (under the caller's
/// target), or written to stderr where `RUST_LOG` turned errors off, so that a start that fails
/// is never silent.
#[macro_export]
macro_rules! fatal {
    ($($arg:tt)*) => {
        if ::tracing::enabled!(::tracing::Level::ERROR) {
            ::tracing::error!($($arg)*)
        } else {
            ::std::eprintln!($($arg)*)
        }
    };
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::filter::LevelFilter;

    #[test]
    fn rust_log_unset_empty_or_no_filter_logs_at_info() {
        let level = |value| {
            let (filter, refused) = super::log_filter(value);
            (filter.max_level_hint(), refused.is_some())
        };
        let info = (Some(LevelFilter::INFO), false);
        assert_eq!(level(None), info);
        assert_eq!(level(Some("")), info);
        assert_eq!(level(Some("  ")), info);
        assert_eq!(level(Some(" , ")), info);
        assert_eq!(level(Some("debug")), (Some(LevelFilter::DEBUG), false));
        assert_eq!(level(Some("off")), (Some(LevelFilter::OFF), false));
        assert_eq!(
            level(Some("collector=verbose")),
            (Some(LevelFilter::INFO), true)
        );
    }
}
