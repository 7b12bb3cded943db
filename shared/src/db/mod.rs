//! Reaching PostgreSQL: the connection string (libpq's `sslmode` and `sslrootcert` included),
//! a connection over TLS or not as it asks, driven by its own task, and error text that says
//! what the server said.

pub mod options;
pub mod tls;

use std::sync::Arc;

use tokio_postgres::config::{Host, LoadBalanceHosts, SslMode as PgSslMode};

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
    /// What tokio-postgres (and libpq) would refuse at every connect; taken host by host
    /// ([`Config::connect_raw`]), a list left short would lend a host another's port or none
    /// of the addresses given.
    #[error("{0}")]
    HostCounts(String),
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
        check_host_counts(&pg)?;
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
    /// server's in [`Config::set_up`]); named `name` in `pg_stat_activity` unless the
    /// URL names it.
    pub fn guarded(mut self, timeout: std::time::Duration, name: &str) -> Config {
        self.guard = Some(timeout);
        self.pg
            .connect_timeout(timeout)
            .keepalives(true)
            .keepalives_idle(std::time::Duration::from_secs(10))
            .keepalives_interval(std::time::Duration::from_secs(5))
            .keepalives_retries(3)
            .tcp_user_timeout(user_timeout(timeout));
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

    /// What every session runs first: [`SET_SEARCH_PATH`], [`NO_SERVER_TIMEOUTS`], and once
    /// [`Config::guarded`], the server's side of the keepalives and user timeout (ignored over
    /// a Unix socket). A backend whose client vanished from the network (its last packets lost
    /// in the outage) otherwise waits for it until the server's keepalives notice, after the kernel's two
    /// hours, holding what it holds: the collector's writer lock of its instance among them.
    /// `tcp_user_timeout` is set only where the server has it (12 and later): on an older one
    /// the session must get as far as the collector's check of the server's version, which
    /// says what to do, rather than fail on an unknown parameter.
    fn session_setup(&self) -> String {
        let always = format!("{SET_SEARCH_PATH}; {NO_SERVER_TIMEOUTS}");
        let Some(timeout) = self.guard else {
            return always;
        };
        let user_timeout_ms = user_timeout(timeout).as_millis();
        format!(
            "{always}; SET tcp_keepalives_idle = 10; SET tcp_keepalives_interval = 5; \
             SET tcp_keepalives_count = 3; \
             SELECT set_config('tcp_user_timeout', '{user_timeout_ms}', false) \
             WHERE current_setting('tcp_user_timeout', true) IS NOT NULL"
        )
    }

    /// Sets a session up: its search path and keepalives (`session_setup`) and the caller's
    /// `extra` statements (none: empty), then, once guarded, has the server look whether the client is still there
    /// every timeout while a statement runs (`client_connection_check_interval`). A backend
    /// whose client is gone (the process killed, or the session closed, while a statement
    /// waits for a lock an operator's DDL holds) otherwise waits on, holding what it holds:
    /// the collector's instance lock among it, for as long as the DDL's lock. (A session an
    /// attempt of the writer gave up on stays open until its statement ends, by design: a
    /// commit it was making may yet land, which the next attempt finds.) A server that does not know the setting (before 14)
    /// or cannot check on its platform (14 off Linux, Windows: it refuses any value but 0) is
    /// left as it is; a failed `SET` outside a transaction leaves the session usable. (Behind
    /// PgBouncer the server checks the pooler's connection: no effect there.)
    pub async fn set_up(
        &self,
        client: &tokio_postgres::Client,
        extra: &str,
    ) -> Result<(), tokio_postgres::Error> {
        let setup = self.session_setup();
        let sep = if extra.is_empty() { "" } else { "; " };
        client
            .batch_execute(&format!("{setup}{sep}{extra}"))
            .await?;
        let Some(timeout) = self.guard else {
            return Ok(());
        };
        let check = timeout_setting("client_connection_check_interval", timeout);
        match client.batch_execute(&format!("SET {check}")).await {
            Err(e) if e.code().is_some_and(|c| CHECK_REFUSED.contains(c)) => Ok(()),
            result => result,
        }
    }

    /// Connects, and hands back the connection for the caller to drive. The caller sets the
    /// session up ([`Config::set_up`]) before its first query.
    ///
    /// Once [`Config::guarded`], several hosts are tried one at a time, each but the last
    /// given a share of the timeout (`host_share`) for the whole of its start: TCP, TLS,
    /// authentication and the `target_session_attrs` check. tokio-postgres bounds only each
    /// TCP connect, so a first host that accepts and never answers (a hung postmaster) held
    /// every attempt until the caller's deadline, and one that drops every packet held it
    /// until the same moment: the new primary after a failover was never reached. The last
    /// host has what the caller's deadline leaves.
    pub async fn connect_raw(
        &self,
    ) -> Result<(tokio_postgres::Client, Connection), tokio_postgres::Error> {
        let pg = self.connect_config();
        let tls = || tls::MakeTls::new(self.client.clone(), self.tls.mode);
        let hosts = pg.get_hosts().len();
        let share = match self.guard {
            Some(timeout)
                if hosts > 1 && pg.get_load_balance_hosts() == LoadBalanceHosts::Disable =>
            {
                host_share(timeout, hosts)
            }
            _ => return pg.connect(tls()).await,
        };
        for i in 0..hosts - 1 {
            let host = one_host(&pg, i);
            match tokio::time::timeout(share, host.connect(tls())).await {
                Ok(Ok(session)) => return Ok(session),
                Ok(Err(e)) => tracing::debug!("host {} of {hosts}: {}", i + 1, describe(&e)),
                Err(_) => tracing::debug!("host {} of {hosts}: no session within {share:?}", i + 1),
            }
        }
        one_host(&pg, hosts - 1).connect(tls()).await
    }
}

