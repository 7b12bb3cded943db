//! End to end: the real redirector and the real collector over a socket in a temp dir, a
//! private PostgreSQL, and HTTP load from 50 keep-alive connections. Every redirect served is a
//! row in `clicks` or a counted drop.

use std::time::Duration;

use hyper::Method;
use nix::sys::signal::Signal;
use testkit::db::await_rows_settled;
use testkit::redirector::{
    await_rows, collector_with, database_away, fixture, load::Load, metric, redirector, rows, LIMIT,
};

#[tokio::test]
async fn twenty_thousand_gets_become_twenty_thousand_rows() {
    let f = fixture(&[("promo", "https://example.com/promo")]).await;
    let (_collector, collector_admin) = collector_with(&f.db.url, &f.socket, &[]).await;
    let r = redirector(&f.db.url, &f.socket, &[]).await;
    r.ready().await;

    let gets = Load::get(r.http, "/promo").run(20_000).await;
    let heads = Load::get(r.http, "/promo")
        .method(Method::HEAD)
        .run(2_000)
        .await;
    let unknown = Load::get(r.http, "/nosuchcode").run(2_000).await;
    assert_eq!(gets.count(302), 20_000, "{gets:?}");
    assert_eq!(heads.count(302), 2_000, "{heads:?}");
    assert_eq!(unknown.count(404), 2_000, "{unknown:?}");

    let admins = [r.admin, collector_admin];
    await_rows_settled(&f.client, Some("promo"), 20_000, &admins).await;
    assert_eq!(
        rows(&f.client, None).await,
        20_000,
        "HEAD and unknown codes add no rows"
    );
    assert_eq!(r.metric("redirector_clicks_sent_total").await, 20_000.0);
    assert_eq!(r.metric("redirector_redirects_total").await, 20_000.0);
    eprintln!("20,000 GETs: max latency {:?}", gets.max_latency);
}

#[tokio::test]
async fn the_ring_holds_every_click_while_the_collector_is_stopped_for_three_seconds() {
    let f = fixture(&[("steady", "https://example.com/")]).await;
    let (mut first, _) = collector_with(&f.db.url, &f.socket, &[]).await;
    let r = redirector(&f.db.url, &f.socket, &[]).await;
    r.ready().await;

    let load = Load::get(r.http, "/steady");
    let running = load.start();
    testkit::redirector::await_first_rows(&f.client, "steady").await;
    first.signal(Signal::SIGTERM);
    assert!(first.wait_exit(LIMIT).await.success());
    let sent_before = r.metric("redirector_clicks_sent_total").await;
    let served_before = r.metric("redirector_redirects_total").await;
    // The outage itself: the scenario's length, not a wait for a condition.
    tokio::time::sleep(Duration::from_secs(3)).await;
    // A handler that waited on the collector's socket would answer nothing until it is back.
    assert!(
        r.metric("redirector_redirects_total").await > served_before,
        "redirects are answered while the collector is away"
    );
    let held = r.metric("redirector_ring_depth").await;
    assert!(
        held > 0.0,
        "the ring holds clicks while the collector is away"
    );
    assert_eq!(
        r.metric("redirector_clicks_sent_total").await,
        sent_before,
        "nothing is sent while nobody listens"
    );
    let (_second, second_admin) = collector_with(&f.db.url, &f.socket, &[]).await;
    testkit::eventually("clicks sent again", LIMIT, || async {
        (r.metric("redirector_clicks_sent_total").await > sent_before + held).then_some(())
    })
    .await;
    load.stop();
    let report = running.await.unwrap();

    report.all_redirected("while the collector was away");
    let admins = [r.admin, second_admin];
    await_rows_settled(&f.client, Some("steady"), report.count(302), &admins).await;
    assert_eq!(
        r.metric("redirector_clicks_sent_total").await,
        report.count(302) as f64
    );
    assert_eq!(dropped(&r).await, 0.0);
    eprintln!(
        "collector outage: {} redirects, {held} held in the ring after 3 s, max latency {:?}",
        report.count(302),
        report.max_latency
    );
}

