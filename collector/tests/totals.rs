//! `click_totals` is exact at every moment: each reader snapshot's totals agree with the rows
//! of `clicks`, key by key, while several writers commit batches and folds move the counts
//! into `click_counts`, and when a fold is cut off midway.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use collector::upkeep::compact::{self, Apply};
mod support;

use collector::write::unfolded::{Unfolded, CHUNK_KEYS};
use support::*;
use testkit::collector::*;
use testkit::pgtest;

/// Keys whose totals differ from their rows in `clicks`, in one snapshot (one statement).
const DISAGREEING: &str = "
    SELECT count(*) FROM (
        SELECT code, (clicked_at AT TIME ZONE 'UTC')::date AS day, count(*) AS clicks
        FROM clicks GROUP BY 1, 2
    ) AS rows FULL JOIN click_totals AS totals USING (code, day)
    WHERE rows.clicks IS DISTINCT FROM totals.clicks";

/// Checks `DISAGREEING` until `done`; returns how many snapshots it checked.
async fn check_until(url: String, done: Arc<AtomicBool>) -> u64 {
    let client = pgtest::connect(&url).await;
    let mut checks = 0;
    while !done.load(Relaxed) {
        assert_eq!(
            count(&client, DISAGREEING).await,
            0,
            "after {checks} checks"
        );
        checks += 1;
    }
    checks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn totals_are_exact_at_every_moment_with_concurrent_writers_and_folds() {
    let db = testkit::pgtest::test_db().await;
    let done = Arc::new(AtomicBool::new(false));
    let checker = tokio::spawn(check_until(db.url.clone(), done.clone()));
    let folds = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    let mut sums = Vec::new();
    for w in 0..3u64 {
        let metrics = Arc::new(Counted::default());
        let (handoff, own) = writer_with_sums(&db.url, &format!("host{w}"), LIMIT, metrics).await;
        sums.push(own);
        writers.push(tokio::spawn(async move {
            let mut handoff = handoff;
            for b in 0..30 {
                let start = start_us() + (b * 3 + w as i64) * 1_000_000;
                let sent = clicks(1_000, 300, start, 997);
                write(&mut handoff, batch_of(&datagrams(100 + w, &sent))).await;
            }
        }));
    }
    // Folds in turn: each writer's from its sums, and a stranger's, which folds every other
    // writer's rows the SQL way at once, so that both ways race for the same rows.
    let stranger = Arc::new(Unfolded::new(-1));
    let folder = {
        let (url, done, folds) = (db.url.clone(), done.clone(), folds.clone());
        let turns: Vec<_> = sums.iter().cloned().chain([stranger.clone()]).collect();
        tokio::spawn(async move {
            let mut client = pgtest::connect(&url).await;
            for own in turns.iter().cycle() {
                if done.load(Relaxed) {
                    break;
                }
                if fold_all(&mut client, own).await.unwrap().is_some() {
                    folds.fetch_add(1, Relaxed);
                }
            }
        })
    };
    for w in writers {
        w.await.unwrap();
    }
    testkit::eventually("a fold after the last batch", LIMIT, || async {
        let seen = folds.load(Relaxed);
        (seen >= 30).then_some(())
    })
    .await;
    done.store(true, Relaxed);
    folder.await.unwrap();
    let checks = checker.await.unwrap();
    let client = pgtest::connect(&db.url).await;
    assert_eq!(count(&client, "SELECT count(*) FROM clicks").await, 90_000);
    assert_eq!(count(&client, DISAGREEING).await, 0);
    let mut client = client;
    fold_all(&mut client, &stranger).await.unwrap();
    let folded = "SELECT coalesce(sum(clicks), 0)::int8 FROM click_counts";
    assert_eq!(
        count(&client, folded).await,
        90_000,
        "all folded in the end"
    );
    eprintln!("{checks} snapshots checked, {} folds", folds.load(Relaxed));
    assert!(checks >= 10, "only {checks} snapshots checked");
}

/// A fresh database, a client on it, a writer of `instance` holding its sums, and a policy that
/// folds whatever there is.
struct Folding {
    _db: pgtest::TestDb,
    client: tokio_postgres::Client,
    handoff: collector::write::batch::Handoff,
    own: Arc<Unfolded>,
    policy: compact::Policy,
    /// How this server's folds apply their sums.
    way: Apply,
}

/// The ways of applying sums the harness's server has: the upsert on every one, MERGE from
/// PostgreSQL 15 on.
async fn ways() -> Vec<Apply> {
    let client = pgtest::connect(&pgtest::cluster().url("postgres")).await;
    match Apply::of(&client).await.unwrap() {
        Apply::Merge => vec![Apply::Merge, Apply::Upsert],
        Apply::Upsert => vec![Apply::Upsert],
    }
}

/// Two parts of [`clicks`], each written as a batch.
type Halves<'a> = (&'a [(String, i64)], &'a [(String, i64)]);

impl Folding {
    /// Writes `a` and `b` as two batches, from senders `sender` and `sender + 1`, then folds
    /// by `way`: the keys the fold moved.
    async fn write_two_and_fold(
        &mut self,
        sender: u64,
        (a, b): Halves<'_>,
        way: Apply,
    ) -> Option<i64> {
        write(&mut self.handoff, batch_of(&datagrams(sender, a))).await;
        write(&mut self.handoff, batch_of(&datagrams(sender + 1, b))).await;
        let moved = compact::fold_with(&mut self.client, &self.policy, &self.own, way).await;
        moved.unwrap()
    }
}

async fn folding(instance: &str) -> Folding {
    let db = pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    let metrics = Arc::new(Counted::default());
    let (handoff, own) = writer_with_sums(&db.url, instance, LIMIT, metrics).await;
    let policy = compact::Policy {
        interval: std::time::Duration::ZERO,
        backlog: 1,
        slice: compact::SLICE_ENTRIES,
    };
    let way = Apply::of(&client).await.unwrap();
    Folding {
        _db: db,
        client,
        handoff,
        own,
        policy,
        way,
    }
}

/// Both ways a fold applies its sums, MERGE and the upsert for servers before PostgreSQL 15
/// (valid on later ones too), add to the keys click_counts holds and insert the others, each
/// key once: each way the server has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_ways_of_applying_the_sums_count_every_key_once() {
    for way in ways().await {
        let mut f = folding("ways").await;
        // Every key new; then, across the midnight after them, keys there and keys new.
        let first = clicks(3_000, 300, start_us(), 1_000);
        let second = clicks(6_000, 900, start_us() + 3_000_000, 600_000);
        let mut sent = Vec::new();
        for (seq, part) in [(5, &first), (7, &second)] {
            // Two batches sharing keys: folded from the sums, the fold moves one sum per key;
            // from the rows (had the sums been set aside), one per key and batch.
            let halves = part.split_at(part.len() / 2);
            let moved = f.write_two_and_fold(seq, halves, way).await;
            let keys = expected_totals(part).len() as i64;
            assert_eq!(moved, Some(keys), "{way:?} folded its sums");
            sent.extend(part.iter().cloned());
            assert_eq!(
                totals(&f.client, "click_counts").await,
                expected_totals(&sent),
                "{way:?}"
            );
        }
    }
}