/// Refuses a list of ports or addresses that does not match the hosts one to one (one port
/// may serve them all).
fn check_host_counts(pg: &tokio_postgres::Config) -> Result<(), ConfigError> {
    let (hosts, addrs, ports) = (
        pg.get_hosts().len(),
        pg.get_hostaddrs().len(),
        pg.get_ports().len(),
    );
    if hosts > 0 && addrs > 0 && hosts != addrs {
        let msg = format!("names {hosts} hosts and {addrs} hostaddrs: give one address a host");
        return Err(ConfigError::HostCounts(msg));
    }
    let named = hosts.max(addrs);
    if ports > 1 && ports != named {
        let msg = format!("names {named} hosts and {ports} ports: give one port, or one a host");
        return Err(ConfigError::HostCounts(msg));
    }
    Ok(())
}

/// What each host but the last of `hosts` may take of an attempt bounded by `timeout`: a
/// share of one more than there are hosts, so that the last has two (a third of the timeout
/// for the first of two hosts, and two thirds for the second).
fn host_share(timeout: std::time::Duration, hosts: usize) -> std::time::Duration {
    timeout / hosts.saturating_add(1).min(u32::MAX as usize) as u32
}

/// `pg` with its `i`th host alone (its address and port with it), everything else as it is.
fn one_host(pg: &tokio_postgres::Config, i: usize) -> tokio_postgres::Config {
    let mut one = tokio_postgres::Config::new();
    match &pg.get_hosts()[i] {
        Host::Tcp(name) => one.host(name),
        Host::Unix(path) => one.host_path(path),
    };
    if let Some(&addr) = pg.get_hostaddrs().get(i) {
        one.hostaddr(addr);
    }
    if let Some(&port) = pg.get_ports().get(i).or(pg.get_ports().first()) {
        one.port(port);
    }
    if let Some(user) = pg.get_user() {
        one.user(user);
    }
    if let Some(password) = pg.get_password() {
        one.password(password);
    }
    if let Some(dbname) = pg.get_dbname() {
        one.dbname(dbname);
    }
    if let Some(options) = pg.get_options() {
        one.options(options);
    }
    if let Some(name) = pg.get_application_name() {
        one.application_name(name);
    }
    if let Some(&timeout) = pg.get_connect_timeout() {
        one.connect_timeout(timeout);
    }
    if let Some(&timeout) = pg.get_tcp_user_timeout() {
        one.tcp_user_timeout(timeout);
    }
    if let Some(interval) = pg.get_keepalives_interval() {
        one.keepalives_interval(interval);
    }
    if let Some(retries) = pg.get_keepalives_retries() {
        one.keepalives_retries(retries);
    }
    one.ssl_mode(pg.get_ssl_mode())
        .ssl_negotiation(pg.get_ssl_negotiation())
        .keepalives(pg.get_keepalives())
        .keepalives_idle(pg.get_keepalives_idle())
        .target_session_attrs(pg.get_target_session_attrs())
        .channel_binding(pg.get_channel_binding())
        .load_balance_hosts(pg.get_load_balance_hosts());
    one
}

