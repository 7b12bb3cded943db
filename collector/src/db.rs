//! Reaching PostgreSQL: the parsed connection settings, retry pacing, and error text that
//! says what the server said.

use std::time::Duration;

use tokio_postgres::{Client, NoTls};

/// The first wait after a failed attempt; each further failure doubles it up to [`MAX_WAIT`].
const FIRST_WAIT: Duration = Duration::from_millis(100);
const MAX_WAIT: Duration = Duration::from_secs(5);

/// Where the database is, parsed once at start so a malformed URL fails at once.
#[derive(Debug, Clone)]
pub struct Db {
    config: tokio_postgres::Config,
}

impl Db {
    pub fn parse(url: &str) -> Result<Db, tokio_postgres::Error> {
        Ok(Db {
            config: url.parse()?,
        })
    }

    /// A new connection, driven by a spawned task that ends when the client is dropped.
    pub async fn connect(&self) -> Result<Client, tokio_postgres::Error> {
        let (client, connection) = self.config.connect(NoTls).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("database connection ended: {}", describe(&e));
            }
        });
        Ok(client)
    }
}

/// Capped exponential waits between attempts.
#[derive(Debug)]
pub struct Backoff(Duration);

impl Backoff {
    pub fn new() -> Backoff {
        Backoff(FIRST_WAIT)
    }

    /// Sleeps the current wait and doubles the next one, up to the cap.
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(MAX_WAIT);
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

/// tokio_postgres errors display as just "db error"; this adds the server's message and
/// detail, or the underlying cause.
pub fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let detail = db.detail().map(|d| format!(" ({d})")).unwrap_or_default();
        return format!("{}: {}{detail}", db.severity(), db.message());
    }
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn backoff_doubles_up_to_the_cap() {
        let mut b = Backoff::new();
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