#[tokio::test]
async fn a_collector_away_longer_than_the_ring_holds_counts_every_drop_without_growing() {
    let f = fixture(&[("flood", "https://example.com/")]).await;
    let r = redirector(&f.db.url, &f.socket, &["--ring-capacity", "5000"]).await;
    r.ready().await;
    let load = Load::get(r.http, "/flood");

    // Warm up: fill the ring and let the connections and allocator settle.
    let warm = load.run(10_000).await;
    assert!(
        r.metric("redirector_clicks_dropped_total{reason=\"ring_full\"}")
            .await
            > 0.0
    );
    let before = testkit::rss_kib(r.service.pid());
    let flood = load.run(100_000).await;
    let after = testkit::rss_kib(r.service.pid());
    assert_eq!(flood.count(302), 100_000, "{flood:?}");
    // 100,000 clicks kept would take 8 MB at 80 bytes each; the ring is allocated once.
    assert!(
        after <= before + 4 * 1024,
        "RSS grew from {before} KiB to {after} KiB over 100,000 dropped clicks"
    );

    let (_collector, collector_admin) = collector_with(&f.db.url, &f.socket, &[]).await;
    let served = warm.count(302) + flood.count(302);
    let ring_full = r
        .metric("redirector_clicks_dropped_total{reason=\"ring_full\"}")
        .await;
    assert!(
        ring_full >= 100_000.0,
        "{ring_full} dropped for a full ring"
    );
    let sent = served - ring_full as u64;
    await_rows_settled(&f.client, Some("flood"), sent, &[r.admin, collector_admin]).await;
    assert_eq!(r.metric("redirector_clicks_sent_total").await, sent as f64);
    assert_eq!(dropped(&r).await, ring_full, "only ring_full drops");
    assert_eq!(r.metric("redirector_redirects_total").await, served as f64);
    eprintln!("ring overflow: {served} served, {sent} rows, {ring_full} dropped; RSS {before} -> {after} KiB");
}

#[tokio::test]
async fn sigterm_under_load_exits_zero_every_redirect_is_a_row_or_a_drop_and_a_restart_goes_on() {
    let f = fixture(&[("busy", "https://example.com/")]).await;
    let (_collector, collector_admin) = collector_with(&f.db.url, &f.socket, &[]).await;
    let mut r = redirector(&f.db.url, &f.socket, &[]).await;
    r.ready().await;

    let running = Load::get(r.http, "/busy").start();
    testkit::eventually("load under way", LIMIT, || async {
        (rows(&f.client, Some("busy")).await >= 5_000).then_some(())
    })
    .await;
    r.service.signal(Signal::SIGTERM);
    let status = r.service.wait_exit(LIMIT).await;
    let report = running.await.unwrap();
    assert!(status.success(), "{status:?}");

    let log = r.service.log();
    let (sent, dropped) = testkit::redirector::final_counts(&log);
    let (acked, unacked) = testkit::redirector::final_acks(&log);
    assert_eq!(acked + unacked, sent, "sent = acknowledged + not");
    assert_eq!(
        acked + dropped,
        report.count(302),
        "served = acknowledged + dropped: {report:?}"
    );
    // The redirector is gone: only the collector is left to settle.
    await_rows_settled(&f.client, Some("busy"), sent, &[collector_admin]).await;
    eprintln!(
        "SIGTERM under load: {} redirects, {sent} sent, {dropped} dropped, {} requests cut off",
        report.count(302),
        report.errors
    );

    // A new process (a new sender id) picks up where the old one stopped.
    let mut next = redirector(&f.db.url, &f.socket, &[]).await;
    next.ready().await;
    let more = Load::get(next.http, "/busy").run(2_000).await;
    assert_eq!(more.count(302), 2_000, "{more:?}");
    next.service.signal(Signal::SIGTERM);
    assert!(next.service.wait_exit(LIMIT).await.success());
    assert_eq!(
        testkit::redirector::final_counts(&next.service.log()),
        (2_000, 0)
    );
    await_rows_settled(&f.client, Some("busy"), sent + 2_000, &[collector_admin]).await;
}

#[tokio::test]
async fn sigterm_with_the_collector_away_counts_the_ring_as_dropped_at_shutdown() {
    let f = fixture(&[("orphan", "https://example.com/")]).await;
    let mut r = redirector(&f.db.url, &f.socket, &["--drain-timeout", "300ms"]).await;
    r.ready().await;
    let report = Load::get(r.http, "/orphan").run(3_000).await;
    assert_eq!(report.count(302), 3_000, "{report:?}");
    assert_eq!(r.metric("redirector_clicks_queued_total").await, 3_000.0);
    assert_eq!(r.metric("redirector_clicks_sent_total").await, 0.0);

    r.service.signal(Signal::SIGTERM);
    let status = r.service.wait_exit(LIMIT).await;
    assert!(status.success(), "{status:?}");
    assert_eq!(
        testkit::redirector::final_counts(&r.service.log()),
        (0, 3_000)
    );
    assert_eq!(rows(&f.client, None).await, 0);
}

