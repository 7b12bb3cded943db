//! The link table follows `links` through the change log: bursts of changes on a large table
//! under load, a steady stream (read by polling, then listened for again), commits out of id
//! order, a change too large for one read, TRUNCATE, a load cut off between its passes, a
//! pruned log, a session that stops answering, and `links` kept by logical replication.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use testkit::eventually;
use testkit::redirector::served;
use testkit::redirector::{
    add_link, cut_off, db_now, drop_url_check, fixture, let_back, redirector, scalar, Fixture,
};
use testkit::redirector::{Redirector, LIMIT};

/// Waits until `code` answers `want`.
async fn await_served(http: SocketAddr, code: &str, want: Option<&str>, limit: Duration) {
    let what = format!("/{code} to answer {want:?}");
    eventually(&what, limit, || async {
        (served(http, code).await.as_deref() == want).then_some(())
    })
    .await;
}

async fn execute(db: &impl tokio_postgres::GenericClient, sql: &str) {
    db.batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {}", shared::db::describe(&e)));
}

/// `n` links `big0` ... loaded with one statement.
async fn big_table(db: &impl tokio_postgres::GenericClient, n: u32) {
    execute(
        db,
        &format!(
            "INSERT INTO links (code, url)
             SELECT 'big' || n, 'https://example.com/articles/2026/' || lpad(n::text, 11, '0')
             FROM generate_series(0, {n} - 1) AS n"
        ),
    )
    .await;
}

/// `links` replaced whole, in one transaction (TRUNCATE, then one statement), by `n` links
/// `other0` ...
async fn replace_by_others(db: &impl tokio_postgres::GenericClient, n: u32) {
    execute(
        db,
        &format!(
            "BEGIN; TRUNCATE links;
             INSERT INTO links (code, url)
             SELECT 'other' || n, 'https://example.com/articles/2026/' || lpad(n::text, 11, '0')
             FROM generate_series(0, {n} - 1) AS n; COMMIT;"
        ),
    )
    .await;
}

/// One writer's share of a burst: the codes it owns (no other writer touches them, so the last
/// commit per code is well defined) and what it did.
struct Writer {
    client: tokio_postgres::Client,
    codes: Vec<String>,
    rng: u64,
}

/// A code's expected answer and when the change that decided it committed.
type Expected = HashMap<String, (Option<String>, Instant)>;

