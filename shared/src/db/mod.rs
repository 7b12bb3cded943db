//! Reaching PostgreSQL: the connection string (libpq's `sslmode` and `sslrootcert` included),
//! a connection over TLS or not as it asks, driven by its own task, and error text that says
//! what the server said.

pub mod options;
pub mod tls;

use std::sync::Arc;

use tokio_postgres::config::{Host, SslMode as PgSslMode};

pub use options::{SslMode, TlsOptions};

/// The connection type both services get: TCP or Unix socket, TLS or plain.
pub type Connection =
    tokio_postgres::Connection<tokio_postgres::Socket, tls::TlsStream<tokio_postgres::Socket>>;

/// Why a `DATABASE_URL` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Options(#[from] options::OptionsError),
    #[error("{0}")]
    Parse(#[source] tokio_postgres::Error),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// libpq would take `PGHOST` or its own socket directory; tokio-postgres takes neither,
    /// and every connection would fail as if the database were down.
    #[error(
        "names no host: add host=/run/postgresql (the directory of a Unix socket) or \
         host=NAME (PGHOST and libpq's default socket directory are not read)"
    )]
    NoHost,
}

/// A parsed connection string: tokio-postgres' settings plus the TLS ones it does not know.
#[derive(Clone)]
pub struct Config {
    /// Everything but TLS; callers set timeouts and `application_name` here.
    pub pg: tokio_postgres::Config,
    tls: TlsOptions,
    client: Arc<rustls::ClientConfig>,
    /// What [`Config::guarded`] was given: each session's server side is guarded too.
    guard: Option<std::time::Duration>,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("pg", &self.pg)
            .field("tls", &self.tls)
            .finish()
    }
}

impl std::str::FromStr for Config {
    type Err = ConfigError;

    fn from_str(url: &str) -> Result<Config, ConfigError> {
        let (tls, rest) = options::split(url)?;
        let pg: tokio_postgres::Config = rest.parse().map_err(ConfigError::Parse)?;
        if pg.get_hosts().is_empty() && pg.get_hostaddrs().is_empty() {
            return Err(ConfigError::NoHost);
        }
        let client = tls::client_config(&tls)?;
        Ok(Config {
            pg,
            tls,
            client,
            guard: None,
        })
    }
}

impl Config {
    /// The TLS settings it was given.
    pub fn tls(&self) -> &TlsOptions {
        &self.tls
    }

    /// With the settings that keep a session from hanging unnoticed: `timeout` to connect
    /// (a server that accepts and never answers included), TCP keepalives and a user timeout
    /// of three times `timeout`, which find a peer gone from the network long before the
    /// kernel's retransmissions would (about 15 minutes), on both sides of the session (the
    /// server's in [`Config::session_setup`]); named `name` in `pg_stat_activity` unless the
    /// URL names it.
    pub fn guarded(mut self, timeout: std::time::Duration, name: &str) -> Config {
        self.guard = Some(timeout);
        self.pg
            .connect_timeout(timeout)
            .keepalives(true)
            .keepalives_idle(std::time::Duration::from_secs(10))
            .keepalives_interval(std::time::Duration::from_secs(5))
            .keepalives_retries(3)
            .tcp_user_timeout(timeout * 3);
        if self.pg.get_application_name().is_none() {
            self.pg.application_name(name);
        }
        self
    }

    /// The settings to hand tokio-postgres, with its own `sslmode`: ours but `verify-*` are
    /// `require` (the verifier does the rest), and none over Unix sockets.
    fn connect_config(&self) -> tokio_postgres::Config {
        let mut pg = self.pg.clone();
        // Addresses without names: libpq checks a certificate against the address then, and
        // tokio-postgres, given no name, fails every TLS handshake ("no hostname provided"),
        // under `prefer` too, where libpq would connect.
        if pg.get_hosts().is_empty() {
            for addr in pg.get_hostaddrs().to_vec() {
                pg.host(addr.to_string());
            }
        }
        let unix_only =
            !pg.get_hosts().is_empty() && pg.get_hosts().iter().all(|h| matches!(h, Host::Unix(_)));
        // libpq never uses TLS over a Unix socket (the server would refuse it anyway, and
        // `require` would then fail). tokio-postgres' mode is per connection string, so a list
        // mixing Unix and TCP hosts keeps the mode given for all of them.
        pg.ssl_mode(match self.tls.mode {
            _ if unix_only => PgSslMode::Disable,
            SslMode::Disable => PgSslMode::Disable,
            SslMode::Prefer => PgSslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => PgSslMode::Require,
        });
        pg
    }

