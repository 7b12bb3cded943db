//! `--clicks off` records nothing; `--clicks direct` writes one row per redirect itself,
//! without a collector.

use nix::sys::signal::Signal;
use testkit::redirector::{await_rows, fixture, load::Load, redirector, rows, LIMIT};

#[tokio::test]
async fn direct_mode_inserts_one_row_per_redirect_without_a_collector() {
    let f = fixture(&[("direct", "https://example.com/")]).await;
    let r = redirector(&f.db.url, &f.socket, &["--clicks", "direct"]).await;
    r.ready().await;
    let report = Load::get(r.http, "/direct").run(2_000).await;
    assert_eq!(report.count(302), 2_000, "{report:?}");
    // Each INSERT finished before its redirect was answered.
    assert_eq!(rows(&f.client, Some("direct")).await, 2_000);
    assert_eq!(r.metric("redirector_clicks_sent_total").await, 2_000.0);
    assert_eq!(r.metric("redirector_ring_capacity").await, 0.0);
}

#[tokio::test]
async fn off_mode_redirects_and_records_nothing() {
    let f = fixture(&[("quiet", "https://example.com/")]).await;
    let _collector = testkit::redirector::collector(&f.db.url, &f.socket).await;
    let mut r = redirector(&f.db.url, &f.socket, &["--clicks", "off"]).await;
    r.ready().await;
    let report = Load::get(r.http, "/quiet").run(2_000).await;
    assert_eq!(report.count(302), 2_000, "{report:?}");
    assert_eq!(r.metric("redirector_redirects_total").await, 2_000.0);
    assert_eq!(r.metric("redirector_clicks_queued_total").await, 0.0);
    assert_eq!(r.metric("redirector_clicks_sent_total").await, 0.0);
    // Set in every mode, not only where a state region is adopted.
    let started = r.metric("redirector_start_time_seconds").await;
    let unix_now = std::time::UNIX_EPOCH.elapsed().unwrap().as_secs_f64();
    assert!(started > unix_now - 600.0, "start time {started}");

    // A stop sends whatever the redirector still held. A marker click sent after it queues
    // behind all of that on the collector's socket, so once the marker is a row, any click of
    // the redirector's would be one too: the one row must be the marker's.
    r.service.signal(Signal::SIGTERM);
    assert!(r.service.wait_exit(LIMIT).await.success());
    let marker = [("marker".to_owned(), protocol::now_us())];
    testkit::collector::send_all(&f.socket, testkit::collector::datagrams(1, &marker)).await;
    await_rows(&f.client, Some("marker"), 1).await;
    assert_eq!(rows(&f.client, None).await, 1, "only the marker is a row");
}

/// Requests cut off while their INSERT is under way (a stop that gives requests in flight
/// 1 ms): every row written is a redirect counted, and every redirect counted a row (the
/// INSERT and its count run on a task of their own, which a dropped request does not cancel).
#[tokio::test]
async fn direct_mode_counts_every_row_it_writes_even_for_requests_cut_off() {
    // Slow INSERTs: at the stop, every connection has one under way.
    let slow = "CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS
                    $$ BEGIN PERFORM pg_sleep(0.05); RETURN NEW; END $$;
                CREATE TRIGGER slow BEFORE INSERT ON clicks FOR EACH ROW EXECUTE FUNCTION slow();";
    let f = fixture_with("cutoff", slow).await;
    let flags = ["--clicks", "direct", "--drain-timeout", "1ms"];
    let mut r = redirector(&f.db.url, &f.socket, &flags).await;
    r.ready().await;
    let running = Load::get(r.http, "/cutoff").start();
    testkit::eventually("rows being written", testkit::redirector::LIMIT, || async {
        (rows(&f.client, Some("cutoff")).await >= 200).then_some(())
    })
    .await;
    r.service.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(r
        .service
        .wait_exit(testkit::redirector::LIMIT)
        .await
        .success());
    // INSERTs the server had already been sent still run after the process is gone.
    let busy = "SELECT count(*) FROM pg_stat_activity
                WHERE datname = current_database() AND pid <> pg_backend_pid()";
    testkit::eventually(
        "the redirector's sessions to end",
        testkit::redirector::LIMIT,
        || async {
            let n: i64 = f.client.query_one(busy, &[]).await.unwrap().get(0);
            (n == 0).then_some(())
        },
    )
    .await;
    let (sent, dropped) = testkit::redirector::final_counts(&r.service.log());
    assert_eq!(dropped, 0);
    assert_eq!(rows(&f.client, Some("cutoff")).await, sent);
    assert_eq!(testkit::redirector::final_redirects(&r.service.log()), sent);
    running.await.unwrap();
}

