//! What the collector's own tests share that needs its internals: a batch as the receiver
//! builds it, and a writer task of its own. Included by the test files that use it.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use collector::db::Db;
use collector::metrics::Shared;
use collector::write::batch::{self, Batch, Handoff, Noted};
use collector::write::unfolded::Unfolded;
use collector::write::writer::Writer;
use collector::write::Metrics;
use testkit::collector::start_us;
use testkit::LIMIT;

/// A window that sets nothing aside.
const WIDE_OPEN: collector::write::batch::DateWindow = collector::write::batch::DateWindow {
    max_age_us: i64::MAX,
    max_skew_us: i64::MAX,
};

/// What a writer counts, unregistered: its own metrics, and those it shares with the other
/// components (`db_errors`, the health).
#[derive(Debug, Default)]
pub struct Counted {
    pub write: Arc<Metrics>,
    pub shared: Arc<Shared>,
}

/// A batch holding `grams`, as the receiver builds it.
pub fn batch_of(grams: &[Vec<u8>]) -> Batch {
    batch_within(grams, &WIDE_OPEN)
}

/// A batch holding `grams`, as the receiver builds it with `window` at [`start_us`]: clicks
/// outside it set aside.
pub fn batch_within(grams: &[Vec<u8>], window: &batch::DateWindow) -> Batch {
    let mut batch = Batch::default();
    let mut clicks = std::collections::HashMap::new();
    for g in grams {
        let d = protocol::wire::decode(g).unwrap();
        batch.push(&d, window, start_us());
        let through = clicks.entry(d.sender).or_insert(0);
        *through += d.clicks.len() as u64;
        batch.note_sender(d.sender, Noted::at(d.seq, *through));
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
    metrics: Arc<Counted>,
) -> Handoff {
    writer_with_sums(url, instance, timeout, metrics).await.0
}

/// [`writer`], with the sums it keeps of the batches it committed, for its folds.
pub async fn writer_with_sums(
    url: &str,
    instance: &str,
    timeout: Duration,
    metrics: Arc<Counted>,
) -> (Handoff, Arc<Unfolded>) {
    let (mut handoff, ends) = batch::handoff();
    let unfolded = Arc::new(Unfolded::new(protocol::wire::random_sender() as i64));
    let db = Db::parse(url).unwrap();
    let writer = Writer::new(
        db,
        instance,
        timeout,
        unfolded.clone(),
        metrics.write.clone(),
        metrics.shared.clone(),
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
    let policy = collector::upkeep::compact::Policy {
        interval: Duration::ZERO,
        backlog: 1,
        slice: collector::upkeep::compact::SLICE_ENTRIES,
    };
    collector::upkeep::compact::fold(client, &policy, own).await
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

/// The maintenance policy of the partition and retention tests: a day back and ahead, folds on
/// the defaults' scale, retention as given.
pub fn policy(retention_days: Option<i32>) -> collector::upkeep::maintenance::Policy {
    collector::upkeep::maintenance::Policy {
        fold: collector::upkeep::compact::Policy {
            interval: Duration::from_secs(60),
            backlog: 1_000_000,
            slice: collector::upkeep::compact::SLICE_ENTRIES,
        },
        window_back_days: 1,
        window_ahead_days: 1,
        retention_days,
        timeout: LIMIT,
    }
}