/// Sums of more keys than one statement takes go in several, in one transaction: every key
/// once, by both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sums_of_more_keys_than_a_statement_takes_go_in_chunks() {
    for way in ways().await {
        let mut f = folding("chunks").await;
        let keys = 2 * CHUNK_KEYS + 1_000;
        // Each key twice: once in each of two batches (its clicks 7,919 apart).
        let sent = clicks(2 * keys, keys, start_us(), 10);
        let moved = f.write_two_and_fold(5, sent.split_at(keys), way).await;
        let expected = expected_totals(&sent);
        assert_eq!(moved, Some(expected.len() as i64), "{way:?}");
        assert_eq!(totals(&f.client, "click_counts").await, expected, "{way:?}");
    }
}

/// A fold whose session is killed in the middle of its statement is rolled back whole: the
/// totals stay exact, and the next fold moves everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fold_cut_off_midway_leaves_the_totals_exact() {
    let db = testkit::pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    let metrics = Arc::new(Counted::default());
    let (mut handoff, own) = writer_with_sums(&db.url, "cutoff", LIMIT, metrics).await;
    let sent = clicks(20_000, 2_000, start_us(), 1_000);
    write(&mut handoff, batch_of(&datagrams(7, &sent[..10_000]))).await;
    // Every key's upsert now takes a millisecond: the fold is long enough to be cut off.
    client
        .batch_execute(
            "CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN PERFORM pg_sleep(0.001); RETURN NEW; END $$;
             CREATE TRIGGER slow BEFORE INSERT OR UPDATE ON click_counts
                 FOR EACH ROW EXECUTE FUNCTION slow();",
        )
        .await
        .unwrap();
    let url = db.url.clone();
    let folding = {
        let own = own.clone();
        tokio::spawn(async move {
            let mut client = pgtest::connect(&url).await;
            fold_all(&mut client, &own).await
        })
    };
    let busy = "SELECT pid FROM pg_stat_activity
                WHERE datname = current_database() AND query LIKE '%INTO click_counts%'
                  AND state = 'active' AND pid <> pg_backend_pid()";
    let pid: i32 = testkit::eventually("the fold under way", LIMIT, || async {
        client.query_opt(busy, &[]).await.unwrap().map(|r| r.get(0))
    })
    .await;
    // A batch commits while the fold runs, then the fold's session is killed.
    write(&mut handoff, batch_of(&datagrams(8, &sent[10_000..]))).await;
    assert_eq!(count(&client, DISAGREEING).await, 0);
    client
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    assert!(folding.await.unwrap().is_err(), "the fold was cut off");
    assert_eq!(count(&client, DISAGREEING).await, 0);
    assert_eq!(count(&client, "SELECT count(*) FROM click_counts").await, 0);

    client
        .batch_execute("DROP TRIGGER slow ON click_counts")
        .await
        .unwrap();
    let mut client = client;
    assert!(fold_all(&mut client, &own).await.unwrap().is_some());
    assert_eq!(count(&client, DISAGREEING).await, 0);
    assert_eq!(
        totals(&client, "click_counts").await,
        expected_totals(&sent)
    );
}