    /// What every session runs first: [`SET_SEARCH_PATH`], and once [`Config::guarded`], the
    /// server's side of the keepalives and user timeout (ignored over a Unix socket). A
    /// backend whose client vanished from the network (its last packets lost in the outage)
    /// otherwise waits for it until the server's keepalives notice, after the kernel's two
    /// hours, holding what it holds: the collector's writer lock of its instance among them.
    /// `tcp_user_timeout` is set only where the server has it (12 and later): on an older one
    /// the session must get as far as the collector's check of the server's version, which
    /// says what to do, rather than fail on an unknown parameter.
    pub fn session_setup(&self) -> String {
        let Some(timeout) = self.guard else {
            return SET_SEARCH_PATH.to_owned();
        };
        let user_timeout_ms = (timeout * 3).as_millis().clamp(1, i32::MAX as u128);
        format!(
            "{SET_SEARCH_PATH}; SET tcp_keepalives_idle = 10; SET tcp_keepalives_interval = 5; \
             SET tcp_keepalives_count = 3; \
             SELECT set_config('tcp_user_timeout', '{user_timeout_ms}', false) \
             WHERE current_setting('tcp_user_timeout', true) IS NOT NULL"
        )
    }

    /// Connects, and hands back the connection for the caller to drive. The caller sets the
    /// session up, [`Config::session_setup`] first, before its first query.
    pub async fn connect_raw(
        &self,
    ) -> Result<(tokio_postgres::Client, Connection), tokio_postgres::Error> {
        self.connect_config()
            .connect(tls::MakeTls::new(self.client.clone(), self.tls.mode))
            .await
    }
}

/// `SET statement_timeout` to `limit` in whole milliseconds, within what PostgreSQL takes (1 ms
/// to 2^31 - 1 ms, about 24.8 days): a flag's `500us` must not mean no limit (0), nor `30days`
/// an error that fails every session.
pub fn set_statement_timeout(limit: std::time::Duration) -> String {
    let ms = limit.as_millis().clamp(1, i32::MAX as u128);
    format!("SET statement_timeout = {ms}")
}

/// Asks the server to cancel what the session of `token` runs (`config`: the session's, for
/// its TLS settings).
pub async fn cancel(
    config: &Config,
    token: &tokio_postgres::CancelToken,
) -> Result<(), tokio_postgres::Error> {
    token
        .cancel_query(tls::MakeTls::new(config.client.clone(), config.tls.mode))
        .await
}

/// The search path of every session of both services, set first thing: `public`, the schema
/// the migrations make, and nothing else. PostgreSQL searches the system catalog before a path
/// that does not name it (its functions and operators win any tie), and creates new objects
/// in the first schema the path names (`public`: naming `pg_catalog` first would send them
/// there). The default, `"$user", public`, also searches a schema named like the login
/// role, which whoever may create schemas in the database could make: a function or operator
/// there, or in a schema any role may write to, could shadow one the services call by name
/// (their SQL and the migrations' name functions unqualified). Schema `public` is kept to its
/// owners by migration 13 (before PostgreSQL 15 every role could create in it).
///
/// A `SET` rather than the startup packet's `options`, which PgBouncer refuses.
pub const SET_SEARCH_PATH: &str = "SET search_path = public";

/// Connects, and drives the connection on a spawned task that ends when the client is dropped
/// (or the connection fails: the client's next query then reports it). The session is set up
/// first ([`Config::session_setup`]: its search path pinned).
pub async fn connect(config: &Config) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = config.connect_raw().await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!("database connection ended: {}", describe(&e));
        }
    });
    client.batch_execute(&config.session_setup()).await?;
    Ok(client)
}

/// tokio_postgres errors display as just "db error"; this adds the server's severity, message,
/// detail and hint (what a migration that cannot go on says to run), or the underlying cause
/// (connection refused, socket missing, ...).
pub fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let detail = db.detail().map(|d| format!(" ({d})")).unwrap_or_default();
        let hint = db.hint().map(|h| format!(" HINT: {h}")).unwrap_or_default();
        return format!("{}: {}{detail}{hint}", db.severity(), db.message());
    }
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

/// Capped exponential waits between attempts to reach the database, for every session of both
/// services: 100 ms doubling to 5 s.
pub fn backoff() -> crate::backoff::Backoff {
    let first = std::time::Duration::from_millis(100);
    crate::backoff::Backoff::new(first, std::time::Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn a_url_naming_no_host_is_refused() {
        let parse = |url: &str| url.parse::<super::Config>();
        for url in [
            "dbname=clicks user=c",
            "postgres:///clicks",
            "postgres://c@/clicks",
        ] {
            let err = parse(url).expect_err(url);
            assert!(matches!(err, super::ConfigError::NoHost), "{url}: {err}");
        }
        for url in [
            "host=/run/postgresql dbname=clicks",
            "hostaddr=127.0.0.1 dbname=clicks",
            "postgres://db.example.com/clicks",
            "postgres://%2Frun%2Fpostgresql/clicks",
        ] {
            parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        }
    }

    #[test]
    fn a_statement_timeout_is_kept_within_what_postgresql_takes() {
        let set = |d| super::set_statement_timeout(d);
        assert_eq!(set(Duration::from_secs(5)), "SET statement_timeout = 5000");
        assert_eq!(set(Duration::from_micros(500)), "SET statement_timeout = 1");
        let month = Duration::from_secs(30 * 24 * 3600);
        assert_eq!(set(month), "SET statement_timeout = 2147483647");
    }
}
