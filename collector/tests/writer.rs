//! The batch writer against the private PostgreSQL: retries never write a batch twice.

mod common;

use std::sync::Arc;
use std::time::Duration;

use collector::batch::{self, Batch, Handoff};
use collector::copy::Writer;
use collector::db::Db;
use collector::metrics::Metrics;
use common::*;
use shared::pgtest;

/// 2026-09-01T00:00:00Z.
const START_US: i64 = 1_788_220_800_000_000;

/// A batch holding `grams`, as the receiver builds it.
fn batch_of(grams: &[Vec<u8>]) -> Batch {
    let mut batch = Batch::default();
    for g in grams {
        let d = shared::wire::decode(g).unwrap();
        batch.push(&d);
        batch.note_sender(d.sender, d.seq);
    }
    batch
}

/// A writer task for `url` with `timeout`; the receiver's ends of its channels. The spare
/// batch the channel starts with is taken out, so each `recv` returns a written batch.
async fn writer(url: &str, timeout: Duration, metrics: Arc<Metrics>) -> Handoff {
    let (mut handoff, ends) = batch::handoff();
    let writer = Writer::new(Db::parse(url).unwrap(), timeout, metrics, None);
    tokio::spawn(writer.run(ends));
    handoff.empty.recv().await.unwrap();
    handoff
}

async fn write(handoff: &mut Handoff, batch: Batch) {
    handoff.full.send(batch).await.unwrap();
    handed_back(handoff).await;
}

/// Waits for the writer to be done with the batch it was sent.
async fn handed_back(handoff: &mut Handoff) {
    tokio::time::timeout(LIMIT, handoff.empty.recv())
        .await
        .expect("the writer hands the batch back")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_seqs_are_committed_is_not_written_again() {
    let db = collector::migrations::test_db().await;
    let client = pgtest::connect(&db.url).await;
    let sent = clicks(5_000, 20, START_US, 1_000);
    let mut grams = datagrams(31, &sent);
    grams.extend(datagrams(32, &sent[..10]));
    let metrics = Arc::new(Metrics::default());
    let mut handoff = writer(&db.url, LIMIT, metrics).await;

    write(&mut handoff, batch_of(&grams)).await;
    // The same batch again, as after a COMMIT whose answer was lost.
    write(&mut handoff, batch_of(&grams)).await;
    assert_eq!(count(&client, "SELECT count(*) FROM clicks").await, 5_010);
    assert_eq!(
        count(&client, "SELECT sum(clicks)::int8 FROM click_count_deltas").await,
        5_010
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_stuck_past_the_timeout_is_retried_and_lands_once() {
    let db = collector::migrations::test_db().await;
    let client = pgtest::connect(&db.url).await;
    let sent = clicks(2_000, 20, START_US, 1_000);
    let grams = datagrams(41, &sent);
    let metrics = Arc::new(Metrics::default());
    let mut handoff = writer(&db.url, Duration::from_millis(300), metrics.clone()).await;

    // Holding this lock stops every attempt midway, after its COPY into clicks.
    let mut locker = pgtest::connect(&db.url).await;
    let lock = locker.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE click_count_deltas IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    handoff.full.send(batch_of(&grams)).await.unwrap();
    shared::testkit::eventually("two attempts to time out", LIMIT, || async {
        (metrics.db_errors.get() >= 2).then_some(())
    })
    .await;
    assert!(
        handoff.empty.try_recv().is_err(),
        "not written while locked"
    );
    lock.commit().await.unwrap();

    handed_back(&mut handoff).await;
    assert_eq!(count(&client, "SELECT count(*) FROM clicks").await, 2_000);
    assert_eq!(metrics.clicks_written.get(), 2_000);
}

/// Makes every commit that touched click_senders take a second, in the COMMIT itself: a
/// deferred constraint trigger runs there, after every statement of the transaction.
const SLOW_COMMIT: &str = "
    CREATE FUNCTION sleep_a_second() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_sleep(1);
        RETURN NULL;
    END
    $$;
    CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT OR UPDATE ON click_senders
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION sleep_a_second();";

/// Sessions of this database, other than the caller's, still running a statement or inside a
/// transaction.
const BUSY_SESSIONS: &str = "
    SELECT count(*) FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid()
      AND state IN ('active', 'idle in transaction', 'idle in transaction (aborted)')";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_outliving_the_timeout_is_not_written_again_by_the_retry() {
    let db = collector::migrations::test_db().await;
    let client = pgtest::connect(&db.url).await;
    client.batch_execute(SLOW_COMMIT).await.unwrap();
    let sent = clicks(3_000, 20, START_US, 1_000);
    let metrics = Arc::new(Metrics::default());
    let mut handoff = writer(&db.url, Duration::from_millis(300), metrics.clone()).await;

    // The first attempt times out in COMMIT, which the dropped connection's backend still
    // completes a moment later, while retries are under way.
    write(&mut handoff, batch_of(&datagrams(51, &sent))).await;
    assert!(metrics.db_errors.get() >= 1, "the first attempt timed out");
    shared::testkit::eventually("the abandoned attempts to finish", LIMIT, || async {
        (count(&client, BUSY_SESSIONS).await == 0).then_some(())
    })
    .await;
    assert_eq!(count(&client, "SELECT count(*) FROM clicks").await, 3_000);
    assert_eq!(
        count(&client, "SELECT sum(clicks)::int8 FROM click_count_deltas").await,
        3_000
    );
    assert_eq!(metrics.clicks_written.get(), 3_000);
}

/// The claim alone, without the writer lock in play: a transaction of another session (as an
/// abandoned attempt's would be) has moved the sender to the batch's seq but not committed.
/// The writer's claim waits for it and, once it commits, sees the batch as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claim_waits_for_an_uncommitted_claim_and_then_skips_the_batch() {
    let db = collector::migrations::test_db().await;
    let client = pgtest::connect(&db.url).await;
    let grams = datagrams(71, &clicks(1_000, 20, START_US, 1_000));
    let last_seq = (grams.len() - 1) as i64;
    let mut orphan = pgtest::connect(&db.url).await;
    let orphan = orphan.transaction().await.unwrap();
    orphan
        .execute(
            "INSERT INTO click_senders (sender, last_seq) VALUES (71, $1)",
            &[&last_seq],
        )
        .await
        .unwrap();
    let metrics = Arc::new(Metrics::default());
    let mut handoff = writer(&db.url, LIMIT, metrics.clone()).await;
    handoff.full.send(batch_of(&grams)).await.unwrap();
    shared::testkit::eventually("the writer to wait on the sender's row", LIMIT, || async {
        let waiting = "SELECT count(*) FROM pg_stat_activity
                       WHERE datname = current_database() AND wait_event_type = 'Lock'";
        (count(&client, waiting).await == 1).then_some(())
    })
    .await;
    orphan.commit().await.unwrap();

    handed_back(&mut handoff).await;
    assert_eq!(count(&client, "SELECT count(*) FROM clicks").await, 0);
    assert_eq!(metrics.db_errors.get(), 0);
}