/// A fold that runs for other writers' rows or for the breakdown lists leaves this collector's
/// sums until they are due by their own rule: a backlog of breakdowns, a slice a fold, would
/// otherwise fold them at every look, upserting each key as often.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fold_not_due_for_its_own_sums_leaves_them_for_later() {
    let mut f = folding("not-due").await;
    f.policy = compact::Policy {
        interval: std::time::Duration::from_secs(3600),
        backlog: 1_000_000,
        slice: compact::SLICE_ENTRIES,
    };
    let list = "INSERT INTO click_breakdown_lists
                    (day, dimension, entries, code_list, value_list, count_list, writer, batch)
                VALUES (current_date, 'country', 2, 'a b', 'DE FR', '1 2', 999, 1)";
    f.client.execute(list, &[]).await.unwrap();
    let sent = clicks(2_000, 200, start_us(), 1_000);
    let moved = f.write_two_and_fold(3, sent.split_at(1_000), f.way).await;
    assert_eq!(moved, Some(0), "no count moved");
    let own = "SELECT count(*) FROM click_count_lists";
    assert!(count(&f.client, own).await > 0, "its batches' counts wait");
    let breakdowns = "SELECT count(*) FROM click_breakdown_lists";
    assert_eq!(count(&f.client, breakdowns).await, 0, "the breakdowns went");
    let folded = "SELECT count(*) FROM click_breakdown_counts";
    assert_eq!(
        count(&f.client, folded).await,
        2,
        "into click_breakdown_counts"
    );
    assert_eq!(count(&f.client, DISAGREEING).await, 0);
    // Due (any age, any size): they go.
    f.policy.interval = std::time::Duration::ZERO;
    let moved = compact::fold_with(&mut f.client, &f.policy, &f.own, f.way).await;
    assert!(moved.unwrap().is_some_and(|keys| keys > 0));
    assert_eq!(count(&f.client, own).await, 0);
    assert_eq!(count(&f.client, DISAGREEING).await, 0);
}

