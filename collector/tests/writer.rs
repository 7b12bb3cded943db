//! The batch writer against the private PostgreSQL: retries never write a batch twice.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use collector::write::batch::{Handoff, Noted, PassedOver};
mod support;

use support::*;
use testkit::collector::*;
use testkit::pgtest;

/// The instance name the writers of these tests write as.
const INSTANCE: &str = "writer-test";

/// An earlier attempt committed the batch and its answer was lost: the retry finds the
/// batch's number committed and does not write it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_number_is_committed_is_not_written_again() {
    assert_eq!(second_batch_after(Orphan::Committed).await, (700, 1_700));
}

/// How long an impatient writer's attempt may take.
const IMPATIENT: Duration = Duration::from_millis(300);

/// A writer whose attempts time out after [`IMPATIENT`], and its metrics.
async fn impatient_writer(url: &str) -> (Handoff, Arc<Counted>) {
    let metrics = Arc::new(Counted::default());
    (
        writer(url, INSTANCE, IMPATIENT, metrics.clone()).await,
        metrics,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_stuck_past_the_timeout_is_retried_and_lands_once() {
    let db = testkit::pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    let sent = clicks(2_000, 20, start_us(), 1_000);
    let grams = datagrams(41, &sent);
    let (mut handoff, metrics) = impatient_writer(&db.url).await;

    // Holding this lock stops every attempt midway, after its COPY into clicks.
    let mut locker = pgtest::connect(&db.url).await;
    let lock = locker.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE click_count_lists IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    handoff.full.send(batch_of(&grams)).await.unwrap();
    testkit::eventually("the first attempt to time out", LIMIT, || async {
        (metrics.shared.counts.db_errors.get() >= 1).then_some(())
    })
    .await;
    // The abandoned attempt's session, stuck behind the table lock, keeps the instance lock: two
    // retries asking for it mean one gave up waiting and the writer goes on trying.
    let retry = asking_for_the_lock(&client, 0, 0).await;
    asking_for_the_lock(&client, 0, retry).await;
    assert!(
        handoff.empty.try_recv().is_err(),
        "not written while locked"
    );
    lock.commit().await.unwrap();

    handed_back(&mut handoff).await;
    assert_eq!(count(&client, "SELECT count(*) FROM clicks").await, 2_000);
    assert_eq!(metrics.write.clicks_written.get(), 2_000);
}

/// A statement timeout the database sets (common on managed servers) shorter than a batch's
/// statements take (here a trigger's second on click_senders): the writer's session runs
/// without it, and the batch lands at its first attempt. Under it, every attempt was
/// cancelled, and the writer held on that batch for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_timeout_the_database_sets_does_not_cancel_a_slow_batch() {
    let db = testkit::pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    client
        .batch_execute(
            "CREATE FUNCTION sleep_a_second_now() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN PERFORM pg_sleep(1); RETURN NULL; END $$;
             CREATE TRIGGER slow_statement AFTER INSERT OR UPDATE ON click_senders
             FOR EACH STATEMENT EXECUTE FUNCTION sleep_a_second_now();",
        )
        .await
        .unwrap();
    let set = format!("ALTER DATABASE \"{}\" SET statement_timeout = 300", db.name);
    client.batch_execute(&set).await.unwrap();
    let metrics = Arc::new(Counted::default());
    let mut handoff = writer(&db.url, INSTANCE, Duration::from_secs(30), metrics.clone()).await;
    let sent = clicks(100, 10, start_us(), 1_000);
    handoff
        .full
        .send(batch_of(&datagrams(41, &sent)))
        .await
        .unwrap();
    handed_back(&mut handoff).await;
    assert_eq!(count(&client, "SELECT count(*) FROM clicks").await, 100);
    let errors = metrics.shared.counts.db_errors.get();
    assert_eq!(errors, 0, "attempts cancelled by the statement timeout");
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

/// After a write whose first attempt timed out in its COMMIT: checks that it did, and waits
/// until the abandoned attempts' sessions are done (the COMMIT landed or not).
async fn await_abandoned_commit(client: &tokio_postgres::Client, metrics: &Counted) {
    assert!(
        metrics.shared.counts.db_errors.get() >= 1,
        "the first attempt timed out in its COMMIT"
    );
    testkit::eventually("the abandoned attempts to finish", LIMIT, || async {
        (count(client, BUSY_SESSIONS).await == 0).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_outliving_the_timeout_is_not_written_again_by_the_retry() {
    let db = testkit::pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    client.batch_execute(SLOW_COMMIT).await.unwrap();
    let sent = clicks(3_000, 20, start_us(), 1_000);
    let (mut handoff, metrics) = impatient_writer(&db.url).await;

    // The first attempt times out in COMMIT, which the dropped connection's backend still
    // completes a moment later, while retries are under way.
    write(&mut handoff, batch_of(&datagrams(51, &sent))).await;
    await_abandoned_commit(&client, &metrics).await;
    assert_eq!(count(&client, "SELECT count(*) FROM clicks").await, 3_000);
    assert_eq!(
        count(&client, "SELECT sum(clicks)::int8 FROM click_totals").await,
        3_000
    );
    assert_eq!(metrics.write.clicks_written.get(), 3_000);
}

/// A batch with a click PostgreSQL refuses for good is sifted, and the sifting attempt times
/// out in its COMMIT, which lands: the retry finds the batch committed, and counts the refused
/// click set aside, not written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sifted_batch_whose_commit_answer_was_lost_counts_what_it_wrote() {
    let db = testkit::pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    client
        .batch_execute("ALTER TABLE clicks ADD CONSTRAINT no_poison CHECK (code <> 'poison')")
        .await
        .unwrap();
    client.batch_execute(SLOW_COMMIT).await.unwrap();
    let mut sent = clicks(300, 20, start_us(), 1_000);
    sent.push(("poison".into(), start_us()));
    let (mut handoff, metrics) = impatient_writer(&db.url).await;
    write(&mut handoff, batch_of(&datagrams(63, &sent))).await;
    await_abandoned_commit(&client, &metrics).await;
    assert_eq!(count(&client, "SELECT count(*) FROM clicks").await, 300);
    let aside = "SELECT count(*) FROM clicks_set_aside WHERE reason = 'refused'";
    assert_eq!(count(&client, aside).await, 1);
    assert_eq!(metrics.write.clicks_written.get(), 300);
}

/// A batch that forgets a sender commits, but its answer is lost (the attempt times out in
/// COMMIT): the retry's new session finds the sender's row gone, as the batch meant, and counts
/// nothing unaccounted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_forgotten_by_a_commit_whose_answer_was_lost_is_not_counted_lost() {
    let db = testkit::pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    let (mut handoff, metrics) = impatient_writer(&db.url).await;
    let forgotten = 61;
    write(
        &mut handoff,
        batch_of(&datagrams(forgotten, &clicks(500, 20, start_us(), 1_000))),
    )
    .await;
    client.batch_execute(SLOW_COMMIT).await.unwrap();
    let mut batch = batch_of(&datagrams(62, &clicks(300, 20, start_us(), 1_000)));
    batch.forget_senders(vec![forgotten]);
    write(&mut handoff, batch).await;
    await_abandoned_commit(&client, &metrics).await;
    let row = format!("SELECT count(*) FROM click_senders WHERE sender = {forgotten}");
    assert_eq!(
        count(&client, &row).await,
        0,
        "forgotten, as the batch said"
    );
    assert_eq!(metrics.shared.counts.clicks_unaccounted.get(), 0);
    assert_eq!(count(&client, "SELECT count(*) FROM clicks").await, 800);
}

/// An asynchronous failover lost a batch whose sender record passed clicks over (a datagram
/// rejected whole: counted as rejected as it committed, in no row): the writer's next session
/// counts as unaccounted only the clicks it wrote, whatever the batch it kept passed over.
/// Clicks it set aside are counted as unaccounted too: their rows are lost as well. The records
/// put back are refused at first: the loss is counted once all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clicks_a_failover_lost_that_were_passed_over_are_not_counted_again() {
    let db = testkit::pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    let metrics = Arc::new(Counted::default());
    let mut handoff = writer(&db.url, INSTANCE, LIMIT, metrics.clone()).await;
    let day_us = 86_400_000_000;
    let window = collector::write::batch::DateWindow {
        max_age_us: day_us,
        max_skew_us: day_us,
    };
    // `new` recent clicks of `sender`, `old` ones that the window sets aside, and then a
    // datagram of `passed` clicks passed over.
    let batch = |sender, (new, old, passed)| {
        let mut sent = clicks(new, 20, start_us(), 1_000);
        sent.extend(clicks(old, 20, start_us() - 10 * day_us, 1_000));
        let grams = datagrams(sender, &sent);
        let mut batch = batch_within(&grams, &window);
        let last = protocol::wire::decode(grams.last().unwrap()).unwrap().seq;
        let rejected = PassedOver {
            rejected: passed,
            ..PassedOver::default()
        };
        batch.pass_over(sender, rejected);
        let through = (new + old) as u64 + passed;
        batch.note_sender(sender, Noted::at(last + 1, through));
        batch
    };
    write(&mut handoff, batch(71, (500, 0, 50))).await;
    // The standby's state when the primary died: the first batch, not the second.
    let (senders, writers) = ("click_senders", "click_writers");
    for table in [senders, writers] {
        let keep = format!("CREATE TABLE kept_{table} AS SELECT * FROM {table}");
        client.batch_execute(&keep).await.unwrap();
    }
    write(&mut handoff, batch(72, (300, 100, 200))).await;
    let aside = "SELECT count(*) FROM clicks_set_aside";
    assert_eq!(count(&client, aside).await, 100, "set aside as too old");
    for table in [senders, writers] {
        let back = format!("DELETE FROM {table}; INSERT INTO {table} SELECT * FROM kept_{table}");
        client.batch_execute(&back).await.unwrap();
    }
    client.batch_execute(REFUSING_SENDERS).await.unwrap();
    let others = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                  WHERE datname = current_database() AND pid <> pg_backend_pid()";
    client.batch_execute(others).await.unwrap();
    let last = batch_of(&datagrams(73, &clicks(100, 20, start_us(), 1_000)));
    handoff.full.send(last).await.unwrap();
    let unaccounted = || metrics.shared.counts.clicks_unaccounted.get();
    testkit::eventually("the loss counted", LIMIT, || async {
        (unaccounted() > 0).then_some(())
    })
    .await;
    let refused = metrics.shared.counts.db_errors.get();
    testkit::eventually("the put-back refused again", LIMIT, || async {
        (metrics.shared.counts.db_errors.get() > refused).then_some(())
    })
    .await;
    client.batch_execute("DELETE FROM refusing").await.unwrap();
    handed_back(&mut handoff).await;
    let row = "SELECT count(*) FROM click_senders WHERE sender = 72";
    assert_eq!(count(&client, row).await, 1, "put back");
    assert_eq!(
        unaccounted(),
        300 + 100,
        "the lost clicks that were not passed over, once"
    );
}

/// While `refusing` has a row, every write to click_senders fails.
const REFUSING_SENDERS: &str = "
    CREATE TABLE refusing AS SELECT 1 AS n;
    CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF EXISTS (SELECT FROM refusing) THEN
            RAISE EXCEPTION 'refused by the test';
        END IF;
        RETURN NEW;
    END
    $$;
    CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON click_senders
        FOR EACH ROW EXECUTE FUNCTION refuse();";

/// What another session (as an abandoned attempt of the writer's would) did with the claim of
/// the writer's second batch.
enum Orphan {
    /// Committed it before the writer got to the batch.
    Committed,
    /// Holds it uncommitted, and commits once the writer waits for it.
    CommitsWhileWaitedFor,
    /// Holds it uncommitted, and rolls back once the writer waits for it.
    RollsBackWhileWaitedFor,
}

/// The claim alone, without the instance lock in play: the writer writes a first batch of 700
/// clicks, then a second of 1,000 whose number `orphan` claimed. Returns the rows in clicks
/// (checked against the deltas) and the clicks the writer counts as written, once it handed
/// the second batch back.
async fn second_batch_after(orphan: Orphan) -> (i64, u64) {
    let db = testkit::pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    let metrics = Arc::new(Counted::default());
    let mut handoff = writer(&db.url, INSTANCE, LIMIT, metrics.clone()).await;
    let first = datagrams(71, &clicks(700, 20, start_us(), 1_000));
    write(&mut handoff, batch_of(&first)).await;
    let writer: i64 = client
        .query_one("SELECT writer FROM click_writers WHERE last_batch = 1", &[])
        .await
        .unwrap()
        .get(0);
    let mut other = pgtest::connect(&db.url).await;
    let claim = other.transaction().await.unwrap();
    let update = "UPDATE click_writers SET last_batch = 2 WHERE writer = $1";
    assert_eq!(claim.execute(update, &[&writer]).await.unwrap(), 1);
    if let Orphan::Committed = orphan {
        claim.commit().await.unwrap();
        write(&mut handoff, batch_of(&second_grams())).await;
    } else {
        handoff.full.send(batch_of(&second_grams())).await.unwrap();
        testkit::eventually("the writer to wait on its row", LIMIT, || async {
            let waiting = "SELECT count(*) FROM pg_stat_activity
                           WHERE datname = current_database() AND wait_event_type = 'Lock'";
            (count(&client, waiting).await == 1).then_some(())
        })
        .await;
        match orphan {
            Orphan::CommitsWhileWaitedFor => claim.commit().await.unwrap(),
            _ => claim.rollback().await.unwrap(),
        }
        handed_back(&mut handoff).await;
    }
    assert_eq!(metrics.shared.counts.db_errors.get(), 0);
    let rows = count(&client, "SELECT count(*) FROM clicks").await;
    let deltas = "SELECT sum(clicks)::int8 FROM click_totals";
    assert_eq!(count(&client, deltas).await, rows);
    (rows, metrics.write.clicks_written.get())
}

fn second_grams() -> Vec<Vec<u8>> {
    datagrams(72, &clicks(1_000, 20, start_us(), 1_000))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claim_waits_for_an_uncommitted_claim_and_then_skips_the_batch() {
    let got = second_batch_after(Orphan::CommitsWhileWaitedFor).await;
    assert_eq!(got, (700, 1_700));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claim_waits_for_an_uncommitted_claim_and_writes_the_batch_once_it_rolls_back() {
    let got = second_batch_after(Orphan::RollsBackWhileWaitedFor).await;
    assert_eq!(got, (1_700, 1_700));
}

/// As if the instance lock's session had been lost and another collector had taken over: the
/// batches' senders have later seqs committed already (all of them for the first batch, one of
/// two for the second). That says nothing about these batches: their clicks are written, and
/// the committed seqs are not moved back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn later_seqs_committed_by_another_collector_do_not_make_the_writer_skip_a_batch() {
    let db = testkit::pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    client
        .batch_execute("INSERT INTO click_senders (sender, last_seq) VALUES (81, 1000), (83, 1000)")
        .await
        .unwrap();
    let sent = clicks(6_000, 20, start_us(), 1_000);
    let mut second = datagrams(82, &sent[2_000..4_000]);
    second.extend(datagrams(83, &sent[4_000..]));
    let metrics = Arc::new(Counted::default());
    let mut handoff = writer(&db.url, INSTANCE, LIMIT, metrics.clone()).await;

    write(&mut handoff, batch_of(&datagrams(81, &sent[..2_000]))).await;
    write(&mut handoff, batch_of(&second)).await;
    let mut want = sent.clone();
    want.sort();
    assert_eq!(stored_clicks(&client).await, want, "every click once");
    assert_eq!(metrics.write.clicks_written.get(), 6_000);
    let seqs =
        "SELECT string_agg(sender || ':' || last_seq, ' ' ORDER BY sender) FROM click_senders";
    let seqs: String = client.query_one(seqs, &[]).await.unwrap().get(0);
    let last_82 = datagrams(82, &sent[2_000..4_000]).len() - 1;
    assert!(last_82 > 0, "sender 82 sent several datagrams");
    assert_eq!(seqs, format!("81:1000 82:{last_82} 83:1000"));
}

/// Another session holds the instance lock (as a connection of an abandoned attempt can, until
/// its last statement ends): attempts time out waiting for it and reconnect, which is no
/// database outage: no error is counted and the database stays reachable. Once the lock is
/// free, the batch is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_the_writer_lock_held_by_another_session_is_not_a_database_outage() {
    let db = testkit::pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    let holder = pgtest::connect(&db.url).await;
    collector::write::lock::take(
        &holder,
        INSTANCE,
        &mut shared::throttle::Throttle::per_outage(),
        (&Default::default(), &Default::default()),
    )
    .await
    .unwrap();
    let holder_pid: i32 = holder
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let metrics = Arc::new(Counted::default());
    let health = &metrics.shared.health;
    health.writes.store(true, Relaxed);
    let mut handoff = writer(&db.url, INSTANCE, IMPATIENT, metrics.clone()).await;
    let grams = datagrams(91, &clicks(500, 20, start_us(), 1_000));
    handoff.full.send(batch_of(&grams)).await.unwrap();

    // Each attempt asks for the lock on a connection of its own: a second one asking means
    // the first gave up waiting.
    let first = asking_for_the_lock(&client, holder_pid, 0).await;
    // Shown all along, between the attempts too.
    let waiting = || metrics.write.instance_lock_waiting.get();
    testkit::eventually("the wait for the lock shown", LIMIT, || async {
        (waiting() == 1).then_some(())
    })
    .await;
    let second = asking_for_the_lock(&client, holder_pid, first);
    tokio::pin!(second);
    loop {
        tokio::select! {
            _ = &mut second => break,
            () = tokio::time::sleep(Duration::from_millis(2)) => {
                assert_eq!(waiting(), 1, "the wait for the lock shown");
            }
        }
    }
    assert!(
        handoff.empty.try_recv().is_err(),
        "not written while locked"
    );
    assert_eq!(metrics.shared.counts.db_errors.get(), 0);
    assert!(health.writes.load(Relaxed));
    drop(holder);

    handed_back(&mut handoff).await;
    assert_eq!(count(&client, "SELECT count(*) FROM clicks").await, 500);
    assert_eq!(metrics.shared.counts.db_errors.get(), 0);
    assert_eq!(waiting(), 0, "the wait is over");
}

/// Waits for a session other than `holder` and `not` asking for the instance lock; its pid.
async fn asking_for_the_lock(client: &tokio_postgres::Client, holder: i32, not: i32) -> i32 {
    let asking = "SELECT pid FROM pg_stat_activity
                  WHERE datname = current_database() AND pid <> pg_backend_pid()
                    AND pid <> $1 AND pid <> $2 AND query LIKE '%pg_try_advisory_lock%'";
    testkit::eventually("a writer connection asking for the lock", LIMIT, || async {
        let rows = client.query(asking, &[&holder, &not]).await.unwrap();
        rows.first().map(|r| r.get(0))
    })
    .await
}

/// A collector forgets idle sender ids by deleting their click_senders rows with a batch: only
/// its own instance's (and rows from before instances were recorded), never another host's
/// live one, and each committed row is marked with the instance and the clicks up to its seq.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forgetting_a_sender_deletes_only_this_instances_row() {
    let db = testkit::pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    client
        .batch_execute(
            "INSERT INTO click_senders (sender, last_seq, updated_at, instance) VALUES
                 (7, 3, now(), 'another-host'), (8, 3, now(), 'writer-test'), (9, 3, now(), NULL)",
        )
        .await
        .unwrap();
    let mut handoff = writer(&db.url, INSTANCE, LIMIT, Arc::new(Counted::default())).await;
    let grams = datagrams(41, &clicks(30, 3, start_us(), 1_000));
    let mut batch = batch_of(&grams);
    batch.forget_senders(vec![7, 8, 9]);
    write(&mut handoff, batch).await;

    let left = "SELECT sender, instance, clicks FROM click_senders ORDER BY sender";
    let left: Vec<(i64, Option<String>, i64)> = client
        .query(left, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        left,
        [
            (7, Some("another-host".into()), 0),
            (41, Some(INSTANCE.into()), 30)
        ]
    );
}
