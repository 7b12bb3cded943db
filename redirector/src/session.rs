//! What every database session of the redirector has: settings that keep it from hanging
//! unnoticed, and a connection task that ends with its owner. The link loader's sessions and
//! `--clicks direct`'s use them alike.

use std::time::Duration;

/// The database settings that keep a session from hanging unnoticed (`timeout`:
/// `--link-timeout`), named `name` in `pg_stat_activity` unless the URL names it.
pub(crate) fn session_config(
    mut config: shared::db::Config,
    timeout: Duration,
    name: &str,
) -> shared::db::Config {
    config
        .pg
        .connect_timeout(timeout)
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(10))
        .keepalives_interval(Duration::from_secs(5))
        .keepalives_retries(3)
        .tcp_user_timeout(timeout * 3);
    if config.pg.get_application_name().is_none() {
        config.pg.application_name(name);
    }
    config
}

/// A spawned task that is aborted when its owner goes away: a session's connection, which
/// tokio-postgres would otherwise keep open while an answer is still due.
pub(crate) struct AbortOnDrop<T>(pub(crate) tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