/// A fold that an asynchronous failover lost after its commit returned (its batches' rows back,
/// click_counts without their counts, the sums gone from memory) is folded again, the SQL way,
/// once those rows are older than `orphaned_after`; before, they waited for a restart of the
/// collector, and `CompactionBehind` fired meanwhile. The rows of a later batch, whose sums the
/// collector holds, wait for those sums, however old.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fold_lost_in_a_failover_is_folded_again_from_its_rows() {
    let mut f = folding("lost").await;
    let sent = clicks(2_000, 200, start_us(), 1_000);
    for (sender, part) in [(3, &sent[..1_000]), (4, &sent[1_000..])] {
        write(&mut f.handoff, batch_of(&datagrams(sender, part))).await;
    }
    let keep = "CREATE TABLE kept AS SELECT * FROM click_count_lists";
    f.client.batch_execute(keep).await.unwrap();
    let moved = compact::fold_with(&mut f.client, &f.policy, &f.own, f.way).await;
    let keys = expected_totals(&sent).len() as i64;
    assert_eq!(moved.unwrap(), Some(keys), "folded from its sums");
    let lost = "INSERT INTO click_count_lists SELECT * FROM kept; TRUNCATE click_counts;
                UPDATE click_count_lists SET written_at = now()";
    f.client.batch_execute(lost).await.unwrap();
    assert_eq!(count(&f.client, DISAGREEING).await, 0);
    // Its own sums not due, and the rows younger than orphaned_after: left for now.
    f.policy = compact::Policy {
        interval: std::time::Duration::from_secs(60),
        backlog: 1_000_000,
        slice: compact::SLICE_ENTRIES,
    };
    let later = clicks(500, 200, start_us() + 5_000_000, 1_000);
    write(&mut f.handoff, batch_of(&datagrams(5, &later))).await;
    let due = compact::due(&f.client, &f.policy, &f.own).await.unwrap();
    assert!(!due, "due for rows younger than orphaned_after");
    let moved = compact::fold_with(&mut f.client, &f.policy, &f.own, f.way).await;
    assert_eq!(moved.unwrap(), Some(0));
    let aged = "UPDATE click_count_lists SET written_at = now() - interval '1 hour'";
    f.client.batch_execute(aged).await.unwrap();
    let due = compact::due(&f.client, &f.policy, &f.own).await.unwrap();
    assert!(due, "not due for its own rows that no sums hold");
    let moved = compact::fold_with(&mut f.client, &f.policy, &f.own, f.way).await;
    let entries = count(&f.client, "SELECT sum(entries)::int8 FROM kept").await;
    assert_eq!(moved.unwrap(), Some(entries), "folded from its rows");
    assert_eq!(count(&f.client, DISAGREEING).await, 0);
    assert_eq!(
        totals(&f.client, "click_counts").await,
        expected_totals(&sent)
    );
    let own = "SELECT count(*) FROM click_count_lists";
    assert!(count(&f.client, own).await > 0, "the held sums' rows wait");
    f.policy.interval = std::time::Duration::ZERO;
    let moved = compact::fold_with(&mut f.client, &f.policy, &f.own, f.way).await;
    assert!(moved.unwrap().is_some_and(|keys| keys > 0), "from its sums");
    assert_eq!(count(&f.client, own).await, 0);
    let all: Vec<_> = sent.iter().chain(&later).cloned().collect();
    assert_eq!(
        totals(&f.client, "click_counts").await,
        expected_totals(&all)
    );
}

/// A row of another writer's (999) orphaned counts, batch $1 written $1 hours ago: $2 entries
/// over $3 codes, one click each.
const BACKLOG_COUNTS: &str = "
    WITH g AS (SELECT 'c' || (n % $3::int8) AS code FROM generate_series(1, $2::int8) AS n)
    INSERT INTO click_count_lists
        (day, entries, code_list, count_list, writer, batch, written_at)
    SELECT current_date, count(*), string_agg(code, ' '), string_agg('1', ' '), 999, $1,
           now() - $1::int8 * interval '1 hour'
    FROM g";

