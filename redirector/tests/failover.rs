//! The database fails over: a primary and a streaming standby (`testkit::pgtest::Pair`), the
//! real binaries, and what each replication mode keeps of the clicks and the links. Also a
//! redirector that reads its links from the standby.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use testkit::db::await_rows_settled;
use testkit::eventually;
use testkit::pgtest::{test_db_on, Pair, Replication, TestDb};
use testkit::redirector::load::Load;
use testkit::redirector::served;
use testkit::redirector::{
    add_link, await_first_rows, db_now, redirector, rows, scalar, Redirector, LIMIT,
};
use testkit::services::Collector;

/// Waits until `code` answers `want`; returns how long that took.
async fn await_served(http: SocketAddr, code: &str, want: Option<&str>) -> Duration {
    let start = Instant::now();
    let what = format!("/{code} to answer {want:?}");
    eventually(&what, LIMIT, || async {
        (served(http, code).await.as_deref() == want).then_some(())
    })
    .await;
    start.elapsed()
}

/// Waits until the primary's WAL is `bytes` past what the standby has flushed.
async fn await_standby_behind(pair: &Pair, bytes: f64) {
    let admin = pair.primary.connect("postgres").await;
    let behind =
        "SELECT coalesce(max(pg_wal_lsn_diff(pg_current_wal_lsn(), flush_lsn)), 0)::float8 \
                  FROM pg_stat_replication";
    eventually(
        &format!("the standby {bytes} bytes behind"),
        LIMIT,
        || async { (scalar::<f64>(&admin, behind).await > bytes).then_some(()) },
    )
    .await;
}

async fn execute(db: &tokio_postgres::Client, sql: &str) {
    db.batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {}", shared::db::describe(&e)));
}

/// An asynchronous pair, a database on it whose `links` hold `links` once the standby has
/// replayed them, and a session on the primary.
async fn linked_pair(links: &[(&str, &str)]) -> (Pair, TestDb, tokio_postgres::Client) {
    let pair = Pair::start(Replication::Asynchronous).await;
    let db = test_db_on(&pair.primary).await;
    let primary = testkit::pgtest::connect(&db.url).await;
    for (code, url) in links {
        add_link(&primary, code, url).await;
    }
    let replayed = format!("SELECT count(*) = {} FROM links", links.len());
    pair.await_on_standby(&db.name, &replayed).await;
    (pair, db, primary)
}

/// A connection string naming `servers` in that order, without `target_session_attrs`.
fn hosts(servers: [&testkit::pgtest::Cluster; 2], user: &str, db: &str) -> String {
    let [first, second] = servers.map(|c| c.socket_dir().display().to_string());
    format!("host={first},{second} user={user} dbname={db}")
}

/// Pauses the replay of the standby `standby` is a session on.
async fn pause_replay(standby: &tokio_postgres::Client) {
    execute(standby, "SELECT pg_wal_replay_pause()").await;
    eventually("the standby's replay to pause", LIMIT, || async {
        let state: String = scalar(standby, "SELECT pg_get_wal_replay_pause_state()").await;
        (state == "paused").then_some(())
    })
    .await;
}

/// A redirector with clicks off that reads its links from `links_url`, ready; with the
/// directory of its sockets.
async fn links_reader(db: &TestDb, links_url: &str) -> (tempfile::TempDir, Redirector) {
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--clicks", "off", "--links-database-url", links_url];
    let r = redirector(&db.url, &dir.path().join("collector.sock"), &flags).await;
    r.ready().await;
    (dir, r)
}

