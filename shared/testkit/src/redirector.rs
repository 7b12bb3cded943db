//! What the redirector's tests share: running the real binaries, reading their metrics and the
//! database, the load generator and the chaos scenarios.

pub mod browsers;
pub mod chaos;
pub mod load;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

pub use crate::db::{await_rows, rows};
pub use crate::services::metric;
use crate::services::{await_healthy, collector_command, Collector};
use crate::Service;
pub use crate::LIMIT;

/// What most tests start from: a migrated database of their own holding `links`, a client of
/// it, and a temp dir for the collector's socket.
pub struct Fixture {
    pub db: crate::pgtest::TestDb,
    pub client: tokio_postgres::Client,
    pub socket: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

/// A fresh [`Fixture`] with `links` as (code, url) rows.
pub async fn fixture(links: &[(&str, &str)]) -> Fixture {
    fixture_on(crate::pgtest::test_db().await, links).await
}

/// A [`Fixture`] on `db`, a migrated database, with `links` as (code, url) rows.
pub async fn fixture_on(db: crate::pgtest::TestDb, links: &[(&str, &str)]) -> Fixture {
    let client = crate::pgtest::connect(&db.url).await;
    for (code, url) in links {
        add_link(&client, code, url).await;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    Fixture {
        db,
        client,
        socket: dir.path().join("collector.sock"),
        _dir: dir,
    }
}

/// A running `redirector` binary and where it listens.
pub struct Redirector {
    pub service: Service,
    pub http: SocketAddr,
    pub admin: SocketAddr,
}

/// Starts the redirector on free ports; `extra` flags go last.
pub async fn redirector(database_url: &str, socket: &Path, extra: &[&str]) -> Redirector {
    start_redirector(redirector_command(database_url, socket, extra)).await
}

/// The command [`redirector`] runs, to adjust before [`start_redirector`]. Its ack socket is
/// a fresh path beside the collector's socket, unless `extra` names one.
pub fn redirector_command(database_url: &str, socket: &Path, extra: &[&str]) -> Command {
    static STARTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let ack = socket.with_file_name(format!("redirector-{n}.sock"));
    let mut cmd = Command::new(crate::binary("redirector"));
    cmd.args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .arg("--database-url")
        .arg(database_url)
        .arg("--socket")
        .arg(socket);
    if !extra.contains(&"--ack-socket") {
        cmd.arg("--ack-socket").arg(ack);
    }
    cmd.args(extra).env("RUST_LOG", "info");
    cmd
}

pub async fn start_redirector(cmd: Command) -> Redirector {
    let service = Service::spawn("redirector", cmd);
    let http = service.addr_after("http listening on ", LIMIT).await;
    let admin = service.addr_after("admin listening on ", LIMIT).await;
    Redirector {
        service,
        http,
        admin,
    }
}

impl Redirector {
    /// Waits until the link table is loaded (`/healthz` says 200).
    pub async fn ready(&self) {
        await_healthy("redirector", self.admin).await;
    }

    pub async fn metric(&self, series: &str) -> f64 {
        metric(self.admin, series).await
    }

    /// Waits until the metric reaches `value`, and checks it went no further.
    pub async fn await_metric(&self, series: &str, value: f64) {
        crate::services::await_metric(self.admin, series, value).await;
    }

    /// Kills it with SIGKILL, as a crash would, and waits until it is gone.
    pub async fn kill(&mut self) {
        self.service.signal(nix::sys::signal::Signal::SIGKILL);
        self.service.wait_exit(LIMIT).await;
    }

    /// Clicks dropped, summed over every reason.
    pub async fn dropped(&self) -> f64 {
        let (_, text) = crate::http::get(self.admin, "/metrics")
            .await
            .expect("GET /metrics");
        text.lines()
            .filter(|l| l.starts_with("redirector_clicks_dropped_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

/// Starts the real collector on `socket` and waits until it listens.
pub async fn collector(database_url: &str, socket: &Path) -> Service {
    collector_with(database_url, socket, &[]).await.0
}

/// Starts the real collector on `socket` with `extra` flags; returns it once it listens, with
/// its admin address.
pub async fn collector_with(
    database_url: &str,
    socket: &Path,
    extra: &[&str],
) -> (Service, SocketAddr) {
    let collector = Collector::spawn(collector_command(database_url, socket, extra)).await;
    (collector.service, collector.admin)
}

/// What `GET /code` answers: `Some(location)` for a redirect, `None` for 404.
pub async fn served(http: SocketAddr, code: &str) -> Option<String> {
    let response = crate::http::request(http, hyper::Method::GET, &format!("/{code}"))
        .await
        .expect("an answer");
    match response.status().as_u16() {
        302 => Some(response.headers()["location"].to_str().unwrap().to_owned()),
        404 => None,
        other => panic!("GET /{code} answered {other}"),
    }
}

pub async fn add_link(db: &tokio_postgres::Client, code: &str, url: &str) {
    db.execute(
        "INSERT INTO links (code, url) VALUES ($1, $2)",
        &[&code, &url],
    )
    .await
    .unwrap_or_else(|e| panic!("adding link {code}: {e:?}"));
}

/// Drops migration 7's `links_url_clean` CHECK, as on a database where it is gone (or a
/// row predates it): what the redirector then must not serve can be written.
pub async fn drop_url_check(db: &tokio_postgres::Client) {
    db.batch_execute("ALTER TABLE links DROP CONSTRAINT links_url_clean")
        .await
        .unwrap_or_else(|e| panic!("dropping links_url_clean: {}", shared::db::describe(&e)));
}

/// Adds a link as if it had been written before migration 7: with `links_url_clean` dropped,
/// then added back NOT VALID, as migration 7 leaves a table that held such rows.
pub async fn add_link_predating_check(db: &tokio_postgres::Client, code: &str, url: &str) {
    drop_url_check(db).await;
    add_link(db, code, url).await;
    db.batch_execute(
        r"ALTER TABLE links ADD CONSTRAINT links_url_clean
              CHECK (url !~ '[\x01-\x1f\x7f]' AND octet_length(url) <= 2048) NOT VALID",
    )
    .await
    .unwrap_or_else(|e| panic!("adding links_url_clean back: {}", shared::db::describe(&e)));
}

/// The one value `sql` returns.
pub async fn scalar<T: tokio_postgres::types::FromSqlOwned>(
    db: &tokio_postgres::Client,
    sql: &str,
) -> T {
    db.query_one(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {}", shared::db::describe(&e)))
        .get(0)
}

/// The database's clock, Unix seconds (what `redirector_links_synced_timestamp_seconds` uses).
pub async fn db_now(db: &tokio_postgres::Client) -> f64 {
    scalar(db, "SELECT extract(epoch FROM clock_timestamp())::float8").await
}

/// Cuts the redirector's link sessions and refuses new connections to `f`'s database until
/// [`let_back`]; returns once the redirector counted the loss. The admin client it returns is
/// what lets it back.
pub async fn cut_off(f: &Fixture, r: &Redirector) -> tokio_postgres::Client {
    let admin = crate::pgtest::cluster().connect("postgres").await;
    let errors = r.metric("redirector_link_load_errors_total").await;
    let sql = format!(
        "ALTER DATABASE {0} ALLOW_CONNECTIONS false;
         SELECT pg_terminate_backend(pid) FROM pg_stat_activity
          WHERE datname = '{0}' AND application_name = 'redirector-links';",
        f.db.name
    );
    admin.batch_execute(&sql).await.expect("cutting off");
    crate::eventually(
        "the redirector to notice the lost session",
        LIMIT,
        || async { (r.metric("redirector_link_load_errors_total").await > errors).then_some(()) },
    )
    .await;
    admin
}

/// Takes `f`'s database away from everyone, as if it were down: refuses new connections to it
/// and ends every client session open on it (the collector's, the redirector's, `f.client`'s),
/// until [`let_back`]. Returns once none is left, with the admin client that lets it back.
pub async fn database_away(f: &Fixture) -> tokio_postgres::Client {
    let admin = crate::pgtest::cluster().connect("postgres").await;
    let sessions = format!(
        "FROM pg_stat_activity WHERE datname = '{}' AND backend_type = 'client backend'",
        f.db.name
    );
    let sql = format!(
        "ALTER DATABASE {} ALLOW_CONNECTIONS false; SELECT pg_terminate_backend(pid) {sessions};",
        f.db.name
    );
    admin
        .batch_execute(&sql)
        .await
        .expect("taking the database away");
    let count = format!("SELECT count(*) {sessions}");
    crate::eventually("every session of the database to end", LIMIT, || async {
        (scalar::<i64>(&admin, &count).await == 0).then_some(())
    })
    .await;
    admin
}

/// Allows connections to `f`'s database again.
pub async fn let_back(f: &Fixture, admin: &tokio_postgres::Client) {
    let sql = format!("ALTER DATABASE {} ALLOW_CONNECTIONS true", f.db.name);
    admin.batch_execute(&sql).await.expect("letting back");
}

/// Parses the redirector's last line, `redirector: N clicks sent, M dropped`.
pub fn final_counts(log: &[String]) -> (u64, u64) {
    let line = log
        .iter()
        .rev()
        .find(|l| l.contains("redirector: ") && l.contains(" clicks sent, "))
        .unwrap_or_else(|| panic!("no final count line in {log:#?}"));
    let after = &line[line.find("redirector: ").unwrap() + "redirector: ".len()..];
    let mut numbers = after
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u64>().unwrap());
    (numbers.next().unwrap(), numbers.next().unwrap())
}

/// The clicks acknowledged and not acknowledged, from the redirector's last line
/// (`...; A acknowledged, U not acknowledged`).
pub fn final_acks(log: &[String]) -> (u64, u64) {
    let line = log
        .iter()
        .rev()
        .find(|l| l.contains(" not acknowledged"))
        .unwrap_or_else(|| panic!("no final count line in {log:#?}"));
    let after = &line[line
        .rfind("; ")
        .expect("`; ` before the acknowledged counts")
        + 2..];
    let mut numbers = after
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u64>().unwrap());
    let acked = numbers
        .next()
        .unwrap_or_else(|| panic!("acknowledged in {line:?}"));
    let unacked = numbers
        .next()
        .unwrap_or_else(|| panic!("not acknowledged in {line:?}"));
    (acked, unacked)
}

/// The clicks dropped by reason, from the redirector's line before its last
/// (`redirector: dropped by reason: shutdown=N, unacknowledged=M`, logged when it dropped any):
/// empty when it dropped none.
pub fn final_drops(log: &[String]) -> std::collections::BTreeMap<String, u64> {
    const MARK: &str = "redirector: dropped by reason: ";
    let Some(line) = log.iter().rev().find(|l| l.contains(MARK)) else {
        return Default::default();
    };
    line[line.find(MARK).expect("found") + MARK.len()..]
        .split(", ")
        .map(|pair| {
            let (reason, n) = pair
                .split_once('=')
                .unwrap_or_else(|| panic!("reason=count in {line:?}"));
            let n = n
                .trim()
                .parse()
                .unwrap_or_else(|e| panic!("count in {line:?}: {e}"));
            (reason.to_owned(), n)
        })
        .collect()
}

/// The redirects served, from the redirector's last line (`... (N redirects served) ...`).
pub fn final_redirects(log: &[String]) -> u64 {
    let line = log
        .iter()
        .rev()
        .find(|l| l.contains(" redirects served"))
        .unwrap_or_else(|| panic!("no final count line in {log:#?}"));
    let before = &line[..line.find(" redirects served").expect("found")];
    let digits = before
        .rsplit(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap_or_default();
    digits
        .parse()
        .unwrap_or_else(|e| panic!("redirects in {line:?}: {e}"))
}

/// Waits until clicks for `code` start arriving in `clicks`.
pub async fn await_first_rows(db: &tokio_postgres::Client, code: &str) {
    let what = format!("the first rows in clicks for {code}");
    crate::eventually(&what, LIMIT, || async {
        (rows(db, Some(code)).await > 0).then_some(())
    })
    .await;
}