/// [`BACKLOG_COUNTS`], of the country breakdown.
const BACKLOG_BREAKDOWNS: &str = "
    WITH g AS (SELECT 'c' || (n % $3::int8) AS code FROM generate_series(1, $2::int8) AS n)
    INSERT INTO click_breakdown_lists (day, dimension, entries, code_list, value_list,
                                       count_list, writer, batch, written_at)
    SELECT current_date, 'country', count(*), string_agg(code, ' '), string_agg('DE', ' '),
           string_agg('1', ' '), 999, $1, now() - $1::int8 * interval '1 hour'
    FROM g";

/// A backlog whose full slices, in one fold, outlast the round's deadline (`--write-timeout`):
/// every such fold was rolled back and tried again whole, for ever. The rounds after a failed
/// one take smaller slices, and the collector folds it all, exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_whose_slices_outlast_the_write_timeout_is_folded_in_smaller_ones() {
    const CODES: i64 = 1_000;
    // A fold takes a slice of whole rows (a batch's): a full slice is 50 of these, of counts
    // and of breakdowns each, about a second's work here, three times the deadline below; the
    // least slice takes one row of each.
    const PER_ROW: i64 = 20_000;
    const ROWS: i64 = 60;
    let p = place().await;
    for batch in 1..=ROWS {
        for sql in [BACKLOG_COUNTS, BACKLOG_BREAKDOWNS] {
            let args = [&batch as _, &PER_ROW as _, &CODES as _];
            p.client.execute(sql, &args).await.unwrap();
        }
    }
    let c = start_collector(&p.db, &p.path, &["--write-timeout", "300ms"]).await;
    c.service
        .wait_for_log("its folds take at most", LIMIT)
        .await;
    let waiting = "SELECT (SELECT count(*) FROM click_count_lists)
                        + (SELECT count(*) FROM click_breakdown_lists)";
    testkit::eventually("the backlog folded", LIMIT, || async {
        (count(&p.client, waiting).await == 0).then_some(())
    })
    .await;
    let each = ROWS * PER_ROW / CODES;
    for table in ["click_counts", "click_breakdown_counts"] {
        let sql = format!("SELECT count(*) FROM {table} WHERE clicks = {each}");
        assert_eq!(count(&p.client, &sql).await, CODES, "{table}");
    }
}

/// A backlog that only the SQL way folds goes a slice a fold, oldest first: a fold's round has a
/// deadline, and one that took a large backlog whole outlasted it at every round, so that it
/// was never folded. Other writers' orphaned counts and the breakdown lists, each in rows of
/// 0.6 of a slice (so one row a fold), exact once all is folded.
#[tokio::test]
async fn a_large_backlog_of_others_counts_and_of_breakdowns_goes_a_slice_a_fold() {
    const CODES: i64 = 1_000;
    let db = pgtest::test_db().await;
    let mut client = pgtest::connect(&db.url).await;
    let per_row = compact::SLICE_ENTRIES * 6 / 10;
    for hours in 1..=4i64 {
        for sql in [BACKLOG_COUNTS, BACKLOG_BREAKDOWNS] {
            client
                .execute(sql, &[&hours, &per_row, &CODES])
                .await
                .unwrap();
        }
    }
    let waiting = "SELECT (SELECT count(*) FROM click_count_lists)
                        + (SELECT count(*) FROM click_breakdown_lists)";
    let own = Unfolded::new(1);
    let breakdowns_left = "SELECT count(*) FROM click_breakdown_lists";
    let mut folds = Vec::new();
    while count(&client, waiting).await > 0 {
        assert!(folds.len() < 8, "still waiting after folds of {folds:?}");
        let moved = fold_all(&mut client, &own).await.unwrap().expect("a fold");
        folds.push((moved, count(&client, breakdowns_left).await));
    }
    let one_row_a_fold = [(per_row, 3), (per_row, 2), (per_row, 1), (per_row, 0)];
    assert_eq!(
        folds, one_row_a_fold,
        "(counts moved, breakdown lists left) by each fold"
    );
    let each = 4 * per_row / CODES;
    for table in ["click_counts", "click_breakdown_counts"] {
        let sql = format!("SELECT count(*) FROM {table} WHERE clicks = {each}");
        assert_eq!(count(&client, &sql).await, CODES, "{table}");
    }
}

