//! PostgreSQL stopped and started again under the running collector. Its own test binary,
//! so the outage hits only this test's private cluster.

use std::time::Duration;

use testkit::collector::*;
use testkit::pgtest;

/// Polls of an unchanged value that show the receiver stalled: ten in a row span well over
/// the 40 ms between the late sender's datagrams.
const STALLED_POLLS: u32 = 10;

/// Waits until `series` has kept one value over [`STALLED_POLLS`] polls in a row; returns it.
async fn unchanged_for_polls(c: &Collector, series: &str) -> f64 {
    let seen = std::cell::Cell::new((f64::NAN, 0));
    let what = format!("{series} to stay put over {STALLED_POLLS} polls");
    testkit::eventually(&what, LIMIT, || async {
        let now = c.metric(series).await;
        let (last, same) = seen.get();
        let same = if now == last { same + 1 } else { 0 };
        seen.set((now, same));
        (same >= STALLED_POLLS).then_some(now)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_for_seconds_loses_and_doubles_nothing() {
    let p = place().await;
    let mut c = start_collector(
        &p.db,
        &p.path,
        &[
            "--batch-rows",
            "500",
            "--flush-interval",
            "20ms",
            "--compact-interval",
            "200ms",
        ],
    )
    .await;
    // Distinct timestamps, so a click written twice would show as a repeated row.
    let sent = clicks(60_000, 300, start_us(), 1_001);
    let grams = datagrams(11, &sent);
    let (early, late) = grams.split_at(grams.len() / 3);

    send_all(&p.path, early.to_vec()).await;
    tokio::task::spawn_blocking(|| pgtest::cluster().stop_server())
        .await
        .unwrap();
    testkit::eventually(
        "/healthz to say 503 while the database is down",
        LIMIT,
        || async { (c.health().await == 503).then_some(()) },
    )
    .await;
    // Clicks keep arriving, paced, during the outage and after it.
    let sender = {
        let path = p.path.clone();
        let late = late.to_vec();
        tokio::task::spawn_blocking(move || {
            let sock = connect(&path);
            for d in &late {
                sock.send(d).unwrap();
                std::thread::sleep(Duration::from_millis(40));
            }
        })
    };
    testkit::eventually("clicks pending for the database", LIMIT, || async {
        (c.metric("collector_pending_clicks").await > 0.0).then_some(())
    })
    .await;
    // Backpressure: with both batches waiting for the database the collector reads nothing,
    // the socket's queue fills and the sender is held with the rest of its datagrams.
    let received = unchanged_for_polls(&c, "collector_datagrams_received_total").await;
    assert!(received < grams.len() as f64, "received {received}");
    assert!(
        !sender.is_finished(),
        "the sender should be held by the full queue"
    );
    assert!(c.metric("collector_pending_clicks").await > 0.0);
    tokio::task::spawn_blocking(|| pgtest::cluster().start_server())
        .await
        .unwrap();
    sender.await.unwrap();

    // The connection from before the outage was cut.
    let client = pgtest::connect(&p.db.url).await;
    await_rows(&client, None, sent.len() as u64).await;
    let mut want = sent.clone();
    want.sort();
    assert_eq!(stored_clicks(&client).await, want, "every click once");
    c.ready().await;
    assert!(c.metric("collector_db_errors_total").await >= 1.0);
    assert_eq!(c.metric("collector_pending_clicks").await, 0.0);
    testkit::eventually(
        "click_counts to catch up after the outage",
        LIMIT,
        || async {
            (totals(&client, "click_counts").await == expected_totals(&sent)).then_some(())
        },
    )
    .await;
    // The same process served all along: it still runs, and stops cleanly now.
    c.service.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(c.service.wait_exit(LIMIT).await.success());
    let exits = c
        .service
        .log()
        .iter()
        .filter(|l| l.contains("clicks written"))
        .count();
    assert_eq!(exits, 1);
}