/// The TCP user timeout of a session guarded by `timeout`: three times it, in whole
/// milliseconds from 1 to 2^31 - 1 (about 24.8 days), what both Linux (`EINVAL` above,
/// failing every connect) and PostgreSQL take.
fn user_timeout(timeout: std::time::Duration) -> std::time::Duration {
    let ms = timeout
        .saturating_mul(3)
        .as_millis()
        .clamp(1, i32::MAX as u128);
    std::time::Duration::from_millis(ms as u64)
}

/// What a server says of `client_connection_check_interval` that leaves a session as it was:
/// unknown (before 14), or not supported on its platform.
const CHECK_REFUSED: [tokio_postgres::error::SqlState; 2] = [
    tokio_postgres::error::SqlState::UNDEFINED_OBJECT,
    tokio_postgres::error::SqlState::INVALID_PARAMETER_VALUE,
];

/// `SET statement_timeout` to `limit` in whole milliseconds, within what PostgreSQL takes (1 ms
/// to 2^31 - 1 ms, about 24.8 days): a flag's `500us` must not mean no limit (0), nor `30days`
/// an error that fails every session.
pub fn set_statement_timeout(limit: std::time::Duration) -> String {
    format!("SET {}", timeout_setting("statement_timeout", limit))
}

/// `name = limit` in whole milliseconds, as [`set_statement_timeout`] has it, for any of
/// PostgreSQL's timeouts, for a `SET` or a `SET LOCAL`.
pub fn timeout_setting(name: &str, limit: std::time::Duration) -> String {
    let ms = limit.as_millis().clamp(1, i32::MAX as u128);
    format!("{name} = {ms}")
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

/// No statement, lock or idle session timeout, nor (PostgreSQL 17 on) transaction timeout, of
/// the database's or the role's (common on managed servers): the services bound their own
/// waits (their flags; a session sets its own statement or lock timeout after this where it
/// wants one). A statement timeout the database set shorter than a batch's statements take
/// cancelled the batch at every attempt, and the writer held on it for good; a lock timeout
/// failed every index build of a closed day at its wait for older transactions (not a
/// cancel, so never given up: dropped and built again each round); an idle session timeout
/// closes a writer's session between quiet batches, each a database error.
/// (`idle_in_transaction_session_timeout` stays: no session sits idle inside a transaction,
/// and it ends one a stopped process left inside one, with its locks.)
const NO_SERVER_TIMEOUTS: &str = "SELECT set_config(name, '0', false) FROM pg_settings \
     WHERE name IN ('statement_timeout', 'transaction_timeout', 'lock_timeout', \
                    'idle_session_timeout')";

/// Connects, and drives the connection on a spawned task that ends when the client is dropped
/// (or the connection fails: the client's next query then reports it). The session is set up
/// first ([`Config::set_up`]: its search path pinned).
pub async fn connect(config: &Config) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = config.connect_raw().await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!("database connection ended: {}", describe(&e));
        }
    });
    config.set_up(&client, "").await?;
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
        for url in ["host=a,b,c port=5432,5433", "host=a,b hostaddr=10.0.0.1"] {
            let err = parse(url).expect_err(url);
            assert!(
                matches!(err, super::ConfigError::HostCounts(_)),
                "{url}: {err}"
            );
        }
        for url in [
            "host=a,b port=5432",
            "host=a,b port=5432,5433",
            "host=a,b hostaddr=10.0.0.1,10.0.0.2",
            "host=/run/postgresql dbname=clicks",
            "hostaddr=127.0.0.1 dbname=clicks",
            "postgres://db.example.com/clicks",
            "postgres://%2Frun%2Fpostgresql/clicks",
        ] {
            parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        }
    }

    /// A host taken alone keeps every setting: a field the copy left out would connect to the
    /// right host with the wrong user, database, timeouts or TLS.
    #[test]
    fn one_host_of_a_list_keeps_every_setting_of_its_own() {
        let url = "host=db1,/run/pg hostaddr=10.0.0.1,10.0.0.2 port=6432,6433 user=u \
                   password=p dbname=d options=-cx=1 application_name=a sslmode=require \
                   sslnegotiation=direct connect_timeout=7 tcp_user_timeout=8 keepalives=0 \
                   keepalives_idle=9 keepalives_interval=10 keepalives_retries=11 \
                   target_session_attrs=read-write channel_binding=require \
                   load_balance_hosts=disable";
        let list: tokio_postgres::Config = url.parse().unwrap();
        for (i, host) in [
            "host=db1 hostaddr=10.0.0.1 port=6432",
            "host=/run/pg hostaddr=10.0.0.2 port=6433",
        ]
        .into_iter()
        .enumerate()
        {
            let alone = url
                .replace(
                    "host=db1,/run/pg hostaddr=10.0.0.1,10.0.0.2 port=6432,6433",
                    host,
                )
                .parse::<tokio_postgres::Config>()
                .unwrap();
            let one = super::one_host(&list, i);
            assert!(one == alone, "{i}: {one:?} against {alone:?}");
        }
        // One port for every host.
        let shared: tokio_postgres::Config = "host=a,b port=7".parse().unwrap();
        assert_eq!(super::one_host(&shared, 1).get_ports(), [7]);
    }

    #[test]
    fn a_user_timeout_is_kept_within_what_linux_and_postgresql_take() {
        let ms = |d| super::user_timeout(d).as_millis();
        assert_eq!(ms(Duration::from_secs(4)), 12_000);
        assert_eq!(ms(Duration::from_micros(100)), 1);
        assert_eq!(ms(Duration::from_secs(9 * 24 * 3600)), i32::MAX as u128);
        assert_eq!(ms(Duration::MAX), i32::MAX as u128);
    }

    /// The timeouts a database or role sets (common on managed servers) are not the
    /// sessions': each sets its own where it wants one.
    #[tokio::test]
    async fn a_session_runs_without_the_timeouts_the_database_sets() {
        let db = testkit::pgtest::test_db().await;
        let names = ["statement_timeout", "lock_timeout", "idle_session_timeout"];
        let given = testkit::pgtest::connect_as_given(&db.url).await;
        for name in names {
            let set = format!("ALTER DATABASE \"{}\" SET {name} = 700", db.name);
            given.batch_execute(&set).await.unwrap();
        }
        let config: super::Config = db.url.parse().unwrap();
        let client = super::connect(&config).await.unwrap();
        for name in names {
            let row = client
                .query_one(&format!("SHOW {name}"), &[])
                .await
                .unwrap();
            assert_eq!(row.get::<_, String>(0), "0", "{name}");
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