/// What collectors of earlier builds left (arrays from before migration 10, deltas from before
/// 5) is folded a slice a fold too, the oldest arrays first: an upgrade that left tens of
/// millions of them, taken whole, outlasted the fold's deadline at every round. Four arrays of
/// 0.6 of a slice (one a fold) and 2.5 slices of deltas; `click_totals` exact after each fold.
#[tokio::test]
async fn an_earlier_builds_backlog_goes_a_slice_a_fold() {
    const SLICE: i64 = 100;
    let db = pgtest::test_db().await;
    let mut client = pgtest::connect(&db.url).await;
    client
        .batch_execute(
            "INSERT INTO click_count_batches (day, entries, codes, counts, written_at)
             SELECT '2026-01-01', 60, array_agg('old-' || g), array_agg(1::int8),
                    now() - h * interval '1 hour'
             FROM generate_series(1, 4) AS h, generate_series(1, 60) AS g GROUP BY h;
             INSERT INTO click_count_deltas
             SELECT 'old-' || (g % 60 + 1), '2026-01-01', 1 FROM generate_series(1, 250) AS g",
        )
        .await
        .unwrap();
    let policy = compact::Policy {
        interval: std::time::Duration::ZERO,
        backlog: 1,
        slice: SLICE,
    };
    let own = Unfolded::new(1);
    let total = "SELECT coalesce(sum(clicks), 0)::int8 FROM click_totals";
    let left = "SELECT (SELECT count(*) FROM click_count_batches)
                     + (SELECT count(*) FROM click_count_deltas)";
    let mut folds = Vec::new();
    while count(&client, left).await > 0 {
        assert!(folds.len() < 8, "still waiting after folds of {folds:?}");
        let moved = compact::fold(&mut client, &policy, &own).await.unwrap();
        folds.push(moved.expect("a fold"));
        assert_eq!(count(&client, total).await, 4 * 60 + 250, "after {folds:?}");
    }
    assert_eq!(folds, [160, 160, 110, 60], "counts moved by each fold");
    let folded = "SELECT coalesce(sum(clicks), 0)::int8 FROM click_counts";
    assert_eq!(count(&client, folded).await, 4 * 60 + 250);
}

/// The fold of collectors of migration 9's version (`git show cbafdf2:collector/src/compact.rs`),
/// which may still run during a rolling upgrade: it reads only click_count_batches' arrays.
const FOLD_ROWS_OF_VERSION_9: &str = "
    WITH batches AS (
        DELETE FROM click_count_batches
        WHERE (writer = $1 AND batch <= $2) OR writer IS NULL
           OR (writer <> $1 AND written_at < now() - $3::float8 * interval '1 second')
        RETURNING day, codes, counts, entries),
    rows AS (DELETE FROM click_count_deltas RETURNING code, day, clicks),
    moved AS (
        SELECT u.code, b.day, u.clicks
        FROM batches AS b, unnest(b.codes, b.counts) AS u(code, clicks)
        UNION ALL
        SELECT code, day, clicks FROM rows),
    folded AS (
        INSERT INTO click_counts (code, day, clicks)
        SELECT code, day, sum(clicks) FROM moved GROUP BY code, day ORDER BY code, day
        ON CONFLICT (code, day) DO UPDATE SET clicks = click_counts.clicks + EXCLUDED.clicks)
    SELECT (SELECT coalesce(sum(entries), 0) FROM batches)::int8 + (SELECT count(*) FROM rows)";

