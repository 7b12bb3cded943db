//! The daily partitions of `clicks`: there ahead of time across a day boundary (the maintenance
//! is given the time), a day's partition vacuumed, analyzed and indexed once the day is over,
//! clicks outside the collector's window set aside while their batch lands, retention that
//! drops old days while their totals stay (by hand, and by a started collector's partition
//! task), a table holding a day's partition name reported, and the migration of a populated
//! unpartitioned table.

use std::sync::Arc;

use collector::upkeep::maintenance;
use collector::upkeep::Metrics;
mod support;

use protocol::wire::{Encoder, DEFAULT_DATAGRAM};
use support::*;
use testkit::collector::*;
use testkit::pgtest;

const DAY_US: i64 = 86_400_000_000;
const HOUR_US: i64 = 3_600_000_000;

/// Today's UTC midnight, in Unix microseconds.
fn midnight() -> i64 {
    let now = protocol::now_us();
    now - now.rem_euclid(DAY_US)
}

/// The names of the partitions of clicks, in order.
async fn partitions(client: &tokio_postgres::Client) -> Vec<String> {
    let sql = "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
               WHERE i.inhparent = 'clicks'::regclass ORDER BY 1";
    let rows = client.query(sql, &[]).await.unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

/// The partition name of the day of `at_us`.
async fn name_of(client: &tokio_postgres::Client, at_us: i64) -> String {
    let sql = "SELECT 'clicks_p' || to_char(to_timestamp($1::float8 / 1e6) AT TIME ZONE 'UTC', 'YYYYMMDD')";
    client
        .query_one(sql, &[&(at_us as f64)])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_are_there_ahead_of_time_across_a_day_boundary() {
    let db = testkit::pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    let metrics = Metrics::default();
    // Ten days on, a second before midnight: that day and the two after it exist already.
    let eve = midnight() + 11 * DAY_US - 1_000_000;
    maintenance::keep_partitions(&client, &policy(None), &metrics, eve)
        .await
        .unwrap();
    let names = partitions(&client).await;
    for day in 0..=2 {
        let name = name_of(&client, eve + day * DAY_US).await;
        assert!(names.contains(&name), "{name} in {names:?}");
    }
    let created = metrics.partitions_created.get();
    assert!(created >= 3, "{created} created");
    // Past midnight: one more day ahead, nothing else.
    maintenance::keep_partitions(&client, &policy(None), &metrics, eve + 2_000_000)
        .await
        .unwrap();
    assert_eq!(metrics.partitions_created.get(), created + 1);
    let after = name_of(&client, eve + 2_000_000 + 2 * DAY_US).await;
    assert!(partitions(&client).await.contains(&after));

    // A batch of clicks on both sides of that midnight lands: no day is missing.
    let mut handoff = writer(&db.url, "ahead", LIMIT, Arc::new(Counted::default())).await;
    let sent = clicks(2_000, 20, eve - 1_000_000, 1_000);
    write(&mut handoff, batch_of(&datagrams(5, &sent))).await;
    let stored = stored_clicks(&client).await;
    assert_eq!(stored.len(), 2_000);
}

/// Making a day's partition takes no lock a reader of `clicks` holds (a long report, a
/// `pg_dump`): before, it took the strongest lock there is on `clicks`, waited for the reader,
/// and every batch's COPY queued behind it. Behind what it does wait for (another attach or
/// detach, an ANALYZE of `clicks`: here a session holding that lock) it gives up after a short
/// wait, and the round goes on without it (the next round, days ahead, tries again); a batch
/// lands meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_is_made_behind_a_long_reader_and_a_held_attach_holds_no_batch_up() {
    let db = testkit::pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    let mut handoff = writer(&db.url, "reader", LIMIT, Arc::new(Counted::default())).await;
    let reader = pgtest::connect(&db.url).await;
    reader
        .batch_execute("BEGIN; SELECT 1 FROM clicks LIMIT 1")
        .await
        .unwrap();
    // Thirty days on: days to create.
    let later = midnight() + 30 * DAY_US;
    let (metrics, keep_all) = (Metrics::default(), policy(None));
    let round = maintenance::keep_partitions(&client, &keep_all, &metrics, later);
    tokio::time::timeout(LIMIT, round)
        .await
        .expect("made behind the reader")
        .unwrap();
    assert!(metrics.partitions_created.get() > 0);
    assert_eq!(metrics.partitions_deferred.get(), 0);

    let holder = pgtest::connect(&db.url).await;
    holder
        .batch_execute("BEGIN; LOCK TABLE ONLY clicks IN SHARE UPDATE EXCLUSIVE MODE")
        .await
        .unwrap();
    let later = later + 30 * DAY_US;
    let creating = {
        let url = db.url.clone();
        tokio::spawn(async move {
            let client = pgtest::connect(&url).await;
            let metrics = Metrics::default();
            let round = maintenance::keep_partitions(&client, &policy(None), &metrics, later).await;
            let counted = metrics.partitions_deferred.get();
            (round, metrics.partitions_created.get(), counted)
        })
    };
    let waiting = "SELECT count(*) FROM pg_locks
                   WHERE relation = 'clicks'::regclass AND mode = 'ShareUpdateExclusiveLock'
                     AND NOT granted";
    testkit::eventually("the creation waiting for its lock", LIMIT, || async {
        (count(&client, waiting).await > 0).then_some(())
    })
    .await;
    let sent = clicks(100, 5, start_us(), 1_000);
    write(&mut handoff, batch_of(&datagrams(3, &sent))).await;
    assert_eq!(stored_clicks(&client).await.len(), 100);
    let (round, created, deferred) = creating.await.unwrap();
    round.expect("the round goes on without the creation");
    assert_eq!(created, 0, "given up behind the held lock");
    assert_eq!(deferred, 1, "the round that gave up is counted");
    holder.batch_execute("COMMIT").await.unwrap();
    let metrics = Metrics::default();
    maintenance::keep_partitions(&client, &policy(None), &metrics, later)
        .await
        .unwrap();
    assert!(metrics.partitions_created.get() > 0);
    assert_eq!(metrics.partitions_deferred.get(), 0);
    reader.batch_execute("COMMIT").await.unwrap();
}

/// A start behind a held lock on `clicks` (another attach or detach, an ANALYZE of it): when
/// only a spare day ahead lacks its partition, giving up on creating it does not keep the
/// collector from starting (the partitions task tries again); it did, retried every few
/// seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_behind_a_held_lock_lacking_only_a_spare_day_is_ready() {
    let p = place().await;
    let mut first = start_collector(&p.db, &p.path, &[]).await;
    first.service.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(first.service.wait_exit(LIMIT).await.success());
    // Its partitions round's creation of the days ahead, cut off by the stop, would make the
    // day dropped below again.
    await_collector_sessions_gone(&p.client).await;
    let last = partitions(&p.client).await.pop().expect("partitions ahead");
    p.client
        .batch_execute(&format!("DROP TABLE {last}"))
        .await
        .unwrap();
    let holder = pgtest::connect(&p.db.url).await;
    holder
        .batch_execute("BEGIN; LOCK TABLE ONLY clicks IN SHARE UPDATE EXCLUSIVE MODE")
        .await
        .unwrap();
    let next = start_collector(&p.db, &p.path, &[]).await;
    next.service
        .wait_for_log(
            "creating the spare partitions of clicks ahead waited",
            LIMIT,
        )
        .await;
    send_all(&p.path, datagrams(1, &clicks(10, 2, start_us(), 1))).await;
    await_rows(&p.client, None, 10).await;
    holder.batch_execute("COMMIT").await.unwrap();
}