/// A database that holds an INSERT (a lock), stops answering (its sessions' backends stopped)
/// or drops the sessions: each such click is answered within twice `--link-timeout` and
/// counted dropped (`direct_failed`), a row only if the silent server ran it after all; the
/// sessions are opened again, later clicks are rows, and the books balance at the stop.
#[tokio::test]
async fn direct_mode_gives_up_on_a_database_that_does_not_answer_and_opens_its_sessions_again() {
    let f = fixture(&[("direct", "https://example.com/")]).await;
    let flags = ["--clicks", "direct", "--link-timeout", "1s"];
    let flags = [&flags[..], &["--direct-connections", "2"]].concat();
    let mut r = redirector(&f.db.url, &f.socket, &flags).await;
    r.ready().await;
    let click = || async {
        let answered = tokio::time::timeout(LIMIT, Load::get(r.http, "/direct").run(1)).await;
        answered.expect("a click answered in time").count(302)
    };
    let failed = r#"redirector_clicks_dropped_total{reason="direct_failed"}"#;
    assert_eq!(click().await, 1);
    assert_eq!(rows(&f.client, Some("direct")).await, 1);

    // Held by a lock: the server's statement timeout cancels each INSERT; nothing is written.
    let locker = testkit::pgtest::connect(&f.db.url).await;
    locker
        .batch_execute("BEGIN; LOCK TABLE clicks IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    for _ in 0..4 {
        assert_eq!(click().await, 1);
    }
    assert_eq!(r.metric(failed).await, 4.0);
    locker.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        rows(&f.client, Some("direct")).await,
        1,
        "cancelled, not written"
    );

    // Silent: every session's backend stopped. Each click waits out twice the timeout.
    let sessions = "SELECT pid FROM pg_stat_activity
                    WHERE application_name = 'redirector-clicks' AND datname = current_database()";
    let pids = testkit::eventually("both sessions open", LIMIT, || async {
        let found = f.client.query(sessions, &[]).await.unwrap();
        let pids: Vec<i32> = found.iter().map(|r| r.get(0)).collect();
        (pids.len() == 2).then_some(pids)
    })
    .await;
    let before = rows(&f.client, Some("direct")).await;
    let stopped = Stopped::new(pids);
    assert_eq!(click().await, 1);
    assert_eq!(click().await, 1);
    assert_eq!(r.metric(failed).await, 6.0);
    drop(stopped);
    // Past the two the woken backends may still write.
    testkit::eventually("clicks written on sessions opened again", LIMIT, || async {
        click().await;
        (rows(&f.client, Some("direct")).await > before + 2).then_some(())
    })
    .await;

    // Dropped: the database ends the sessions (a restart, an administrator).
    let written = rows(&f.client, Some("direct")).await;
    let ended = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                 WHERE application_name = 'redirector-clicks' AND datname = current_database()";
    let n: i64 = f.client.query_one(ended, &[]).await.unwrap().get(0);
    assert!(n >= 1, "sessions to end");
    testkit::eventually("clicks written after the sessions ended", LIMIT, || async {
        click().await;
        (rows(&f.client, Some("direct")).await > written).then_some(())
    })
    .await;

    r.service.signal(Signal::SIGTERM);
    assert!(r.service.wait_exit(LIMIT).await.success());
    let (sent, dropped) = testkit::redirector::final_counts(&r.service.log());
    assert!(dropped >= 6, "dropped: {dropped}");
    // The two INSERTs the stopped backends had been sent ran when they woke: given up on,
    // counted dropped, and rows all the same (a silent server leaves it unknown).
    let written = rows(&f.client, Some("direct")).await;
    assert!(
        (sent..=sent + 2).contains(&written),
        "{written} rows, {sent} sent"
    );
    assert_eq!(
        testkit::redirector::final_redirects(&r.service.log()),
        sent + dropped
    );
}

/// An INSERT given up on is cancelled, not left running: one whose commit outlasts twice
/// `--link-timeout` (a deferred trigger stands in for a synchronous standby that never answers:
/// no statement timeout covers a commit) is rolled back, and its server process is free long
/// before the trigger would have let it commit.
#[tokio::test]
async fn direct_mode_cancels_an_insert_it_gave_up_on() {
    let stall = "CREATE FUNCTION stall() RETURNS trigger LANGUAGE plpgsql AS
                     $$ BEGIN PERFORM pg_sleep(120); RETURN NULL; END $$;
                 CREATE CONSTRAINT TRIGGER stall AFTER INSERT ON clicks
                     DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION stall();";
    let f = fixture_with("stall", stall).await;
    let flags = ["--clicks", "direct", "--link-timeout", "1s"];
    let flags = [&flags[..], &["--direct-connections", "1"]].concat();
    let r = redirector(&f.db.url, &f.socket, &flags).await;
    r.ready().await;
    let answered = tokio::time::timeout(LIMIT, Load::get(r.http, "/stall").run(1)).await;
    assert_eq!(answered.expect("the click answered in time").count(302), 1);
    let failed = r#"redirector_clicks_dropped_total{reason="direct_failed"}"#;
    assert_eq!(r.metric(failed).await, 1.0);
    let stalled = "SELECT count(*) FROM pg_stat_activity
                   WHERE datname = current_database() AND state = 'active'
                     AND query LIKE 'INSERT INTO clicks%'";
    let cancelled = std::time::Duration::from_secs(30);
    testkit::eventually(
        "the INSERT given up on to be cancelled",
        cancelled,
        || async {
            let n: i64 = f.client.query_one(stalled, &[]).await.unwrap().get(0);
            (n == 0).then_some(())
        },
    )
    .await;
    assert_eq!(rows(&f.client, Some("stall")).await, 0, "rolled back");
}

/// A fixture with the one link `code`, and `sql` run in its database.
async fn fixture_with(code: &str, sql: &str) -> testkit::redirector::Fixture {
    let f = fixture(&[(code, "https://example.com/")]).await;
    f.client.batch_execute(sql).await.unwrap();
    f
}

/// Processes stopped (SIGSTOP) until dropped, so that a failed assertion leaves none of the
/// shared cluster's backends stopped.
struct Stopped(Vec<i32>);

impl Stopped {
    fn new(pids: Vec<i32>) -> Stopped {
        let stopped = Stopped(pids);
        stopped.signal(Signal::SIGSTOP);
        stopped
    }

    fn signal(&self, signal: Signal) {
        for &pid in &self.0 {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
        }
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        self.signal(Signal::SIGCONT);
    }
}