/// During a rolling upgrade: an earlier collector's fold, which knows only arrays, leaves this
/// version's count lists alone (it would otherwise delete them and add nothing), and this
/// version's fold takes what earlier collectors left, arrays and deltas alike.
#[tokio::test]
async fn a_rolling_upgrade_folds_both_versions_rows_once() {
    let db = testkit::pgtest::test_db().await;
    let mut client = pgtest::connect(&db.url).await;
    let sent = clicks(3_000, 200, start_us(), 1_000);
    let (mut handoff, own) =
        writer_with_sums(&db.url, "new", LIMIT, Arc::new(Counted::default())).await;
    write(&mut handoff, batch_of(&datagrams(5, &sent))).await;
    // What collectors of earlier versions wrote: arrays with and without a writer, a delta.
    client
        .batch_execute(
            "INSERT INTO click_count_batches (day, entries, codes, counts, writer, batch)
                  VALUES ('2026-01-01', 2, '{old-a,old-b}', '{3,4}', 77, 1);
             INSERT INTO click_count_batches (day, entries, codes, counts)
                  VALUES ('2026-01-01', 1, '{old-a}', '{5}');
             INSERT INTO click_count_deltas VALUES ('old-b', '2026-01-01', 6);",
        )
        .await
        .unwrap();
    let mut expected = expected_totals(&sent);
    let jan1 = 20_454; // 2026-01-01, in days since 1970-01-01
    expected.insert(("old-a".into(), jan1), 8);
    expected.insert(("old-b".into(), jan1), 10);
    assert_eq!(totals(&client, "click_totals").await, expected);

    // The earlier version folds everything it can see, as a stranger with no interval.
    let moved: i64 = client
        .query_one(FOLD_ROWS_OF_VERSION_9, &[&-1i64, &0i64, &0f64])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        moved, 4,
        "its own kind: two arrays' three entries and a delta"
    );
    assert_eq!(totals(&client, "click_totals").await, expected);
    let lists = count(&client, "SELECT count(*) FROM click_count_lists").await;
    assert!(lists > 0, "this version's lists are left alone");

    // More from an earlier collector, then this version's fold: its own lists and those.
    client
        .batch_execute(
            "INSERT INTO click_count_batches (day, entries, codes, counts)
                  VALUES ('2026-01-01', 1, '{old-c}', '{7}');
             INSERT INTO click_count_deltas VALUES ('old-c', '2026-01-01', 1);",
        )
        .await
        .unwrap();
    expected.insert(("old-c".into(), jan1), 8);
    assert!(fold_all(&mut client, &own).await.unwrap().is_some());
    assert_eq!(totals(&client, "click_counts").await, expected);
    let pending = "SELECT (SELECT count(*) FROM click_count_lists)
                        + (SELECT count(*) FROM click_count_batches)
                        + (SELECT count(*) FROM click_count_deltas)";
    assert_eq!(count(&client, pending).await, 0);
}

/// Folds that fail at every look (here `click_counts` refuses every row) leave the backlog's
/// gauges telling: the oldest count's age grows, so that CompactionBehind can fire. They were
/// set only after a look whose fold went, and froze at their last values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backlog_gauges_keep_moving_while_folds_fail() {
    let p = place().await;
    let refuse = "ALTER TABLE click_counts ADD CONSTRAINT refuse_all CHECK (false) NOT VALID";
    p.client.batch_execute(refuse).await.unwrap();
    let c = start_collector(&p.db, &p.path, &["--compact-interval", "1s"]).await;
    send_all(&p.path, datagrams(1, &clicks(10, 5, start_us(), 1_000))).await;
    await_rows(&p.client, None, 10).await;
    testkit::eventually("the oldest count's age past 5 s", LIMIT, || async {
        let age = c.metric("collector_deltas_oldest_seconds").await;
        (age >= 5.0).then_some(())
    })
    .await;
    assert!(c.metric("collector_deltas_pending").await > 0.0);
    assert!(
        c.metric("collector_db_errors_total").await > 0.0,
        "the folds failed"
    );
    p.client
        .batch_execute("ALTER TABLE click_counts DROP CONSTRAINT refuse_all")
        .await
        .unwrap();
    testkit::eventually(
        "the backlog folded once the table takes rows",
        LIMIT,
        || async { (c.metric("collector_deltas_pending").await == 0.0).then_some(()) },
    )
    .await;
}