impl Writer {
    fn next(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// `ops` random inserts, updates and deletes, each its own transaction.
    async fn burst(&mut self, tag: &str, ops: usize) -> Expected {
        let mut done = Expected::new();
        for i in 0..ops {
            let (code, url) = self.one(&format!("{tag}_{i}")).await;
            done.insert(code, (url, Instant::now()));
        }
        done
    }

    async fn one(&mut self, fresh: &str) -> (String, Option<String>) {
        let pick = self.next() as usize % self.codes.len().max(1);
        let op = if self.codes.is_empty() {
            0
        } else {
            self.next() % 3
        };
        match op {
            0 => {
                let (code, url) = (
                    format!("n{fresh}"),
                    format!("https://example.com/n/{fresh}"),
                );
                add_link(&self.client, &code, &url).await;
                self.codes.push(code.clone());
                (code, Some(url))
            }
            1 => {
                let code = self.codes[pick].clone();
                let url = format!("https://example.com/u/{fresh}");
                let sql = "UPDATE links SET url = $2 WHERE code = $1";
                self.client.execute(sql, &[&code, &url]).await.unwrap();
                (code, Some(url))
            }
            _ => {
                let code = self.codes.swap_remove(pick);
                let sql = "DELETE FROM links WHERE code = $1";
                self.client.execute(sql, &[&code]).await.unwrap();
                (code, None)
            }
        }
    }
}

/// Polls every code of `expected` over HTTP, many at once, until each answers as expected;
/// returns the longest time from a change's commit to the first answer that showed it (for
/// the log: speed is not asserted).
async fn slowest_change(http: SocketAddr, mut expected: Expected) -> Duration {
    let mut slowest = Duration::ZERO;
    let start = Instant::now();
    while !expected.is_empty() {
        assert!(start.elapsed() < LIMIT, "never served: {expected:?}");
        let mut polls = tokio::task::JoinSet::new();
        for code in expected.keys().take(64).cloned() {
            polls.spawn(async move { (served(http, &code).await, code) });
        }
        while let Some(polled) = polls.join_next().await {
            let (got, code) = polled.unwrap();
            if got == expected[&code].0 {
                slowest = slowest.max(expected.remove(&code).unwrap().1.elapsed());
            }
        }
    }
    slowest
}

/// Every code of `codes` answers as `links` says.
async fn agrees_with_links(r: &Redirector, db: &tokio_postgres::Client, codes: &[String]) {
    let rows = db
        .query(
            "SELECT c, l.url FROM unnest($1::text[]) AS c LEFT JOIN links AS l ON l.code = c",
            &[&codes],
        )
        .await
        .unwrap();
    for row in rows {
        let (code, url): (String, Option<String>) = (row.get(0), row.get(1));
        assert_eq!(served(r.http, &code).await, url, "/{code}");
    }
}

#[tokio::test]
async fn bursts_of_changes_to_a_large_table_under_load_are_each_served_by_notification() {
    const LINKS: u32 = 200_000;
    let f = fixture(&[]).await;
    big_table(&f.client, LINKS).await;
    // A periodic reload far longer than the test: every change is found by the read a
    // notification starts, or by the reads every 100 ms that follow while changes keep coming.
    let r = redirector(&f.db.url, &f.socket, &["--reload-interval", "1h"]).await;
    r.ready().await;
    assert_eq!(r.metric("redirector_links").await, f64::from(LINKS));
    let load = testkit::redirector::load::Load::get(r.http, "/big42");
    let running = load.start();

    // Four writers at once, so that commits interleave and land out of id order.
    let mut writers = Vec::new();
    for w in 0..4u32 {
        // big42 is the load's; nobody changes it.
        let codes = (0..LINKS).filter(|n| n % 4 == w && *n != 42);
        let codes = codes.map(|n| format!("big{n}"));
        writers.push(Writer {
            client: testkit::pgtest::connect(&f.db.url).await,
            codes: codes.collect(),
            rng: 0x2545_f491_4f6c_dd1d + u64::from(w),
        });
    }
    let mut changed = Vec::new();
    for burst in 0..8 {
        let mut running = tokio::task::JoinSet::new();
        for (w, mut writer) in writers.drain(..).enumerate() {
            running.spawn(async move {
                let done = writer.burst(&format!("{burst}_{w}"), 150).await;
                (writer, done)
            });
        }
        let mut expected = Expected::new();
        while let Some(finished) = running.join_next().await {
            let (writer, done) = finished.unwrap();
            writers.push(writer);
            expected.extend(done);
        }
        changed.extend(expected.keys().cloned());
        let slowest = slowest_change(r.http, expected).await;
        eprintln!("burst {burst}: the slowest change was served after {slowest:?}");
    }

    load.stop();
    let report = running.await.unwrap();
    assert_eq!(report.errors, 0);
    assert!(report.count(302) > 0, "{report:?}");
    changed.sort();
    changed.dedup();
    agrees_with_links(&r, &f.client, &changed).await;
    let unchanged: Vec<String> = (0..LINKS).step_by(397).map(|n| format!("big{n}")).collect();
    agrees_with_links(&r, &f.client, &unchanged).await;
    let count: i64 = scalar(&f.client, "SELECT count(*) FROM links").await;
    assert_eq!(r.metric("redirector_links").await, count as f64);
    assert!(r.metric("redirector_link_changes_applied_total").await >= changed.len() as f64);
    assert_eq!(
        r.metric("redirector_link_loads_total").await,
        1.0,
        "no full reload"
    );
    let lag = r.metric("redirector_links_lag_seconds").await;
    assert!(lag >= 0.0, "lag {lag}");
}

/// Whether the loader polls (`redirector_links_polling` 1: reads every 100 ms, not listening)
/// or listens (0).
async fn polling(r: &Redirector) -> bool {
    let gauge = r.metric("redirector_links_polling").await;
    assert!(
        gauge == 0.0 || gauge == 1.0,
        "redirector_links_polling {gauge}"
    );
    gauge == 1.0
}

/// Waits until `r`'s loader listens and has stopped reading (its last read falls behind the
/// clock of `db`): then only a notification wakes it, or its `--reload-interval`.
async fn await_listening(r: &Redirector, db: &tokio_postgres::Client) {
    eventually("the loader to listen again", LIMIT, || async {
        (!polling(r).await).then_some(())
    })
    .await;
    eventually("the loader to stop reading", LIMIT, || async {
        let synced = r.metric("redirector_links_synced_timestamp_seconds").await;
        (db_now(db).await - synced > 0.5).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_loader_that_polled_through_a_stream_of_changes_listens_again_once_it_ends() {
    let f = fixture(&[
        ("steady", "https://example.com/0"),
        ("later", "https://example.com/before"),
    ])
    .await;
    // The poll is an hour: between changes, only a notification can wake the loader.
    let r = redirector(&f.db.url, &f.socket, &["--reload-interval", "1h"]).await;
    r.ready().await;
    assert!(!polling(&r).await, "an idle loader listens");
    // Changes one after another, each awaited: once a read finds one, the loader stops
    // listening, and reads every 100 ms find the rest. At least five, and on until the gauge
    // is seen at 1 after one was served (a change served by the read its notification started
    // is served just before the loader stops listening).
    let changes = std::sync::atomic::AtomicU32::new(0);
    eventually(
        "the loader to poll while changes keep coming",
        LIMIT,
        || async {
            let n = changes.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            let url = format!("https://example.com/{n}");
            let sql = format!("UPDATE links SET url = '{url}' WHERE code = 'steady'");
            execute(&f.client, &sql).await;
            await_served(r.http, "steady", Some(&url), LIMIT).await;
            (n >= 5 && polling(&r).await).then_some(())
        },
    )
    .await;
    // Once a read finds nothing new, it listens again and stops reading.
    await_listening(&r, &f.client).await;
    assert!(!polling(&r).await, "listening while nothing changes");
    // And it listens: a change is served on its notification, not at the hourly poll.
    execute(
        &f.client,
        "UPDATE links SET url = 'https://example.com/after' WHERE code = 'later'",
    )
    .await;
    let notified = Duration::from_secs(5);
    await_served(r.http, "later", Some("https://example.com/after"), notified).await;
    assert_eq!(r.metric("redirector_link_loads_total").await, 1.0);
}

#[tokio::test]
async fn a_change_that_commits_after_a_later_id_is_applied() {
    let f = fixture(&[]).await;
    // Only notifications wake the loader: each read below is the one a commit caused.
    let r = redirector(&f.db.url, &f.socket, &["--reload-interval", "1h"]).await;
    r.ready().await;
    let mut early = testkit::pgtest::connect(&f.db.url).await;
    let tx = early.transaction().await.unwrap();
    tx.execute(
        "INSERT INTO links (code, url) VALUES ('early', 'https://example.com/early')",
        &[],
    )
    .await
    .unwrap();
    // A later id, committed first, and read while the first is still in progress.
    add_link(&f.client, "late", "https://example.com/late").await;
    await_served(r.http, "late", Some("https://example.com/late"), LIMIT).await;
    let ids: Vec<i64> = f
        .client
        .query("SELECT id FROM link_changes ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(ids.len(), 1, "only 'late' is visible yet");
    tx.commit().await.unwrap();
    await_served(r.http, "early", Some("https://example.com/early"), LIMIT).await;
    let early_id: i64 = scalar(
        &f.client,
        "SELECT id FROM link_changes WHERE code = 'early'",
    )
    .await;
    assert!(early_id < ids[0], "'early' has the lower id");
}

/// Waits until `r` has counted `n` full loads: a load serves its changes shard by shard as it
/// goes, and is counted at its end.
async fn await_loads(r: &Redirector, n: f64) {
    eventually("the full load counted", LIMIT, || async {
        (r.metric("redirector_link_loads_total").await >= n).then_some(())
    })
    .await;
    assert_eq!(r.metric("redirector_link_loads_total").await, n);
}

#[tokio::test]
async fn a_change_of_more_links_than_one_read_takes_makes_a_full_load() {
    let f = fixture(&[("kept", "https://example.com/kept")]).await;
    let r = redirector(&f.db.url, &f.socket, &["--reload-interval", "1h"]).await;
    r.ready().await;
    let n = u32::try_from(redirector::links::LOG_READ_MAX).unwrap() + 1;
    // The bulk change takes its log ids first but commits after a later change was read: its
    // rows are below the position by id, so only counting them tells how many there are.
    let mut bulk = testkit::pgtest::connect(&f.db.url).await;
    let tx = bulk.transaction().await.unwrap();
    big_table(&tx, n).await;
    add_link(&f.client, "later", "https://example.com/later").await;
    await_served(r.http, "later", Some("https://example.com/later"), LIMIT).await;
    tx.commit().await.unwrap();
    await_loads(&r, 2.0).await;
    assert_eq!(r.metric("redirector_links").await, f64::from(n) + 2.0);
    let sample: Vec<String> = (0..n).step_by(997).map(|i| format!("big{i}")).collect();
    agrees_with_links(&r, &f.client, &sample).await;
    assert_eq!(
        served(r.http, "kept").await.as_deref(),
        Some("https://example.com/kept")
    );
}

/// `links` kept by logical replication from another database's (an application's own, say):
/// a subscription's apply worker fires row triggers only, and only those enabled for replica
/// sessions. Each change made on the publisher is served, by notification (the interval is an
/// hour), the rows its first copy brought included, and a TRUNCATE there (alone in its
/// transaction: no row trigger fires) loads in full. So does setting the modes back after
/// `ENABLE TRIGGER ALL` reset them, which serves what was applied meanwhile.
#[tokio::test]
async fn links_kept_by_logical_replication_are_followed() {
    let f = fixture(&[]).await;
    let publisher = testkit::pgtest::test_db().await;
    let origin = testkit::pgtest::connect(&publisher.url).await;
    add_link(&origin, "copied", "https://example.com/copied").await;
    execute(&origin, "CREATE PUBLICATION links_out FOR TABLE links").await;
    // A slot made apart, in a transaction of its own: CREATE SUBSCRIPTION would wait for its
    // own transaction to make one in the same cluster.
    let slot = format!("links_of_{}", f.db.name);
    let make_slot = format!("SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')");
    execute(&origin, &make_slot).await;
    let r = redirector(&f.db.url, &f.socket, &["--reload-interval", "1h"]).await;
    r.ready().await;
    let subscribe = format!(
        "CREATE SUBSCRIPTION {slot} CONNECTION '{}' PUBLICATION links_out
         WITH (create_slot = false, slot_name = '{slot}')",
        publisher.url
    );
    execute(&f.client, &subscribe).await;
    await_served(r.http, "copied", Some("https://example.com/copied"), LIMIT).await;
    add_link(&origin, "new", "https://example.com/new").await;
    await_served(r.http, "new", Some("https://example.com/new"), LIMIT).await;
    execute(
        &origin,
        "UPDATE links SET url = 'https://example.com/v2' WHERE code = 'new';
         UPDATE links SET code = 'renamed' WHERE code = 'copied';",
    )
    .await;
    await_served(r.http, "renamed", Some("https://example.com/copied"), LIMIT).await;
    assert_eq!(served(r.http, "copied").await, None, "renamed away");
    await_served(r.http, "new", Some("https://example.com/v2"), LIMIT).await;
    execute(&origin, "DELETE FROM links WHERE code = 'new'").await;
    await_served(r.http, "new", None, LIMIT).await;
    // Alone in its transaction, and to a loader that listens: only the statement triggers of
    // TRUNCATE fire, and only their notification wakes it.
    await_listening(&r, &f.client).await;
    execute(&origin, "TRUNCATE links").await;
    await_served(r.http, "renamed", None, LIMIT).await;
    await_loads(&r, 2.0).await;
    add_link(&origin, "after", "https://example.com/after").await;
    await_served(r.http, "after", Some("https://example.com/after"), LIMIT).await;

    // The modes reset (a data-only restore ends so): what is applied then goes unlogged,
    // until a collector sets them back, which loads every redirector in full.
    execute(&f.client, "ALTER TABLE links ENABLE TRIGGER ALL").await;
    add_link(&origin, "unseen", "https://example.com/unseen").await;
    let applied = "SELECT count(*) FROM links WHERE code = 'unseen'";
    eventually("the link applied by the subscription", LIMIT, || async {
        let n: i64 = f.client.query_one(applied, &[]).await.unwrap().get(0);
        (n == 1).then_some(())
    })
    .await;
    let logged = "SELECT count(*) FROM link_changes WHERE code = 'unseen'";
    let logged: i64 = f.client.query_one(logged, &[]).await.unwrap().get(0);
    assert_eq!(logged, 0, "applied, unlogged");
    assert_eq!(served(r.http, "unseen").await, None);
    let mut client = testkit::pgtest::connect(&f.db.url).await;
    let wait = Duration::from_secs(5);
    let modes = schema::restore_link_trigger_modes(&mut client, wait);
    assert!(modes.await.unwrap().set_back.is_some());
    await_served(r.http, "unseen", Some("https://example.com/unseen"), LIMIT).await;
    await_loads(&r, 3.0).await;
    execute(&f.client, &format!("DROP SUBSCRIPTION {slot}")).await;
}

#[tokio::test]
async fn truncating_links_makes_a_full_reload() {
    let f = fixture(&[
        ("a", "https://example.com/a"),
        ("b", "https://example.com/b"),
    ])
    .await;
    let r = redirector(&f.db.url, &f.socket, &["--reload-interval", "1h"]).await;
    r.ready().await;
    execute(
        &f.client,
        "BEGIN; TRUNCATE links;
         INSERT INTO links (code, url) VALUES ('c', 'https://example.com/c'); COMMIT;",
    )
    .await;
    await_served(r.http, "c", Some("https://example.com/c"), LIMIT).await;
    // The load serves shard by shard: a and b are gone once it is counted, not before.
    await_loads(&r, 2.0).await;
    assert_eq!(served(r.http, "a").await, None);
    assert_eq!(served(r.http, "b").await, None);
    assert_eq!(r.metric("redirector_links").await, 1.0);
}

/// `links` replaced whole by as many other codes (TRUNCATE and a reload in one transaction):
/// the comparing load removes the codes gone before it adds the new, so the table is never
/// both sets, the old and the new, at once: the peak RSS does not grow by the new table's
/// size. (It removed them last, after the new were in.)
#[tokio::test]
async fn links_replaced_whole_are_never_held_twice() {
    const N: u32 = 200_000;
    let f = fixture(&[]).await;
    let r = redirector(&f.db.url, &f.socket, &["--reload-interval", "1h"]).await;
    r.ready().await;
    let pid = r.service.pid();
    let empty = testkit::rss_kib(pid);
    // More than a read of the log takes: loaded in full, comparing, from an empty table.
    big_table(&f.client, N).await;
    await_loads(&r, 2.0).await;
    let (table, peak) = (testkit::rss_kib(pid) - empty, testkit::peak_rss_kib(pid));
    replace_by_others(&f.client, N).await;
    await_loads(&r, 3.0).await;
    assert_eq!(r.metric("redirector_links").await, f64::from(N));
    assert_eq!(served(r.http, "big0").await, None);
    let grew = testkit::peak_rss_kib(pid).saturating_sub(peak);
    assert!(
        grew < table / 2,
        "the peak RSS grew by {grew} KiB over the replacement, a table of {N} links being \
         {table} KiB"
    );
}

/// A comparing load cut off between its passes (its session killed while it reads the links,
/// the codes gone already removed): meanwhile no removed code is served, and the load is made
/// again whole on a new session, so that every link is served in the end. A load that recorded
/// its place in the log before it ended would resume from there on the new session, and leave
/// the links it had not reached unserved until they changed or a later full load (a restart, a
/// TRUNCATE): the change log's reads never bring them.
#[tokio::test]
async fn a_load_cut_off_between_its_passes_is_made_again_whole() {
    const N: u32 = 200_000;
    let f = fixture(&[]).await;
    let r = redirector(&f.db.url, &f.socket, &["--reload-interval", "1h"]).await;
    r.ready().await;
    big_table(&f.client, N).await;
    await_loads(&r, 2.0).await;
    // More links than before, so that only a load that ended sets the gauge to their number.
    const OTHERS: u32 = N + 1_000;
    replace_by_others(&f.client, OTHERS).await;
    let reading = "SELECT pid FROM pg_stat_activity
                    WHERE datname = $1 AND application_name = 'redirector-links'
                      AND state = 'active' AND query LIKE 'SELECT code, url,%'";
    let pid: i32 = eventually("the load reading the links", LIMIT, || async {
        let row = f.client.query_opt(reading, &[&f.db.name]).await.unwrap();
        row.map(|row| row.get(0))
    })
    .await;
    execute(&f.client, &format!("SELECT pg_terminate_backend({pid})")).await;
    assert_eq!(served(r.http, "big7").await, None, "removed before the cut");

    // The cut counted, and a load ended (the one made again; or, for a cut landing as the load
    // ended, that one itself, counted before its commit was refused, all its links applied).
    eventually("the load cut off, and one ended", LIMIT, || async {
        let loads = r.metric("redirector_link_loads_total").await;
        let errors = r.metric("redirector_link_load_errors_total").await;
        let links = r.metric("redirector_links").await;
        (loads >= 3.0 && errors >= 1.0 && links == f64::from(OTHERS)).then_some(())
    })
    .await;
    let codes: Vec<String> = (0..OTHERS)
        .step_by(997)
        .map(|n| format!("other{n}"))
        .collect();
    agrees_with_links(&r, &f.client, &codes).await;
    assert_eq!(served(r.http, "big0").await, None);
}

/// Runs PostgreSQL's client `program` (beside the server's binaries) with `args`.
fn pg_client(program: &str, args: &[&str]) {
    let bindir = testkit::pgtest::find_bindir().expect("PostgreSQL's binaries");
    let out = std::process::Command::new(bindir.join(program))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{program} {args:?}: {said}");
}

/// A dump restored over the database (`pg_restore --clean`), on the same server and timeline:
/// the change log's ids and epoch start again where they were dumped, below what the loader
/// read, so a link added after the dump was served on for good. The log's tables are new ones
/// (another oid), which makes a full load; but not while the restore has yet to load `links`
/// (each table's rows commit on their own, the triggers come last): such a load emptied the
/// table, and the rows restored after it went unlogged. `r` reads `f`'s database and serves
/// `a`.
async fn restore_over(f: &Fixture, r: &Redirector) {
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("clicks.dump");
    let dump = dump.to_str().unwrap();
    pg_client("pg_dump", &["--format=custom", "--file", dump, &f.db.url]);
    add_link(&f.client, "x", "https://example.com/x").await;
    await_served(r.http, "x", Some("https://example.com/x"), LIMIT).await;
    let restore = |args: &[&str]| {
        let all = [args, &["--dbname", &f.db.url, dump]].concat();
        pg_client("pg_restore", &all);
    };
    // The restore's first steps: the tables made again, the change log's rows back, `links`
    // still empty and without its triggers.
    restore(&["--clean", "--if-exists", "--section=pre-data"]);
    let log = ["--table=link_changes", "--table=link_changes_state"];
    restore(&[&["--section=data"][..], &log].concat());
    // Said again by the next session, which starts from a full load where the history is
    // hidden: that waits too.
    let waiting = "links has no triggers yet";
    eventually("the wait for the triggers said twice", LIMIT, || async {
        let said = r
            .service
            .log()
            .iter()
            .filter(|l| l.contains(waiting))
            .count();
        (said >= 2).then_some(())
    })
    .await;
    let a = Some("https://example.com/a");
    assert_eq!(served(r.http, "a").await.as_deref(), a);
    restore(&["--section=data", "--table=links"]);
    restore(&["--section=post-data"]);
    await_served(r.http, "x", None, LIMIT).await;
    assert_eq!(served(r.http, "a").await.as_deref(), a);
}

#[tokio::test]
async fn a_dump_restored_over_the_database_makes_a_full_reload() {
    let f = fixture(&[("a", "https://example.com/a")]).await;
    let r = redirector(&f.db.url, &f.socket, &[]).await;
    r.ready().await;
    restore_over(&f, &r).await;
    let reloaded = "link table loaded (the change log's tables were made again";
    r.service.wait_for_log(reloaded, LIMIT).await;
}

/// The same, read by a role the server's history is hidden from: each new session starts from
/// a full load, which waits for `links`' triggers too.
#[tokio::test]
async fn a_dump_restored_over_a_database_whose_history_is_hidden_makes_a_full_reload() {
    let f = fixture(&[("a", "https://example.com/a")]).await;
    let role = format!("reader_{}", f.db.name);
    let create = format!("CREATE ROLE {role} LOGIN IN ROLE clicks_link_reader");
    execute(&f.client, &create).await;
    // As where the server's system identifier is kept from its readers (this database only).
    let hide = "REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC";
    execute(&f.client, hide).await;
    let reader = f.db.url.replace("user=postgres", &format!("user={role}"));
    let links = ["--links-database-url", reader.as_str()];
    let r = redirector(&f.db.url, &f.socket, &links).await;
    r.ready().await;
    let hidden = "SELECT has_function_privilege($1, 'pg_control_system()', 'EXECUTE')";
    let row = f.client.query_one(hidden, &[&role]).await.unwrap();
    assert!(!row.get::<_, bool>(0), "the history hidden from {role}");
    restore_over(&f, &r).await;
}

#[tokio::test]
async fn a_log_pruned_past_a_redirector_makes_it_reload_and_one_not_pruned_lets_it_resume() {
    let f = fixture(&[
        ("stays", "https://example.com/stays"),
        ("goes", "https://example.com/goes"),
        ("moves", "https://example.com/moves"),
    ])
    .await;
    let r = redirector(&f.db.url, &f.socket, &[]).await;
    r.ready().await;

    // Away while links change: the log still holds the changes, so it resumes from them.
    let admin = cut_off(&f, &r).await;
    execute(
        &f.client,
        "UPDATE links SET url = 'https://example.com/v2' WHERE code = 'moves'",
    )
    .await;
    let_back(&f, &admin).await;
    await_served(r.http, "moves", Some("https://example.com/v2"), LIMIT).await;
    assert_eq!(r.metric("redirector_link_loads_total").await, 1.0);

    // Away while links change and the log is pruned: only a full load can catch up.
    let admin = cut_off(&f, &r).await;
    execute(&f.client, "DELETE FROM links WHERE code = 'goes'").await;
    add_link(&f.client, "new", "https://example.com/new").await;
    testkit::pgtest::await_link_changes_prunable(&f.client).await;
    execute(&f.client, "SELECT prune_link_changes('0 s')").await;
    let_back(&f, &admin).await;
    await_served(r.http, "goes", None, LIMIT).await;
    await_loads(&r, 2.0).await;
    assert_eq!(
        served(r.http, "new").await.as_deref(),
        Some("https://example.com/new")
    );
    assert_eq!(
        served(r.http, "stays").await.as_deref(),
        Some("https://example.com/stays")
    );
    assert_eq!(r.metric("redirector_links").await, 3.0);
    // Caught up: the next reads of the (empty) log load nothing again.
    let now = db_now(&f.client).await;
    eventually("two more reads of the change log", LIMIT, || async {
        let synced = r.metric("redirector_links_synced_timestamp_seconds").await;
        (synced > now + 1.0).then_some(())
    })
    .await;
    assert_eq!(r.metric("redirector_link_loads_total").await, 2.0);
}

/// SIGCONTs a stopped backend when the test ends, passed or not.
struct Stopped(nix::unistd::Pid);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGCONT);
    }
}

async fn loader_backends(f: &Fixture) -> Vec<i32> {
    let sql = "SELECT pid FROM pg_stat_activity
                WHERE datname = $1 AND application_name = 'redirector-links'";
    let rows = f.client.query(sql, &[&f.db.name]).await.unwrap();
    rows.iter().map(|row| row.get(0)).collect()
}

#[tokio::test]
async fn a_session_that_stops_answering_is_replaced_and_a_delete_is_served_meanwhile() {
    let f = fixture(&[("doomed", "https://example.com/doomed")]).await;
    let flags = ["--reload-interval", "200ms", "--link-timeout", "1s"];
    let r = redirector(&f.db.url, &f.socket, &flags).await;
    r.ready().await;
    let pids = loader_backends(&f).await;
    assert_eq!(pids.len(), 1, "{pids:?}");
    let pid = nix::unistd::Pid::from_raw(pids[0]);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let _resume = Stopped(pid);

    execute(&f.client, "DELETE FROM links WHERE code = 'doomed'").await;
    // The stopped session cannot read it: only a session that replaced it can.
    await_served(r.http, "doomed", None, LIMIT).await;
    assert!(r.metric("redirector_link_load_errors_total").await >= 1.0);
    let now = loader_backends(&f).await;
    assert!(now.iter().any(|&p| p != pids[0]), "a new session: {now:?}");
}

#[tokio::test]
async fn a_link_changed_to_an_unusable_url_is_removed_and_counted_until_fixed() {
    let f = fixture(&[("fine", "https://example.com/fine")]).await;
    // Without links_url_clean (migration 7), as on a database whose operator dropped it: the
    // redirector's own rule still keeps the row out.
    drop_url_check(&f.client).await;
    let r = redirector(&f.db.url, &f.socket, &["--reload-interval", "1h"]).await;
    r.ready().await;
    execute(
        &f.client,
        "UPDATE links SET url = 'https://example.com/a' || chr(10) WHERE code = 'fine'",
    )
    .await;
    await_served(r.http, "fine", None, LIMIT).await;
    assert_eq!(r.metric("redirector_links_skipped").await, 1.0);
    execute(
        &f.client,
        "UPDATE links SET url = 'https://example.com/ok' WHERE code = 'fine'",
    )
    .await;
    await_served(r.http, "fine", Some("https://example.com/ok"), LIMIT).await;
    assert_eq!(r.metric("redirector_links_skipped").await, 0.0);
}