/// The database away when the redirector stops: the collector took the clicks but cannot
/// commit them, so it never acknowledges them, and the redirector, which holds the only copy it
/// could resend, exits. Those clicks are counted as dropped (`unacknowledged`), so served =
/// acknowledged + dropped still holds; the clicks acknowledged before the outage are not.
#[tokio::test]
async fn sigterm_with_the_database_away_counts_the_unacknowledged_clicks_as_dropped() {
    let f = fixture(&[("stranded", "https://example.com/")]).await;
    let (_collector, collector_admin) = collector_with(&f.db.url, &f.socket, &[]).await;
    let mut r = redirector(&f.db.url, &f.socket, &["--drain-timeout", "300ms"]).await;
    r.ready().await;

    let before = Load::get(r.http, "/stranded").run(200).await;
    assert_eq!(before.count(302), 200, "{before:?}");
    await_rows(&f.client, Some("stranded"), 200).await;
    testkit::eventually("the first 200 clicks to be acknowledged", LIMIT, || async {
        (r.metric("redirector_clicks_acked_total").await == 200.0).then_some(())
    })
    .await;

    let _admin = database_away(&f).await;
    let during = Load::get(r.http, "/stranded").run(300).await;
    assert_eq!(during.count(302), 300, "{during:?}");
    testkit::eventually(
        "the collector to hold the 300 clicks it cannot commit, unacknowledged",
        LIMIT,
        || async {
            let received = metric(collector_admin, "collector_clicks_received_total").await;
            let unacked = r.metric("redirector_unacked_clicks").await;
            (received == 500.0 && unacked == 300.0).then_some(())
        },
    )
    .await;

    r.service.signal(Signal::SIGTERM);
    let status = r.service.wait_exit(LIMIT).await;
    assert!(status.success(), "{status:?}");
    let log = r.service.log();
    let (sent, dropped) = testkit::redirector::final_counts(&log);
    let (acked, unacked) = testkit::redirector::final_acks(&log);
    assert_eq!(
        (sent, acked, unacked),
        (500, 200, 300),
        "sent, acknowledged, not"
    );
    assert_eq!(
        testkit::redirector::final_drops(&log),
        [("unacknowledged".to_owned(), 300)].into(),
        "dropped by reason"
    );
    assert_eq!(dropped, 300);
    assert_eq!(
        acked + dropped,
        testkit::redirector::final_redirects(&log),
        "served = acknowledged + dropped"
    );
}

async fn dropped(r: &testkit::redirector::Redirector) -> f64 {
    let mut total = 0.0;
    for reason in [
        "ring_full",
        "shutdown",
        "invalid",
        "direct_failed",
        "unacknowledged",
    ] {
        total += r
            .metric(&format!(
                "redirector_clicks_dropped_total{{reason=\"{reason}\"}}"
            ))
            .await;
    }
    total
}

/// An acknowledgement forged by another user, for every click sent so far, changes nothing:
/// while the redirector is connected to the collector the kernel refuses it, and between
/// collectors the redirector refuses it for its uid. Every click still lands.
#[tokio::test]
async fn a_forged_acknowledgement_from_another_user_changes_nothing() {
    let f = fixture(&[("forged", "https://example.com/")]).await;
    let (mut collector, _) = collector_with(&f.db.url, &f.socket, &[]).await;
    let ack_socket = f.socket.with_file_name("forged-ack.sock");
    let ack_flag = ack_socket.to_str().unwrap();
    // Writable by anyone, so that only the checks beside the file mode are left.
    let extra = ["--ack-socket", ack_flag, "--ack-socket-mode", "0666"];
    let mut r = redirector(&f.db.url, &f.socket, &extra).await;
    r.ready().await;
    let line = r.service.wait_for_log("sending as ", LIMIT).await;
    let sender = line
        .split("sending as ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap();
    let sender = u64::from_str_radix(sender, 16).unwrap();
    let forged = protocol::wire::Ack::new(sender, Some(u64::MAX >> 1), None).encode();

    let first = Load::get(r.http, "/forged").run(2_000).await;
    testkit::redirector::await_first_rows(&f.client, "forged").await;
    // The ack socket takes it (it is not connected), and the uid the kernel attests gives it
    // away.
    testkit::send_as_user(65534, &ack_socket, &forged).unwrap();
    testkit::eventually("the forged acknowledgement refused", LIMIT, || async {
        (r.metric("redirector_acks_rejected_total").await == 1.0).then_some(())
    })
    .await;

    // Also while the collector is dead (killed: a send to its socket is refused).
    collector.signal(Signal::SIGKILL);
    collector.wait_exit(LIMIT).await;
    let second = Load::get(r.http, "/forged").run(2_000).await;
    let refused = "redirector_send_errors_total{kind=\"refused\"}";
    testkit::eventually(
        "the redirector to find the collector dead",
        LIMIT,
        || async { (r.metric(refused).await > 0.0).then_some(()) },
    )
    .await;
    testkit::send_as_user(65534, &ack_socket, &forged).unwrap();
    testkit::eventually("the forged acknowledgement refused", LIMIT, || async {
        (r.metric("redirector_acks_rejected_total").await == 2.0).then_some(())
    })
    .await;
    assert!(
        r.metric("redirector_unacked_clicks").await > 0.0,
        "nothing forgotten"
    );

    let (_collector, collector_admin) = collector_with(&f.db.url, &f.socket, &[]).await;
    let served = first.count(302) + second.count(302);
    assert_eq!(served, 4_000);
    let admins = [r.admin, collector_admin];
    await_rows_settled(&f.client, Some("forged"), served, &admins).await;
    r.service.signal(Signal::SIGTERM);
    assert!(r.service.wait_exit(LIMIT).await.success());
    assert_eq!(
        testkit::redirector::final_counts(&r.service.log()),
        (served, 0)
    );
}
