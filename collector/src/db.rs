//! Reaching PostgreSQL: the parsed connection settings and the retry pacing.

use std::future::Future;
use std::time::Duration;

pub(crate) use shared::db::describe;
use tokio_postgres::Client;

/// Where the database is, parsed once at start so a malformed URL fails at once.
#[derive(Debug, Clone)]
pub struct Db {
    config: shared::db::Config,
}

impl Db {
    pub fn parse(url: &str) -> Result<Db, shared::db::ConfigError> {
        Ok(Db {
            config: url.parse()?,
        })
    }

    /// Names the collector's sessions in `pg_stat_activity` (`collector <instance>`), unless
    /// the URL names them already, and keeps them from hanging unnoticed (`timeout`:
    /// `--write-timeout`): start-up, whose steps have no deadline of their own (a migration
    /// may take long), once waited on a server that accepted and never answered for good.
    pub(crate) fn for_instance(mut self, instance: &str, timeout: Duration) -> Db {
        self.config = self
            .config
            .guarded(timeout, &format!("collector {instance}"));
        self
    }

    /// A new connection, driven by a spawned task that ends when the client is dropped.
    pub(crate) async fn connect(&self) -> Result<Client, tokio_postgres::Error> {
        shared::db::connect(&self.config).await
    }
}

/// Why an attempt on the database failed.
#[derive(Debug)]
pub(crate) enum Failure {
    Db(tokio_postgres::Error),
    /// It took longer than this and was abandoned.
    Timeout(Duration),
    /// It waited this long for the writer lock, which another session holds, and was
    /// abandoned: not a database outage.
    LockHeld(Duration),
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Failure {
        Failure::Db(e)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Db(e) => f.write_str(&describe(e)),
            Failure::Timeout(limit) => write!(f, "took over {limit:?}"),
            Failure::LockHeld(limit) => write!(
                f,
                "waited {limit:?} for the writer lock, which another session holds (another \
                 collector, or an abandoned connection of this one)"
            ),
        }
    }
}

/// Runs `attempt` for at most `limit`.
pub(crate) async fn timed<T>(
    limit: Duration,
    attempt: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, Failure> {
    match tokio::time::timeout(limit, attempt).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(Failure::Timeout(limit)),
    }
}

pub(crate) use shared::db::backoff;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn backoff_doubles_up_to_the_cap() {
        let mut b = backoff();
        let mut waits = Vec::new();
        for _ in 0..8 {
            let start = tokio::time::Instant::now();
            b.wait().await;
            waits.push(start.elapsed().as_millis());
        }
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
    }

    #[test]
    fn parses_both_url_forms_and_rejects_garbage() {
        assert!(Db::parse("host=/run/postgresql dbname=clicks").is_ok());
        assert!(Db::parse("postgres://u@localhost/clicks").is_ok());
        assert!(Db::parse("postgres://u@localhost:notaport/x").is_err());
    }
}