/// Waits until `series` of `r` is above `before`: `what` happened.
async fn await_above(r: &Redirector, series: &str, before: f64, what: &str) {
    eventually(what, LIMIT, || async {
        (r.metric(series).await > before).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_redirector_reading_links_from_a_hot_standby_serves_changes_made_on_the_primary() {
    let (pair, db, primary) = linked_pair(&[("before", "https://example.com/before")]).await;
    let on_standby = pair.standby.url(&db.name);
    let (_dir, r) = links_reader(&db, &on_standby).await;
    r.service
        .wait_for_log("the links database is a hot standby", LIMIT)
        .await;
    assert_eq!(r.metric("redirector_links_polling").await, 1.0);
    assert_eq!(
        served(r.http, "before").await.as_deref(),
        Some("https://example.com/before")
    );
    let standby = testkit::pgtest::connect(&on_standby).await;
    let sessions = testkit::pgtest::strings(
        &standby,
        "SELECT application_name FROM pg_stat_activity WHERE application_name = 'redirector-links'",
    )
    .await;
    assert_eq!(sessions.len(), 1, "the loader reads from the standby");

    add_link(&primary, "added", "https://example.com/added").await;
    let insert = await_served(r.http, "added", Some("https://example.com/added")).await;
    execute(
        &primary,
        "UPDATE links SET url = 'https://example.com/moved' WHERE code = 'before'",
    )
    .await;
    let update = await_served(r.http, "before", Some("https://example.com/moved")).await;
    execute(&primary, "DELETE FROM links WHERE code = 'added'").await;
    let delete = await_served(r.http, "added", None).await;
    // The standby is polled every --reload-interval (1 s) and replicates within milliseconds
    // here: far less than this.
    for (what, took) in [("insert", insert), ("update", update), ("delete", delete)] {
        assert!(
            took < Duration::from_secs(5),
            "the {what} took {took:?} to be served"
        );
    }
    eprintln!("links from a hot standby: insert {insert:?}, update {update:?}, delete {delete:?}");
}

/// A hot standby that stops replaying (paused here, or stuck) answers every poll on its own
/// clock, so the polls alone would say its links are current. Once it has received WAL it
/// does not replay, `redirector_links_synced_timestamp_seconds` stays at the last read before
/// the first that saw that, for LinksStale to fire on, in a new session too; once replay goes
/// on, the gauge does.
#[tokio::test]
async fn links_from_a_standby_that_stopped_replaying_are_reported_as_old_as_when_it_stopped() {
    let (pair, db, primary) = linked_pair(&[("before", "https://example.com/before")]).await;
    let on_standby = pair.standby.url(&db.name);
    let (_dir, r) = links_reader(&db, &on_standby).await;
    let standby = testkit::pgtest::connect(&on_standby).await;
    pause_replay(&standby).await;
    add_link(&primary, "added", "https://example.com/added").await;
    let behind = "SELECT pg_last_wal_receive_lsn() > pg_last_wal_replay_lsn()";
    eventually(
        "the standby to receive what it does not replay",
        LIMIT,
        || async { scalar::<bool>(&standby, behind).await.then_some(()) },
    )
    .await;
    // Reads that began from now on find it behind: each reports the read before the first.
    let read = await_reads(&standby, 2).await;
    let synced = "redirector_links_synced_timestamp_seconds";
    let frozen = r.metric(synced).await;
    let later = await_read_after(&standby, read).await;
    assert_eq!(
        r.metric(synced).await,
        frozen,
        "the gauge moved with the reads"
    );
    assert!(
        frozen < later,
        "{frozen} is not before the last read, at {later}"
    );
    assert_eq!(
        served(r.http, "added").await,
        None,
        "not replayed: not served"
    );
    // A new session's first read says the same.
    let errors = r.metric("redirector_link_load_errors_total").await;
    execute(
        &standby,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE application_name = 'redirector-links'",
    )
    .await;
    await_above(
        &r,
        "redirector_link_load_errors_total",
        errors,
        "the session's end",
    )
    .await;
    // Its first statement, then one begun past its first read (at once, then every 1 s).
    let began = await_read_after(&standby, db_now(&standby).await).await;
    await_read_after(&standby, began + 1.5).await;
    assert_eq!(r.metric(synced).await, frozen, "moved by the new session");

    execute(&standby, "SELECT pg_wal_replay_resume()").await;
    await_served(r.http, "added", Some("https://example.com/added")).await;
    let resumed = db_now(&standby).await;
    await_above(&r, synced, resumed, "the links to be current again").await;
}

/// A hot standby that replays late (`recovery_min_apply_delay` here, or a replay slower than
/// the primary's writes) answers every poll on its own clock too. While it holds WAL it has not
/// replayed, `redirector_links_synced_timestamp_seconds` follows the commit time of the last
/// transaction it replayed, seconds behind the polls, and moves on with it.
#[tokio::test]
async fn links_from_a_standby_replaying_late_are_reported_as_old_as_its_replay() {
    let (pair, db, primary) = linked_pair(&[("before", "https://example.com/before")]).await;
    let on_standby = pair.standby.url(&db.name);
    let (_dir, r) = links_reader(&db, &on_standby).await;
    let standby = testkit::pgtest::connect(&on_standby).await;
    let admin = pair.standby.connect("postgres").await;
    execute(&admin, "ALTER SYSTEM SET recovery_min_apply_delay = '4s'").await;
    execute(&admin, "SELECT pg_reload_conf()").await;
    let started = db_now(&standby).await;
    // A change on the primary every 200 ms, for as long as the test runs.
    let writes = tokio::spawn(async move {
        for n in 0_i64.. {
            let url = format!("https://example.com/{n}");
            let update = "UPDATE links SET url = $1 WHERE code = 'before'";
            primary.execute(update, &[&url]).await.unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    // Replaying them, late (once the reload reached its replay): no standby that stopped.
    let replayed =
        "SELECT coalesce(extract(epoch FROM pg_last_xact_replay_timestamp()), 0)::float8,
                           extract(epoch FROM clock_timestamp())::float8";
    eventually(
        "the standby to replay the changes 3 s late",
        LIMIT,
        || async {
            let row = standby.query_one(replayed, &[]).await.unwrap();
            let (at, now): (f64, f64) = (row.get(0), row.get(1));
            (at > started && now - at > 3.0).then_some(())
        },
    )
    .await;
    await_reads(&standby, 2).await;
    // Reads on the standby's clock would keep the gauge within a poll (1 s) of it.
    let series = "redirector_links_synced_timestamp_seconds";
    let synced = r.metric(series).await;
    let now = db_now(&standby).await;
    assert!(
        synced < now - 3.0,
        "{synced} is not as old as a replay 4 s late, at {now}"
    );
    await_above(&r, series, synced + 1.0, "the gauge to follow the replay").await;

    execute(&admin, "ALTER SYSTEM RESET recovery_min_apply_delay").await;
    execute(&admin, "SELECT pg_reload_conf()").await;
    writes.abort();
    let caught_up = "SELECT pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn()";
    eventually("the standby to catch up", LIMIT, || async {
        scalar::<bool>(&standby, caught_up).await.then_some(())
    })
    .await;
    let current = db_now(&standby).await;
    await_above(&r, series, current, "the links to be current again").await;
}

/// The hot standby the loader polls is promoted: the session ends, not as a failure, and the
/// next one, on the same server, listens for changes instead of polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_promoted_under_the_loader_is_listened_to() {
    let (pair, db, _primary) = linked_pair(&[("before", "https://example.com/before")]).await;
    let on_standby = pair.standby.url(&db.name);
    let (_dir, r) = links_reader(&db, &on_standby).await;
    assert_eq!(r.metric("redirector_links_polling").await, 1.0);
    let errors = r.metric("redirector_link_load_errors_total").await;
    blocking(|| pair.standby.promote());
    r.service
        .wait_for_log("is now promoted: a new session listens", LIMIT)
        .await;
    eventually("the loader to listen", LIMIT, || async {
        (r.metric("redirector_links_polling").await == 0.0).then_some(())
    })
    .await;
    assert_eq!(
        r.metric("redirector_link_load_errors_total").await,
        errors,
        "a promotion is no load error"
    );
    let promoted = testkit::pgtest::connect(&on_standby).await;
    add_link(&promoted, "added", "https://example.com/added").await;
    await_served(r.http, "added", Some("https://example.com/added")).await;
}

/// Waits until the link loader's session on `standby` has finished a statement begun after
/// `after` (the database's clock, Unix seconds); returns when it began.
async fn await_read_after(standby: &tokio_postgres::Client, after: f64) -> f64 {
    let began = "SELECT extract(epoch FROM query_start)::float8 FROM pg_stat_activity
                 WHERE application_name = 'redirector-links' AND state = 'idle'";
    eventually("a read of the link loader's", LIMIT, || async {
        let row = standby.query_opt(began, &[]).await.ok()??;
        // None for a session connected that has run nothing yet.
        let began: Option<f64> = row.get(0);
        began.filter(|&began| began > after)
    })
    .await
}

/// Waits until the link loader's session on `standby` has finished `n` statements, each
/// begun after the one before, the first from now on; returns when the last began.
async fn await_reads(standby: &tokio_postgres::Client, n: usize) -> f64 {
    let mut read = db_now(standby).await;
    for _ in 0..n {
        read = await_read_after(standby, read).await;
    }
    read
}

/// Two transactions on the primary that change links overlap and commit out of order, and the
/// redirector reads its links from a hot standby: the one that took the lower change id and
/// commits last is served too. A standby's snapshot lists no transaction in progress (its
/// `pg_current_snapshot()` has them all as subtransactions, which it leaves out), so a reader
/// that went by that list took the change for read once a later one was.
#[tokio::test]
async fn changes_committed_out_of_order_are_served_from_a_hot_standby() {
    let links = [
        ("first", "https://example.com/first"),
        ("second", "https://example.com/second"),
    ];
    let (pair, db, primary) = linked_pair(&links).await;
    let (_dir, r) = links_reader(&db, &pair.standby.url(&db.name)).await;
    await_served(r.http, "second", Some("https://example.com/second")).await;
    let slow = testkit::pgtest::connect(&db.url).await;
    let moved = "UPDATE links SET url = 'https://example.com/first-moved' WHERE code = 'first'";
    execute(&slow, &format!("BEGIN; {moved}")).await;
    execute(
        &primary,
        "UPDATE links SET url = 'https://example.com/second-moved' WHERE code = 'second'",
    )
    .await;
    await_served(r.http, "second", Some("https://example.com/second-moved")).await;
    // Read twice more with the slow one still open: the first read's metrics are then set,
    // and the second read returns the change again, which is neither counted nor timed.
    let series = "redirector_links_synced_timestamp_seconds";
    let another_read = || async {
        let synced = r.metric(series).await;
        await_above(&r, series, synced, "another read of the change log").await;
    };
    another_read().await;
    let applied = "redirector_link_changes_applied_total";
    let (counted, lag) = (
        r.metric(applied).await,
        r.metric("redirector_links_lag_seconds").await,
    );
    another_read().await;
    another_read().await;
    assert_eq!(
        r.metric(applied).await,
        counted,
        "changes read again, counted again"
    );
    assert_eq!(
        r.metric("redirector_links_lag_seconds").await,
        lag,
        "lag of a change read again"
    );
    execute(&slow, "COMMIT").await;
    await_served(r.http, "first", Some("https://example.com/first-moved")).await;
    another_read().await;
    assert_eq!(
        r.metric(applied).await,
        counted + 1.0,
        "the change committed last, counted"
    );
}

/// The primary fails over to a standby that lacks its last link changes (asynchronous, its WAL
/// receiver stopped meanwhile), and the new primary logs more changes than were lost before
/// the redirector reconnects, so its change log's ids are past the table's again: only its
/// timeline says the history changed. The table drops what the failover lost, and serves what
/// the new primary has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_a_failover_lost_are_dropped_once_the_redirector_reads_the_new_primary() {
    let (pair, db, primary) = linked_pair(&[("kept", "https://example.com/kept")]).await;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("collector.sock");
    let r = redirector(&pair.url(&db.name), &socket, &["--clicks", "off"]).await;
    r.ready().await;
    let receiver = pair.standby.wal_receiver_pid().await;
    pair.standby.signal_wal_receiver(receiver, Signal::SIGSTOP);
    // WAL first, more than the socket buffers between the servers hold: what they hold still
    // reaches the standby once its receiver goes on, after the primary is gone.
    execute(
        &primary,
        "CREATE TABLE filler AS SELECT n FROM generate_series(1, 100000) AS n",
    )
    .await;
    await_standby_behind(&pair, 2e6).await;
    add_link(&primary, "lost", "https://example.com/lost").await;
    execute(
        &primary,
        "UPDATE links SET url = 'https://example.com/lost-too'",
    )
    .await;
    await_served(r.http, "kept", Some("https://example.com/lost-too")).await;
    await_served(r.http, "lost", Some("https://example.com/lost-too")).await;

    r.service.signal(Signal::SIGSTOP);
    blocking(|| pair.primary.kill_hard());
    pair.standby.signal_wal_receiver(receiver, Signal::SIGCONT);
    blocking(|| pair.standby.promote());
    let new_primary = testkit::pgtest::connect(&pair.standby.url(&db.name)).await;
    execute(
        &new_primary,
        "INSERT INTO links (code, url)
         SELECT 'new' || n, 'https://example.com/new' FROM generate_series(1, 100) AS n",
    )
    .await;
    r.service.signal(Signal::SIGCONT);
    await_served(r.http, "lost", None).await;
    await_served(r.http, "kept", Some("https://example.com/kept")).await;
    await_served(r.http, "new100", Some("https://example.com/new")).await;
}

/// A redirector reads a standby as the link reader role, which may not see the standby's
/// timeline: each new session loads the whole table, comparing, since nothing says the
/// standby's history is the one read before (it may have been rewound after a failover). So
/// does the first session on a server whose history it can see (the primary, the next host of
/// its connection string, once the standby is down): the standby's was never known.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_session_after_one_on_a_standby_that_hides_its_timeline_loads_the_whole_table() {
    let (pair, db, primary) = linked_pair(&[("kept", "https://example.com/kept")]).await;
    let role = format!("reader_{}", db.name);
    let create = format!("CREATE ROLE {role} LOGIN IN ROLE clicks_link_reader");
    execute(&primary, &create).await;
    let replicated = format!("SELECT count(*) = 1 FROM pg_roles WHERE rolname = '{role}'");
    pair.await_on_standby(&db.name, &replicated).await;
    // The standby first, then the primary: a session goes to the primary while it is down.
    let on_standby = hosts([&pair.standby, &pair.primary], &role, &db.name);
    let (_dir, r) = links_reader(&db, &on_standby).await;
    let loads_series = "redirector_link_loads_total";
    let loads = r.metric(loads_series).await;
    let standby = testkit::pgtest::connect(&pair.standby.url(&db.name)).await;
    execute(
        &standby,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE application_name = 'redirector-links'",
    )
    .await;
    await_above(&r, loads_series, loads, "a full load on the new session").await;
    r.service.wait_for_log("unknown to this role", LIMIT).await;
    await_served(r.http, "kept", Some("https://example.com/kept")).await;

    let loads = r.metric(loads_series).await;
    blocking(|| pair.standby.stop_server());
    await_above(&r, loads_series, loads, "a full load on the primary").await;
    await_served(r.http, "kept", Some("https://example.com/kept")).await;
}

/// The primary the loader read refuses it, and its next session lands on a standby of the same
/// history that has not replayed the last changes (its replay paused): one of them a TRUNCATE,
/// which that standby's change log shows as an older epoch. What it would say of `links` is
/// older than the table served, so nothing is applied or loaded from it (a full load would
/// bring back the links the TRUNCATE removed) until it has replayed as far as the primary
/// was read; then the table follows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_behind_the_table_served_takes_it_back_to_nothing_older() {
    let (pair, db, primary) = linked_pair(&[
        ("kept", "https://example.com/kept"),
        ("gone", "https://example.com/gone"),
    ])
    .await;
    let primary_first = hosts([&pair.primary, &pair.standby], "postgres", &db.name);
    let (_dir, r) = links_reader(&db, &primary_first).await;
    let standby = testkit::pgtest::connect(&pair.standby.url(&db.name)).await;
    pause_replay(&standby).await;
    execute(
        &primary,
        "TRUNCATE links; INSERT INTO links (code, url) VALUES ('kept', 'https://example.com/new')",
    )
    .await;
    await_served(r.http, "gone", None).await;
    await_served(r.http, "kept", Some("https://example.com/new")).await;

    // The primary stays up (a standby whose WAL receiver stops cannot say its timeline), and
    // refuses the loader's next session, which goes to the standby.
    let loads = r.metric("redirector_link_loads_total").await;
    let refuse = format!("ALTER DATABASE {} ALLOW_CONNECTIONS false", db.name);
    execute(&pair.primary.connect("postgres").await, &refuse).await;
    execute(
        &primary,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE application_name = 'redirector-links'",
    )
    .await;
    let behind = "redirector_link_reads_behind_total";
    await_above(&r, behind, 0.0, "a read of the standby found behind").await;
    r.service.wait_for_log("bytes of WAL behind", LIMIT).await;
    await_reads(&standby, 2).await;
    assert_eq!(served(r.http, "gone").await, None, "brought back");
    assert_eq!(
        served(r.http, "kept").await.as_deref(),
        Some("https://example.com/new"),
        "taken back"
    );
    assert_eq!(r.metric("redirector_link_loads_total").await, loads);

    execute(&standby, "SELECT pg_wal_replay_resume()").await;
    r.service
        .wait_for_log("caught up with the table served", LIMIT)
        .await;
    let resumed = db_now(&standby).await;
    let synced = "redirector_links_synced_timestamp_seconds";
    await_above(&r, synced, resumed, "the links to be current again").await;
    assert_eq!(served(r.http, "gone").await, None);
    assert_eq!(r.metric("redirector_link_loads_total").await, loads);
}

/// The primary is restored from a copy of its files taken before the last change the loader
/// read: the same system and timeline, and it lacks that change for good. Before the loader
/// reads it again, it hands that change's id to another and writes more WAL than it lost (as a
/// busy cluster does), so neither its ids nor its WAL position tell; the change the id names
/// does. The loader loads it in full from no position: the lost link goes, and the change that
/// reused the id is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_restored_behind_the_table_served_is_loaded_in_full() {
    let (pair, db, primary) = linked_pair(&[("kept", "https://example.com/kept")]).await;
    blocking(|| pair.standby.stop_server());
    drop(primary);
    let (_dir, r) = links_reader(&db, &pair.primary.url(&db.name)).await;
    let data = pair.primary.socket_dir().join("data");
    let copy = pair.primary.socket_dir().join("copy");
    blocking(|| pair.primary.stop_server());
    copy_tree(&data, &copy);
    blocking(|| pair.primary.start_server());
    let primary = testkit::pgtest::connect(&pair.primary.url(&db.name)).await;
    add_link(&primary, "lost", "https://example.com/lost").await;
    await_served(r.http, "lost", Some("https://example.com/lost")).await;

    r.service.signal(Signal::SIGSTOP);
    drop(primary);
    blocking(|| pair.primary.stop_server());
    std::fs::remove_dir_all(&data).unwrap();
    std::fs::rename(&copy, &data).unwrap();
    blocking(|| pair.primary.start_server());
    let primary = testkit::pgtest::connect(&pair.primary.url(&db.name)).await;
    execute(
        &primary,
        "CREATE TABLE filler AS SELECT n FROM generate_series(1, 300000) AS n",
    )
    .await;
    add_link(&primary, "after", "https://example.com/after").await;
    r.service.signal(Signal::SIGCONT);
    r.service
        .wait_for_log("lacks changes the table served applied", LIMIT)
        .await;
    await_served(r.http, "lost", None).await;
    await_served(r.http, "after", Some("https://example.com/after")).await;
    await_served(r.http, "kept", Some("https://example.com/kept")).await;
}

/// Copies the directory `from` to `to` as it is (`cp -a`: owners and modes kept).
fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "cp -a {} {}: {status}",
        from.display(),
        to.display()
    );
}