/// A prune that fails (here a trigger refuses every delete of `click_writers`) is not the
/// fold's: it runs after the fold has committed, in transactions of its own, so the counts
/// are folded all the same. In the fold's transaction, it took every fold down with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prune_that_fails_leaves_the_fold_committed() {
    let p = place().await;
    // Ready first: a round that fails (the prunes, from now on) makes /healthz say 503.
    let c = start_collector(&p.db, &p.path, &["--compact-interval", "1s"]).await;
    refuse_pruning(&p.client).await;
    send_all(&p.path, datagrams(1, &clicks(10, 5, start_us(), 1_000))).await;
    await_rows(&p.client, None, 10).await;
    c.await_metric("collector_compactions_total", 1.0).await;
    testkit::eventually("the counts folded", LIMIT, || async {
        (c.metric("collector_deltas_pending").await == 0.0).then_some(())
    })
    .await;
    assert!(
        c.metric("collector_db_errors_total").await > 0.0,
        "the prunes failed"
    );
    c.service.wait_for_log("no pruning here", LIMIT).await;
}

/// Makes every prune fail: a trigger refuses each delete of `click_writers`.
async fn refuse_pruning(client: &tokio_postgres::Client) {
    client
        .batch_execute(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql
                 AS $$ BEGIN RAISE EXCEPTION 'no pruning here'; END $$;
             CREATE TRIGGER refuse_prune BEFORE DELETE ON click_writers
                 FOR EACH STATEMENT EXECUTE FUNCTION refuse();",
        )
        .await
        .unwrap();
}

/// Rounds that fail back off (100 ms, doubling up to 5 s) rather than coming again at the
/// next look, which `--compact-interval 1ms` makes every millisecond.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_upkeep_rounds_back_off() {
    let p = place().await;
    let c = start_collector(&p.db, &p.path, &["--compact-interval", "1ms"]).await;
    refuse_pruning(&p.client).await;
    let errors = "collector_db_errors_total";
    let failed = |at_least: f64| {
        let c = &c;
        testkit::eventually("more failed rounds", LIMIT, move || async move {
            let n = c.metric(errors).await;
            (n >= at_least).then_some(n)
        })
    };
    // Past the third failure, the next two wait 400 and 800 ms at least (of which the first
    // may be nearly over).
    let seen = failed(3.0).await;
    let from = std::time::Instant::now();
    failed(seen + 2.0).await;
    let took = from.elapsed();
    assert!(
        took >= std::time::Duration::from_millis(800),
        "two more failed rounds within {took:?}"
    );
}

/// A fold that waits past the round's deadline (here on a lock another session holds) is
/// given up by the server as well as by the collector (the session's statement timeout), so
/// each round tries again and fails alone. Given up by the collector alone, it went on
/// waiting on the server, holding the fold's lock: every later fold skipped its turn, as if
/// another collector were folding, and nothing said so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fold_past_the_rounds_deadline_is_given_up_by_the_server_too() {
    let p = place().await;
    let flags = ["--compact-interval", "1s", "--write-timeout", "1s"];
    let c = start_collector(&p.db, &p.path, &flags).await;
    send_all(&p.path, datagrams(1, &clicks(10, 5, start_us(), 1_000))).await;
    await_rows(&p.client, None, 10).await;
    let mut blocker = pgtest::connect(&p.db.url).await;
    let tx = blocker.transaction().await.unwrap();
    tx.batch_execute("LOCK TABLE click_counts IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let failed = c.metric("collector_db_errors_total").await;
    testkit::eventually("five rounds given up", LIMIT, || async {
        (c.metric("collector_db_errors_total").await >= failed + 5.0).then_some(())
    })
    .await;
    let waiting = "SELECT count(*) FROM pg_locks
                   WHERE NOT granted AND relation = 'click_counts'::regclass";
    let waiting = count(&p.client, waiting).await;
    assert!(
        waiting <= 2,
        "{waiting} folds given up still wait on the server"
    );
    tx.rollback().await.unwrap();
    testkit::eventually("the counts folded once the lock goes", LIMIT, || async {
        (c.metric("collector_deltas_pending").await == 0.0).then_some(())
    })
    .await;
}