/// A partition as its day's end leaves it: autovacuum kept off, an index by code, pages all
/// all-visible out of pages in all, and the statistics rows ANALYZE left.
#[derive(Debug, PartialEq)]
struct DayState {
    autovacuum_off: bool,
    indexed: bool,
    visible_pages: i64,
    pages: i64,
    statistics: i64,
}

async fn day_state(client: &tokio_postgres::Client, name: &str) -> DayState {
    let sql = "
        SELECT coalesce('autovacuum_enabled=false' = ANY (c.reloptions), false),
               EXISTS (SELECT FROM pg_index AS ix JOIN pg_class AS x ON x.oid = ix.indexrelid
                       WHERE ix.indrelid = c.oid AND x.relname = c.relname || '_code'
                         AND ix.indisvalid),
               (SELECT all_visible FROM pg_visibility_map_summary(c.oid)),
               pg_relation_size(c.oid) / current_setting('block_size')::int8,
               (SELECT count(*) FROM pg_stats AS s WHERE s.tablename = c.relname)
        FROM pg_class AS c WHERE c.relname = $1";
    let row = client.query_one(sql, &[&name]).await.unwrap();
    DayState {
        autovacuum_off: row.get(0),
        indexed: row.get(1),
        visible_pages: row.get(2),
        pages: row.get(3),
        statistics: row.get(4),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_day_is_vacuumed_analyzed_and_indexed_once_it_is_over_and_not_before() {
    let db = testkit::pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    client
        .batch_execute("CREATE EXTENSION pg_visibility")
        .await
        .unwrap();
    // Migration 11 turned autovacuum off the partitions made before it from today on only.
    let now = protocol::now_us();
    let real_today = day_state(&client, &name_of(&client, now).await).await;
    let real_yesterday = day_state(&client, &name_of(&client, now - DAY_US).await).await;
    assert!(real_today.autovacuum_off && !real_yesterday.autovacuum_off);
    let metrics = Metrics::default();
    let noon = midnight() - 5 * DAY_US + 12 * HOUR_US;
    maintenance::keep_partitions(&client, &policy(None), &metrics, noon)
        .await
        .unwrap();
    let mut handoff = writer(&db.url, "settle", LIMIT, Arc::new(Counted::default())).await;
    let sent = clicks(3_000, 30, noon, 1_000);
    write(&mut handoff, batch_of(&datagrams(5, &sent))).await;
    let day = name_of(&client, noon).await;
    let next_day = name_of(&client, noon + DAY_US).await;
    // While its day lasts: filled, autovacuum off, nothing done to it.
    maintenance::keep_partitions(&client, &policy(None), &metrics, noon + HOUR_US)
        .await
        .unwrap();
    let filling = day_state(&client, &day).await;
    assert!(filling.pages > 0, "{day} holds the clicks: {filling:?}");
    assert_eq!(
        (
            filling.autovacuum_off,
            filling.indexed,
            filling.visible_pages,
            filling.statistics
        ),
        (true, false, 0, 0),
        "{day} while its day lasts"
    );

    // The next day: vacuumed (at each round until every page is all-visible: right after the
    // clicks' commit one may not be yet), analyzed, handed back to autovacuum, indexed; the
    // new today's partition is left alone.
    testkit::eventually("the closed day settled", LIMIT, || async {
        maintenance::keep_partitions(&client, &policy(None), &metrics, noon + DAY_US)
            .await
            .unwrap();
        (!day_state(&client, &day).await.autovacuum_off).then_some(())
    })
    .await;
    let settled = day_state(&client, &day).await;
    assert_eq!(
        (
            settled.autovacuum_off,
            settled.indexed,
            settled.visible_pages
        ),
        (false, true, settled.pages),
        "{day} once its day is over"
    );
    assert!(settled.statistics > 0, "{day} analyzed: {settled:?}");
    let today = day_state(&client, &next_day).await;
    assert!(
        today.autovacuum_off && !today.indexed,
        "{next_day}: {today:?}"
    );
    assert_eq!(stored_clicks(&client).await.len(), 3_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_click_outside_the_window_is_set_aside_and_counted_and_its_batch_lands() {
    let p = place().await;
    let window = ["--max-click-age", "1d", "--max-click-skew", "5m"];
    let c = start_collector(&p.db, &p.path, &window).await;
    let now = protocol::now_us();
    let mut enc = Encoder::new(31, DEFAULT_DATAGRAM).unwrap();
    // One click two days old, one an hour ahead, and clicks of now around them. The encoder
    // starts a datagram per jump in time (its offsets are relative to the first click).
    let mut grams = Vec::new();
    for (code, at) in [
        ("now", now - 1_000),
        ("old", now - 2 * DAY_US),
        ("now", now),
        ("new", now + HOUR_US),
        ("now", now + 1_000),
    ] {
        enc.push(code, at).unwrap();
        grams.push(enc.datagram().to_vec());
        enc.next();
    }
    send_all(&p.path, grams).await;
    await_rows(&p.client, None, 3).await;
    c.await_metric("collector_clicks_set_aside_total{reason=\"too_old\"}", 1.0)
        .await;
    c.await_metric("collector_clicks_set_aside_total{reason=\"too_new\"}", 1.0)
        .await;
    let aside = "SELECT string_agg(code || ':' || reason, ' ' ORDER BY code) FROM clicks_set_aside";
    let aside: String = p.client.query_one(aside, &[]).await.unwrap().get(0);
    assert_eq!(aside, "new:too_new old:too_old");
    let codes = "SELECT string_agg(DISTINCT code, ' ') FROM clicks";
    let codes: String = p.client.query_one(codes, &[]).await.unwrap().get(0);
    assert_eq!(codes, "now");
    let totals = "SELECT sum(clicks)::int8 FROM click_totals";
    assert_eq!(
        count(&p.client, totals).await,
        3,
        "set-aside clicks are not counted"
    );
    c.await_metric("collector_clicks_written_total", 3.0).await;
    // The writer lowers it just after raising the written count: a scrape may fall between.
    testkit::eventually("no pending clicks", LIMIT, || async {
        (c.metric("collector_pending_clicks").await == 0.0).then_some(())
    })
    .await;
}

/// A table that holds the name of a day's partition but is not one (a partition detached and
/// kept, to archive it or fill it apart) keeps that day's partition from being made: each
/// round counts the day in `collector_partitions_blocked` (and names the table in the log),
/// and once the table is renamed the next round makes the partition. Before, nothing said
/// why that day's clicks waited. A round that cannot look says nothing new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_holding_a_days_partition_name_is_reported_until_renamed() {
    let (_db, kept) = Rounds::start().await;
    let (client, metrics, tomorrow) = (&kept.client, &kept.metrics, &kept.tomorrow);
    let round = || kept.round();
    assert_eq!(metrics.partitions_blocked.get(), 0);
    let detach = format!("ALTER TABLE clicks DETACH PARTITION {tomorrow}");
    client.batch_execute(&detach).await.unwrap();
    round().await;
    assert_eq!(metrics.partitions_blocked.get(), 1);
    assert!(!partitions(client).await.contains(tomorrow));
    // A round that cannot look (here `clicks` is out of reach of its search path) leaves the
    // gauge as it was: zeroed, it would restart the alert's wait while the table still blocks.
    client.batch_execute("SET search_path = ''").await.unwrap();
    let blind = maintenance::keep_partitions(client, &policy(None), metrics, kept.now).await;
    assert!(blind.is_err(), "the round could not look");
    assert_eq!(metrics.partitions_blocked.get(), 1);
    client.batch_execute("RESET search_path").await.unwrap();
    let rename = format!("ALTER TABLE {tomorrow} RENAME TO {tomorrow}_archived");
    client.batch_execute(&rename).await.unwrap();
    round().await;
    assert_eq!(metrics.partitions_blocked.get(), 0);
    assert!(partitions(client).await.contains(tomorrow), "made again");
}

/// A migrated database whose partitions one round kept for now (no retention), to run more
/// rounds on; and the name of tomorrow's partition.
struct Rounds {
    client: tokio_postgres::Client,
    metrics: Metrics,
    now: i64,
    tomorrow: String,
}

impl Rounds {
    async fn start() -> (testkit::pgtest::TestDb, Rounds) {
        let db = testkit::pgtest::test_db().await;
        let client = pgtest::connect(&db.url).await;
        let now = protocol::now_us();
        let tomorrow = name_of(&client, now + DAY_US).await;
        let rounds = Rounds {
            client,
            metrics: Metrics::default(),
            now,
            tomorrow,
        };
        rounds.round().await;
        (db, rounds)
    }

    async fn round(&self) {
        maintenance::keep_partitions(&self.client, &policy(None), &self.metrics, self.now)
            .await
            .unwrap();
    }
}

/// A `DETACH ... CONCURRENTLY` of a day ahead interrupted (here cancelled while it waited for
/// a reader) leaves the partition being detached: no row is routed to it, and no other can be
/// made under its name. The round counts the day as blocked until the detach is finalized
/// and the table renamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_left_being_detached_is_reported() {
    let (db, kept) = Rounds::start().await;
    let (client, metrics, tomorrow) = (&kept.client, &kept.metrics, &kept.tomorrow);
    let reader = pgtest::connect(&db.url).await;
    let read = "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM clicks";
    reader.batch_execute(read).await.unwrap();
    let detacher = pgtest::connect(&db.url).await;
    let pid: i32 = detacher
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let detach = format!("ALTER TABLE clicks DETACH PARTITION {tomorrow} CONCURRENTLY");
    let detaching = tokio::spawn(async move { detacher.batch_execute(&detach).await });
    let pending = format!(
        "SELECT count(*) FROM pg_inherits
          WHERE inhrelid = '{tomorrow}'::regclass AND inhdetachpending"
    );
    testkit::eventually(
        "the detach pending, waiting for the reader",
        LIMIT,
        || async { (count(client, &pending).await == 1).then_some(()) },
    )
    .await;
    client
        .execute("SELECT pg_cancel_backend($1)", &[&pid])
        .await
        .unwrap();
    assert!(detaching.await.unwrap().is_err(), "cancelled");
    reader.batch_execute("COMMIT").await.unwrap();
    kept.round().await;
    assert_eq!(metrics.partitions_blocked.get(), 1);
    let finish = format!(
        "ALTER TABLE clicks DETACH PARTITION {tomorrow} FINALIZE;
         ALTER TABLE {tomorrow} RENAME TO {tomorrow}_archived"
    );
    client.batch_execute(&finish).await.unwrap();
    kept.round().await;
    assert_eq!(metrics.partitions_blocked.get(), 0);
    assert!(partitions(client).await.contains(tomorrow), "made again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_drops_old_partitions_and_their_totals_stay_exact() {
    let db = testkit::pgtest::test_db().await;
    let mut client = pgtest::connect(&db.url).await;
    let metrics = Metrics::default();
    // Ten days ago, the collector made that day's partitions; clicks landed there.
    let then = midnight() - 10 * DAY_US + 12 * HOUR_US;
    maintenance::keep_partitions(&client, &policy(None), &metrics, then)
        .await
        .unwrap();
    let metrics_w = Arc::new(Counted::default());
    let (mut handoff, own) = writer_with_sums(&db.url, "retention", LIMIT, metrics_w).await;
    let old = clicks(3_000, 30, then, 1_000);
    write(&mut handoff, batch_of(&datagrams(6, &old))).await;
    let recent = clicks(1_000, 30, start_us(), 1_000);
    write(&mut handoff, batch_of(&datagrams(7, &recent))).await;
    // Half the old day folded before the drop, half after: both stay counted.
    fold_all(&mut client, &own).await.unwrap();
    let more_old = clicks(500, 30, then + HOUR_US, 1_000);
    write(&mut handoff, batch_of(&datagrams(8, &more_old))).await;
    let old_day = name_of(&client, then).await;
    assert!(partitions(&client).await.contains(&old_day));
    // Tomorrow's partition, detached by an operator (to archive it, or fill it apart): kept.
    let tomorrow = name_of(&client, protocol::now_us() + DAY_US).await;
    let detach = |day: &str| format!("ALTER TABLE clicks DETACH PARTITION {day}");
    client.batch_execute(&detach(&tomorrow)).await.unwrap();
    // Nine days ago's, detached by an operator to keep its rows past the retention: kept too.
    let archived = name_of(&client, then + DAY_US).await;
    client.batch_execute(&detach(&archived)).await.unwrap();
    // Eight days ago's, detached by retention and not dropped (the round interrupted): dropped.
    let interrupted = name_of(&client, then + 2 * DAY_US).await;
    let retiring = format!(
        "COMMENT ON TABLE {interrupted} IS 'detached by the collector for retention, to be \
         dropped'; {}",
        detach(&interrupted)
    );
    client.batch_execute(&retiring).await.unwrap();
    // Clicks set aside ten days ago and today: the first past the retention.
    client
        .batch_execute(
            "INSERT INTO clicks_set_aside (code, clicked_at, reason, set_aside_at)
             VALUES ('old', now(), 'too_new', now() - interval '10 days'),
                    ('new', now(), 'too_new', now())",
        )
        .await
        .unwrap();

    maintenance::keep_partitions(&client, &policy(Some(3)), &metrics, protocol::now_us())
        .await
        .unwrap();
    let names = partitions(&client).await;
    assert!(!names.contains(&old_day), "{old_day} dropped: {names:?}");
    assert!(metrics.partitions_dropped.get() >= 1);
    let exists = |name: &str| format!("SELECT count(*) FROM pg_class WHERE relname = '{name}'");
    assert_eq!(
        count(&client, &exists(&old_day)).await,
        0,
        "detached and dropped"
    );
    assert_eq!(
        count(&client, &exists(&tomorrow)).await,
        1,
        "a later day kept"
    );
    assert_eq!(
        count(&client, &exists(&archived)).await,
        1,
        "an expired day an operator detached kept"
    );
    assert_eq!(
        count(&client, &exists(&interrupted)).await,
        0,
        "an expired day retention detached dropped"
    );
    let aside = "SELECT string_agg(code, ',') FROM clicks_set_aside WHERE code IN ('old', 'new')";
    let left: Option<String> = client.query_one(aside, &[]).await.unwrap().get(0);
    assert_eq!(left.as_deref(), Some("new"), "the old one set aside gone");
    assert_eq!(count(&client, "SELECT count(*) FROM clicks").await, 1_000);
    fold_all(&mut client, &own).await.unwrap();
    let mut all = old.clone();
    all.extend(more_old.clone());
    all.extend(recent.clone());
    assert_eq!(totals(&client, "click_totals").await, expected_totals(&all));
    assert_eq!(totals(&client, "click_counts").await, expected_totals(&all));
}

/// A step of the partitions round that fails fails alone: here dropping an expired day that a
/// view depends on. The other expired day is dropped and a closed day indexed all the same;
/// the round's error is the failed step's, at every round until someone acts. Before, the
/// round stopped at its first error, and every later step waited on it for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_step_of_the_partitions_round_leaves_the_others_done() {
    let db = testkit::pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    let viewed = partitions_ten_days_ago(&client).await;
    let next = name_of(&client, midnight() - 9 * DAY_US).await;
    // Two days ago: its partition made then, its day over now.
    let closed_at = midnight() - 2 * DAY_US + HOUR_US;
    maintenance::keep_partitions(&client, &policy(None), &Metrics::default(), closed_at)
        .await
        .unwrap();
    let closed = name_of(&client, closed_at).await;
    let view = format!("CREATE VIEW old_report AS SELECT code FROM {viewed}");
    client.batch_execute(&view).await.unwrap();

    let metrics = Metrics::default();
    for round in 0..2 {
        let failed =
            maintenance::keep_partitions(&client, &policy(Some(3)), &metrics, protocol::now_us())
                .await
                .expect_err("the drop the view holds up fails the round");
        assert_eq!(
            failed.code(),
            Some(&tokio_postgres::error::SqlState::DEPENDENT_OBJECTS_STILL_EXIST),
            "round {round}: {failed}"
        );
    }
    let exists = |name: &str| format!("SELECT count(*) FROM pg_class WHERE relname = '{name}'");
    assert_eq!(
        count(&client, &exists(&viewed)).await,
        1,
        "{viewed} kept by the view"
    );
    assert_eq!(count(&client, &exists(&next)).await, 0, "{next} dropped");
    assert!(
        metrics.partitions_dropped.get() >= 1,
        "the other expired days counted"
    );
    let index = format!("{closed}_code");
    assert_eq!(count(&client, &exists(&index)).await, 1, "{closed} indexed");
}

/// A day retention could not detach (here: beside a default partition, which `DETACH ...
/// CONCURRENTLY` refuses) is left a partition without retention's mark, so that an operator
/// who then detaches it by hand, to keep it, keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_day_retention_failed_to_detach_is_kept_once_an_operator_detaches_it() {
    let db = testkit::pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    let old = partitions_ten_days_ago(&client).await;
    let default = "CREATE TABLE clicks_default PARTITION OF clicks DEFAULT";
    client.batch_execute(default).await.unwrap();
    let (metrics, retention) = (Metrics::default(), policy(Some(3)));
    let round = || maintenance::keep_partitions(&client, &retention, &metrics, protocol::now_us());
    round()
        .await
        .expect_err("no concurrent detach beside a default partition");
    let marked = format!(
        "SELECT count(*) FROM pg_class
          WHERE relname = '{old}' AND obj_description(oid, 'pg_class') IS NOT NULL"
    );
    assert_eq!(count(&client, &marked).await, 0, "{old} unmarked");
    assert!(
        partitions(&client).await.contains(&old),
        "{old} a partition"
    );
    let by_hand = format!("ALTER TABLE clicks DETACH PARTITION {old}; DROP TABLE clicks_default");
    client.batch_execute(&by_hand).await.unwrap();
    round().await.unwrap();
    let exists = format!("SELECT count(*) FROM pg_class WHERE relname = '{old}'");
    assert_eq!(count(&client, &exists).await, 1, "{old} kept");
}

/// A host whose clock is days ahead of the database's reckons retention from the database's
/// day: it drops what is past the retention by that day, not the days every host still writes
/// to, which its own clock puts past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_clock_days_ahead_drops_only_what_the_database_day_expires() {
    let db = testkit::pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    let old = partitions_ten_days_ago(&client).await;
    let now = protocol::now_us();
    maintenance::keep_partitions(&client, &policy(None), &Metrics::default(), now)
        .await
        .unwrap();
    let (today, yesterday) = (
        name_of(&client, now).await,
        name_of(&client, now - DAY_US).await,
    );
    let ahead = now + 8 * DAY_US;
    maintenance::keep_partitions(&client, &policy(Some(3)), &Metrics::default(), ahead)
        .await
        .unwrap();
    let names = partitions(&client).await;
    assert!(!names.contains(&old), "{old} dropped: {names:?}");
    for kept in [&today, &yesterday] {
        assert!(names.contains(kept), "{kept} kept: {names:?}");
    }
}

