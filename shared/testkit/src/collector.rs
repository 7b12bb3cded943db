//! What the collector's tests share: starting the real binary, a test sender that speaks the
//! wire format, and reading the tables back. (What needs the collector's internals, a writer
//! task of its own, is in `collector/tests/support`.)

use std::collections::BTreeMap;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::pgtest::TestDb;
use crate::services::collector_command;
use protocol::dimensions::Dimensions;
use protocol::wire::{EncodeError, Encoder, DEFAULT_DATAGRAM};

pub use crate::db::await_rows;
pub use crate::services::Collector;
pub use crate::LIMIT;

const DAY_US: i64 = 86_400_000_000;

/// Starts the collector for `db` on `socket` with [`command`]'s flags, and waits until it is
/// ready.
pub async fn start_collector(db: &TestDb, socket: &Path, extra: &[&str]) -> Collector {
    let collector = Collector::spawn(command(db, socket, extra)).await;
    collector.ready().await;
    collector
}

/// The collector command line for `db` and `socket`, with a click window wide enough for these
/// tests (unless `extra` sets it): their clicks start yesterday evening and may run past now.
pub fn command(db: &TestDb, socket: &Path, extra: &[&str]) -> Command {
    let mut flags = Vec::new();
    for (flag, wide) in [("--max-click-age", "2d"), ("--max-click-skew", "1d")] {
        if !extra.contains(&flag) {
            flags.extend([flag, wide]);
        }
    }
    flags.extend_from_slice(extra);
    collector_command(&db.url, socket, &flags)
}

/// A temp dir and a socket path inside it.
pub fn socket_path() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run/collector.sock");
    (dir, path)
}

/// What most tests start from: a migrated database and a client of it, and a socket path in
/// a temp dir of its own .
pub struct Place {
    pub db: TestDb,
    pub client: tokio_postgres::Client,
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
}

pub async fn place() -> Place {
    place_on(crate::pgtest::cluster()).await
}

/// A [`Place`] whose database is on `cluster`.
pub async fn place_on(cluster: &crate::pgtest::Cluster) -> Place {
    let db = crate::pgtest::test_db_on(cluster).await;
    let client = crate::pgtest::connect(&db.url).await;
    let (dir, path) = socket_path();
    Place {
        db,
        client,
        dir,
        path,
    }
}

/// Where the tests' clicks start: yesterday 23:30 UTC, so that a few thousand seconds of
/// clicks cross a UTC midnight into today, whose partitions exist (migration 6 creates
/// yesterday's to the day after tomorrow's), and the collector's window (`command` widens it
/// to two days back and one ahead) takes them all.
pub fn start_us() -> i64 {
    let now = protocol::now_us();
    now - now.rem_euclid(DAY_US) - 30 * 60 * 1_000_000
}

/// `n` clicks with distinct timestamps from `start_us`, `step_us` apart, over `codes` codes.
pub fn clicks(n: usize, codes: usize, start_us: i64, step_us: i64) -> Vec<(String, i64)> {
    (0..n)
        .map(|i| {
            let code = format!("c{}-{}", (i * 7919) % codes, i % 3);
            (code, start_us + i as i64 * step_us)
        })
        .collect()
}

/// The datagrams of one sender for `clicks`, seq 0, 1, 2, ...
pub fn datagrams(sender: u64, clicks: &[(String, i64)]) -> Vec<Vec<u8>> {
    let human = Dimensions::default();
    let clicks = clicks.iter().map(|(code, at)| (code.as_str(), *at, human));
    datagrams_of(Encoder::new(sender, DEFAULT_DATAGRAM).unwrap(), clicks)
}

/// A click with what a version-2 sender records of it.
pub type DimensionedClick = (String, i64, Dimensions<'static>);

/// The datagrams of one sender of wire version `version` (1: without the dimensions, as a
/// sender of an earlier release writes them) for `clicks`, seq 0, 1, 2, ...
pub fn datagrams_with(version: u8, sender: u64, clicks: &[DimensionedClick]) -> Vec<Vec<u8>> {
    let enc = Encoder::of_version(version, sender, DEFAULT_DATAGRAM).unwrap();
    datagrams_of(
        enc,
        clicks.iter().map(|(code, at, d)| (code.as_str(), *at, *d)),
    )
}

fn datagrams_of<'a>(
    mut enc: Encoder,
    clicks: impl IntoIterator<Item = (&'a str, i64, Dimensions<'a>)>,
) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (code, at, d) in clicks {
        if let Err(EncodeError::Full) = enc.push_with(code, at, &d) {
            out.push(enc.datagram().to_vec());
            enc.next();
            enc.push_with(code, at, &d).unwrap();
        }
    }
    if !enc.is_empty() {
        out.push(enc.datagram().to_vec());
    }
    out
}

/// A sender connected to `path`, as a redirector is: a full queue makes `send` wait.
pub fn connect(path: &Path) -> UnixDatagram {
    let sock = UnixDatagram::unbound().unwrap();
    sock.connect(path)
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", path.display()));
    sock.set_write_timeout(Some(LIMIT)).unwrap();
    sock
}

/// Sends every datagram in order on a connected socket, waiting whenever the queue is full.
pub async fn send_all(path: &Path, datagrams: Vec<Vec<u8>>) {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        let sock = connect(&path);
        for d in &datagrams {
            sock.send(d).unwrap_or_else(|e| panic!("sending: {e}"));
        }
    })
    .await
    .unwrap();
}

pub async fn count(client: &tokio_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.unwrap().get(0)
}

/// Waits until no session of a stopped collector is left on `client`'s database: one whose
/// client went away runs its statement to the end (a partitions round's creation of a day, a
/// writer's commit), and could still change what the test does next.
pub async fn await_collector_sessions_gone(client: &tokio_postgres::Client) {
    let sessions = "SELECT count(*) FROM pg_stat_activity
                    WHERE datname = current_database() AND application_name LIKE 'collector %'";
    crate::eventually(
        "the stopped collector's sessions gone",
        crate::LIMIT,
        || async { (count(client, sessions).await == 0).then_some(()) },
    )
    .await;
}

/// Every row of `clicks` as (code, Unix microseconds), sorted.
pub async fn stored_clicks(client: &tokio_postgres::Client) -> Vec<(String, i64)> {
    let sql = "SELECT code, (extract(epoch FROM clicked_at) * 1000000)::int8 FROM clicks";
    let mut rows: Vec<(String, i64)> = client
        .query(sql, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    rows.sort();
    rows
}

/// Clicks per (code, days since 1970-01-01 UTC).
pub type Totals = BTreeMap<(String, i32), i64>;

pub fn expected_totals(clicks: &[(String, i64)]) -> Totals {
    let mut totals = Totals::new();
    for (code, at) in clicks {
        *totals
            .entry((code.clone(), at.div_euclid(DAY_US) as i32))
            .or_default() += 1;
    }
    totals
}

/// `source` (click_totals or click_counts) as [`Totals`].
pub async fn totals(client: &tokio_postgres::Client, source: &str) -> Totals {
    let sql = format!("SELECT code, (day - date '1970-01-01'), clicks FROM {source}");
    client
        .query(&sql, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| ((r.get(0), r.get(1)), r.get(2)))
        .collect()
}