/// The redirector and the collector on `url` (both servers of a pair), the collector's socket
/// in `dir`; the redirector ready.
async fn pipeline(url: &str, dir: &std::path::Path) -> (Collector, Redirector) {
    let socket = dir.join("collector.sock");
    let c = Collector::start(url, &socket, &["--flush-interval", "20ms"]).await;
    let r = redirector(url, &socket, &[]).await;
    r.ready().await;
    (c, r)
}

/// Runs `f` (a blocking harness step: kill, promote) on this worker without stalling the
/// others.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_synchronous_standby_under_load_loses_no_click() {
    let pair = Pair::start(Replication::Synchronous).await;
    let db = test_db_on(&pair.primary).await;
    let primary = testkit::pgtest::connect(&db.url).await;
    add_link(&primary, "steady", "https://example.com/steady").await;
    let dir = tempfile::tempdir().unwrap();
    let (c, r) = pipeline(&pair.url(&db.name), dir.path()).await;
    let synchronous = c.metric("collector_database_synchronous").await;
    assert_eq!(
        synchronous, 1.0,
        "the collector sees its commits replicated"
    );

    let load = Load::get(r.http, "/steady");
    let running = load.start();
    await_first_rows(&primary, "steady").await;
    // Under way: some batches in, others in flight when the primary dies.
    let batches = c.metric("collector_batches_total").await;
    eventually("ten batches under load", LIMIT, || async {
        (c.metric("collector_batches_total").await >= batches + 10.0).then_some(())
    })
    .await;

    let killed = Instant::now();
    blocking(|| pair.primary.kill_hard());
    let batches = c.metric("collector_batches_total").await;
    // What a failover manager does: promote, and clear the setting the standby copied from
    // its primary (it has no standby of its own to wait for).
    blocking(|| pair.standby.promote());
    pair.standby.set_synchronous_standby_names("").await;
    let promoted = killed.elapsed();
    let new_primary = testkit::pgtest::connect(&pair.standby.url(&db.name)).await;
    add_link(&new_primary, "after", "https://example.com/after").await;
    let committed = eventually("a commit on the new primary", LIMIT, || async {
        (c.metric("collector_batches_total").await > batches).then(|| killed.elapsed())
    })
    .await;
    await_served(r.http, "after", Some("https://example.com/after")).await;
    let link_served = killed.elapsed();
    // And clicks keep landing there.
    let rows_now = rows(&new_primary, Some("steady")).await;
    eventually("clicks landing on the new primary", LIMIT, || async {
        (rows(&new_primary, Some("steady")).await > rows_now + 1_000).then_some(())
    })
    .await;
    load.stop();
    let report = running.await.unwrap();

    let served = report.all_redirected("throughout the failover");
    await_rows_settled(&new_primary, Some("steady"), served, &[r.admin, c.admin]).await;
    assert_eq!(c.metric("collector_clicks_unaccounted_total").await, 0.0);
    assert_eq!(r.dropped().await, 0.0);
    eprintln!(
        "failover: primary killed -> first commit on the new primary: {} ms; -> first link \
         change served: {} ms (promoted and its synchronous_standby_names cleared at {} ms; \
         synchronous; {served} redirects, max latency {:?})",
        committed.as_millis(),
        link_served.as_millis(),
        promoted.as_millis(),
        report.max_latency
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asynchronous_failover_that_lost_acknowledged_clicks_counts_them_and_stalls_nothing() {
    let pair = Pair::start(Replication::Asynchronous).await;
    let db = test_db_on(&pair.primary).await;
    let primary = testkit::pgtest::connect(&db.url).await;
    add_link(&primary, "steady", "https://example.com/steady").await;
    let dir = tempfile::tempdir().unwrap();
    let (c, r) = pipeline(&pair.url(&db.name), dir.path()).await;
    assert_eq!(c.metric("collector_database_synchronous").await, 0.0);

    let load = Load::get(r.http, "/steady");
    let running = load.start();
    await_first_rows(&primary, "steady").await;
    // The standby stops taking WAL; the primary commits (and the collector acknowledges) on,
    // until well more than the socket buffers between them could still hand over.
    let receiver = pair.standby.wal_receiver_pid().await;
    pair.standby.signal_wal_receiver(receiver, Signal::SIGSTOP);
    await_standby_behind(&pair, 2e6).await;
    let acked = r.metric("redirector_clicks_acked_total").await;
    eventually("clicks acknowledged meanwhile", LIMIT, || async {
        (r.metric("redirector_clicks_acked_total").await > acked).then_some(())
    })
    .await;

    let killed = Instant::now();
    blocking(|| pair.primary.kill_hard());
    pair.standby.signal_wal_receiver(receiver, Signal::SIGCONT);
    blocking(|| pair.standby.promote());
    let new_primary = testkit::pgtest::connect(&pair.standby.url(&db.name)).await;
    let unaccounted = eventually("the loss counted", LIMIT, || async {
        let n = c.metric("collector_clicks_unaccounted_total").await;
        (n > 0.0).then_some(n)
    })
    .await;
    let counted = killed.elapsed();
    c.service
        .wait_for_log("the database lacks commits this collector made", LIMIT)
        .await;
    // Nothing stalls: clicks after the failover land.
    let rows_now = rows(&new_primary, Some("steady")).await;
    eventually("clicks landing on the new primary", LIMIT, || async {
        (rows(&new_primary, Some("steady")).await > rows_now + 1_000).then_some(())
    })
    .await;
    load.stop();
    let report = running.await.unwrap();

    let served = report.all_redirected("throughout the failover");
    let lost = unaccounted as u64;
    await_rows_settled(
        &new_primary,
        Some("steady"),
        served - lost,
        &[r.admin, c.admin],
    )
    .await;
    assert_eq!(
        c.metric("collector_clicks_unaccounted_total").await,
        unaccounted,
        "counted once"
    );
    assert_eq!(r.dropped().await, 0.0);
    let recorded = rows(&new_primary, Some("steady")).await;
    eprintln!(
        "asynchronous failover: {served} redirects, {recorded} rows on the new primary, {lost} \
         acknowledged clicks it lacked, counted {} ms after the kill",
        counted.as_millis()
    );
}

/// A collector restarted after committing clicks the asynchronous standby lacks, and before
/// the failover to it: the new process committed nothing of that sender yet, and loaded its
/// seq from the old primary, ahead of the new one. The loss is still counted, and every
/// redirect is a row or counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_just_after_a_collector_restart_counts_what_the_process_before_lost() {
    let pair = Pair::start(Replication::Asynchronous).await;
    let db = test_db_on(&pair.primary).await;
    let primary = testkit::pgtest::connect(&db.url).await;
    add_link(&primary, "steady", "https://example.com/steady").await;
    let dir = tempfile::tempdir().unwrap();
    let url = pair.url(&db.name);
    let (mut c, r) = pipeline(&url, dir.path()).await;

    // Clicks committed and acknowledged on the primary alone.
    let receiver = pair.standby.wal_receiver_pid().await;
    pair.standby.signal_wal_receiver(receiver, Signal::SIGSTOP);
    let load = Load::get(r.http, "/steady");
    let running = load.start();
    await_first_rows(&primary, "steady").await;
    await_standby_behind(&pair, 2e6).await;
    load.stop();
    let before = running.await.unwrap().all_redirected("before the restart");
    await_rows_settled(&primary, Some("steady"), before, &[r.admin, c.admin]).await;

    // The collector restarts, and commits nothing of the redirector's before the failover.
    c.service.signal(Signal::SIGTERM);
    assert!(c.service.wait_exit(LIMIT).await.success());
    let c = Collector::start(
        &url,
        &dir.path().join("collector.sock"),
        &["--flush-interval", "20ms"],
    )
    .await;
    blocking(|| pair.primary.kill_hard());
    pair.standby.signal_wal_receiver(receiver, Signal::SIGCONT);
    blocking(|| pair.standby.promote());
    let new_primary = testkit::pgtest::connect(&pair.standby.url(&db.name)).await;

    // The redirector's next clicks: written on the new primary, the loss found as they are.
    let load = Load::get(r.http, "/steady");
    let running = load.start();
    let unaccounted = eventually("the loss counted", LIMIT, || async {
        let n = c.metric("collector_clicks_unaccounted_total").await;
        (n > 0.0).then_some(n as u64)
    })
    .await;
    load.stop();
    let after = running.await.unwrap().all_redirected("after the failover");
    let lacked = before - rows(&new_primary, Some("steady")).await.min(before);
    assert!(
        lacked > 0,
        "the new primary lacks clicks acknowledged before"
    );
    await_rows_settled(
        &new_primary,
        Some("steady"),
        before + after - unaccounted,
        &[r.admin, c.admin],
    )
    .await;
    assert_eq!(r.dropped().await, 0.0);
}