/// Makes the partitions of ten days ago (and around): past a retention of 3 days. The name of
/// that day's.
async fn partitions_ten_days_ago(client: &tokio_postgres::Client) -> String {
    let old = midnight() - 10 * DAY_US + 12 * HOUR_US;
    maintenance::keep_partitions(client, &policy(None), &Metrics::default(), old)
        .await
        .unwrap();
    name_of(client, old).await
}

/// A start creates only what the first batch needs; the collector's partition task, beside it,
/// does the rest: here, dropping days past the retention soon after the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_collector_drops_expired_days_in_its_partition_task() {
    let p = place().await;
    let old_day = partitions_ten_days_ago(&p.client).await;
    assert!(partitions(&p.client).await.contains(&old_day));
    let c = start_collector(&p.db, &p.path, &["--retention", "3"]).await;
    // The metric counts a round's drops once the round is done, after the tables are gone.
    testkit::eventually("the expired day dropped and counted", LIMIT, || async {
        let gone = !partitions(&p.client).await.contains(&old_day);
        let counted = c.metric("collector_partitions_dropped_total").await >= 1.0;
        (gone && counted).then_some(())
    })
    .await;
}

/// While another collector sees to the partitions (holds their lock), a collector skips its
/// round: two would block each other's vacuums and index builds of the same day.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_skips_the_partitions_while_another_sees_to_them() {
    let p = place().await;
    let old_day = partitions_ten_days_ago(&p.client).await;
    let lock = format!("SELECT pg_advisory_lock({})", maintenance::PARTITIONS_LOCK);
    p.client.batch_execute(&lock).await.unwrap();
    let mut cmd = command(&p.db, &p.path, &["--retention", "3"]);
    cmd.env("RUST_LOG", "info,collector::upkeep::maintenance=debug");
    let c = Collector::spawn(cmd).await;
    c.ready().await;
    c.service
        .wait_for_log("another collector is seeing to the partitions", LIMIT)
        .await;
    assert!(
        partitions(&p.client).await.contains(&old_day),
        "{old_day} left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrating_a_populated_unpartitioned_table_loses_no_row() {
    let db = pgtest::cluster().fresh_database().await;
    let mut client = pgtest::connect(&db.url).await;
    schema::apply_up_to(&mut client, 5).await.unwrap();
    // 100,000 clicks of the last 100 days, and 3 dated decades ahead (the old decoder took any
    // year), in the unpartitioned table.
    client
        .batch_execute(
            "INSERT INTO clicks (code, clicked_at)
                 SELECT 'c' || (n % 97), now() - n * interval '86 seconds'
                 FROM generate_series(1, 100000) AS n;
             INSERT INTO clicks (code, clicked_at)
                 SELECT 'future', now() + interval '30 years' + n * interval '1 second'
                 FROM generate_series(1, 3) AS n;",
        )
        .await
        .unwrap();
    let before = "SELECT md5(string_agg(code || clicked_at::text, ',' ORDER BY code, clicked_at))
                  FROM clicks WHERE code <> 'future'";
    let digest: String = client.query_one(before, &[]).await.unwrap().get(0);

    assert_eq!(
        schema::apply_up_to(&mut client, 6).await.unwrap(),
        [6],
        "only the partitioning is left"
    );
    assert_eq!(count(&client, "SELECT count(*) FROM clicks").await, 100_000);
    let kept: String = client.query_one(before, &[]).await.unwrap().get(0);
    assert_eq!(kept, digest, "every row kept, unchanged");
    let aside = "SELECT count(*) FROM clicks_set_aside WHERE reason = 'migrated_future'";
    assert_eq!(count(&client, aside).await, 3);
    let legacy = "SELECT count(*) FROM clicks_before_partitioning";
    assert_eq!(count(&client, legacy).await, 100_000);

    // The migrations after it, which today's collector writes with.
    schema::apply(&mut client).await.unwrap();
    // New clicks go to day partitions; a late one dated before the migration to the old table.
    let mut handoff = writer(&db.url, "migrated", LIMIT, Arc::new(Counted::default())).await;
    let now = protocol::now_us();
    let fresh = clicks(10, 2, now, 1);
    write(&mut handoff, batch_of(&datagrams(9, &fresh))).await;
    let late = clicks(5, 2, now - 2 * HOUR_US, 1);
    write(&mut handoff, batch_of(&datagrams(10, &late))).await;
    assert_eq!(count(&client, legacy).await, 100_005);
    assert_eq!(count(&client, "SELECT count(*) FROM clicks").await, 100_015);

    // The writer COPYs a day's clicks straight into its partition only where that holds the
    // whole day: not on the day partitioning began (its start is in the old table), nor on a
    // day without a partition; those go through clicks, which routes each row.
    let today = collector::write::copy::pg_day(now);
    let mut direct = Vec::new();
    for day in [today, today + 1, today + 400] {
        let row = client
            .query_opt(collector::write::store::WHOLE_DAY, &[&day])
            .await
            .unwrap();
        direct.push(row.map(|r| r.get::<_, String>(0)));
    }
    let tomorrow: String = client
        .query_one(
            "SELECT 'clicks_p' || to_char(date '2000-01-01' + $1::int, 'YYYYMMDD')",
            &[&(today + 1)],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(direct, [None, Some(tomorrow), None]);
}
