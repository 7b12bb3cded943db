//! What the collector's tests share (feature `testkit`, tests only): starting the real binary,
//! a test sender that speaks the wire format, a writer task of its own, and reading the tables
//! back. A library module, so that each test binary takes the part it needs.

use std::collections::BTreeMap;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::batch::{self, Batch, Handoff};
use crate::db::Db;
use crate::metrics::{Health, Metrics};
use crate::unfolded::Unfolded;
use crate::writer::Writer;
use protocol::wire::{EncodeError, Encoder, DEFAULT_DATAGRAM};
use shared::pgtest::TestDb;
use shared::testkit::services::collector_command;
use std::sync::Arc;

pub use shared::testkit::db::await_rows;
pub use shared::testkit::services::Collector;
pub use shared::testkit::LIMIT;

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
    let db = shared::pgtest::test_db().await;
    let client = shared::pgtest::connect(&db.url).await;
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
    let mut enc = Encoder::new(sender, DEFAULT_DATAGRAM).unwrap();
    let mut out = Vec::new();
    for (code, at) in clicks {
        if let Err(EncodeError::Full) = enc.push(code, *at) {
            out.push(enc.datagram().to_vec());
            enc.next();
            enc.push(code, *at).unwrap();
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

/// A window that sets nothing aside.
const WIDE_OPEN: crate::batch::Window = crate::batch::Window {
    max_age_us: i64::MAX,
    max_skew_us: i64::MAX,
};

/// A batch holding `grams`, as the receiver builds it.
pub fn batch_of(grams: &[Vec<u8>]) -> Batch {
    let mut batch = Batch::default();
    let mut clicks = std::collections::HashMap::new();
    for g in grams {
        let d = protocol::wire::decode(g).unwrap();
        batch.push(&d, &WIDE_OPEN, start_us());
        let through = clicks.entry(d.sender).or_insert(0);
        *through += d.clicks.len() as u64;
        batch.note_sender(d.sender, d.seq, *through);
    }
    batch
}

/// A writer task of `instance` for `url` with `timeout`; the receiver's ends of its channels.
/// The spare batch the channel starts with is taken out, so each `recv` returns a written
/// batch.
pub async fn writer(
    url: &str,
    instance: &str,
    timeout: Duration,
    metrics: Arc<Metrics>,
) -> Handoff {
    writer_with_sums(url, instance, timeout, metrics).await.0
}

/// [`writer`], reporting whether the database is reachable into `health`.
pub async fn writer_with_health(
    url: &str,
    instance: &str,
    timeout: Duration,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
) -> Handoff {
    start_writer(url, instance, timeout, metrics, health)
        .await
        .0
}

/// [`writer`], with the sums it keeps of the batches it committed, for its folds.
pub async fn writer_with_sums(
    url: &str,
    instance: &str,
    timeout: Duration,
    metrics: Arc<Metrics>,
) -> (Handoff, Arc<Unfolded>) {
    start_writer(url, instance, timeout, metrics, Arc::default()).await
}

async fn start_writer(
    url: &str,
    instance: &str,
    timeout: Duration,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
) -> (Handoff, Arc<Unfolded>) {
    let (mut handoff, ends) = batch::handoff();
    let unfolded = Arc::new(Unfolded::new(protocol::wire::random_sender() as i64));
    let db = Db::parse(url).unwrap();
    let writer = Writer::new(
        db,
        instance,
        timeout,
        unfolded.clone(),
        metrics,
        health,
        None,
    );
    tokio::spawn(writer.run(ends));
    handoff.empty.recv().await.unwrap();
    (handoff, unfolded)
}

/// Folds now, whatever waits: the batches `own` holds the sums of, and every other writer's
/// rows (orphaned at once, with a zero interval).
pub async fn fold_all(
    client: &mut tokio_postgres::Client,
    own: &Unfolded,
) -> Result<Option<i64>, tokio_postgres::Error> {
    let policy = crate::compact::Policy {
        interval: Duration::ZERO,
        backlog: 1,
    };
    crate::compact::fold(client, &policy, own).await
}

/// Hands `batch` to the writer and waits until it is committed.
pub async fn write(handoff: &mut Handoff, batch: Batch) {
    handoff.full.send(batch).await.unwrap();
    handed_back(handoff).await;
}

/// Waits for the writer to be done with the batch it was sent.
pub async fn handed_back(handoff: &mut Handoff) {
    tokio::time::timeout(LIMIT, handoff.empty.recv())
        .await
        .expect("the writer hands the batch back")
        .unwrap();
}
