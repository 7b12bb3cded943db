//! The collector's memory is bounded whatever the number of distinct codes: the real binary,
//! its sums held to a small --compact-memory, takes many times that many codes at full speed
//! and never crosses a limit on its peak resident memory, with the totals exact.

use std::time::Duration;

use testkit::collector::*;
use testkit::flood::send_distinct;

/// Distinct 64-byte codes, each clicked once, then the first `AGAIN` of them once more (folded
/// by then: the fold adds to keys click_counts holds). Their sums, one per code, would take
/// about 37 MiB, nine times --compact-memory below.
const CODES: u64 = 250_000;
const AGAIN: u64 = 50_000;
/// The sums' bound: a fold is due at half of it.
const BOUND: &str = "4M";
/// What the collector's peak RSS (VmHWM) must stay under: what it takes with no sums (13 MiB
/// in a debug build), the bound, two batches of --batch-rows 5000 distinct codes and the slack
/// of the allocator. Without the bound its sums alone would come near it, and cross it with
/// what a fold of them takes.
const LIMIT_MIB: u64 = 48;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_distinct_codes_keep_the_collector_under_its_memory_limit_with_exact_totals() {
    let p = place().await;
    // The default --compact-interval (60 s) and --compact-backlog (5 M): only memory makes a
    // fold due within the run.
    let flags = ["--compact-memory", BOUND, "--batch-rows", "5000"];
    let c = start_collector(&p.db, &p.path, &flags).await;
    let pid = c.service.pid();
    let at_start = testkit::peak_rss_kib(pid);
    let started = std::time::Instant::now();
    let path = p.path.clone();
    let sending = tokio::task::spawn_blocking(move || {
        send_distinct(&path, 0xd15c, 0..CODES) + send_distinct(&path, 0xd15d, 0..AGAIN)
    });
    // Sampled through the run: what the collector says its sums take stays within the bound.
    let bound = 4 << 20;
    let mut most = 0.0f64;
    while !sending.is_finished() {
        let bytes = c.metric("collector_unfolded_bytes").await;
        assert!(bytes < bound as f64, "the sums took {bytes} bytes");
        most = most.max(bytes);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let sent = sending.await.unwrap();
    assert_eq!(sent, CODES + AGAIN);
    let what = format!("{sent} clicks written");
    testkit::eventually(&what, LIMIT, || async {
        let written = c.metric("collector_clicks_written_total").await;
        (written >= sent as f64).then_some(())
    })
    .await;
    let took = started.elapsed();

    let peak = testkit::peak_rss_kib(pid);
    let folds = c.metric("collector_compactions_total").await;
    let dropped = c.metric("collector_unfolded_dropped_total").await;
    eprintln!(
        "{sent} clicks of {CODES} distinct codes written in {took:.1?}: peak RSS {} MiB (at \
         start {} MiB, limit {LIMIT_MIB} MiB), the sums at most {:.1} MiB of {BOUND}, {folds} \
         folds, sums dropped {dropped} times",
        peak / 1024,
        at_start / 1024,
        most / f64::from(1 << 20)
    );
    assert!(
        peak < LIMIT_MIB * 1024,
        "the collector's peak RSS was {} MiB, over the {LIMIT_MIB} MiB limit",
        peak / 1024
    );
    // Neither --compact-interval nor --compact-backlog comes due in this run: a fold is the
    // memory bound's. (How many depends on how fast PostgreSQL keeps up beside the sender; the
    // sums dropped meanwhile are folded the SQL way, which the totals below check.)
    assert!(folds >= 1.0, "no fold came due by memory: {folds}");

    // Exact: every click a row, each code's total its clicks, folded or not.
    assert_eq!(
        count(&p.client, "SELECT count(*) FROM clicks").await,
        sent as i64
    );
    let totals = "SELECT count(*), sum(clicks)::int8, count(*) FILTER (WHERE clicks = 2)
                  FROM click_totals";
    let row = p.client.query_one(totals, &[]).await.unwrap();
    let (keys, clicks, twice): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(
        (keys, clicks, twice),
        (CODES as i64, sent as i64, AGAIN as i64),
        "keys, clicks, keys clicked twice"
    );
}
