//! Breakdowns (migration 14): a version-1 sender and a version-2 sender into one collector,
//! every click in `clicks` and `click_totals`, and `click_breakdown` exact against the clicks
//! sent (version-1 clicks under agent `unknown` only, version-2 clicks under each dimension
//! they carry) while their lists wait, once a fold moved them into `click_breakdown_counts`,
//! and once retention deleted an old day's.

use std::collections::BTreeMap;
use std::sync::Arc;

use collector::upkeep::maintenance;
use collector::upkeep::Metrics;
use nix::sys::signal::Signal;
use protocol::dimensions::{Agent, Country, Device, Dimensions};
mod support;

use support::*;
use testkit::collector::*;
use testkit::pgtest;

const DAY_US: i64 = 86_400_000_000;

/// Clicks per (code, days since 1970-01-01 UTC, dimension, value).
type Breakdown = BTreeMap<(String, i32, String, String), i64>;

/// `n` clicks from `start_us`, `step_us` apart, over seven codes, with every agent a sender
/// classifies and each other dimension sometimes absent, sometimes one of several values (a
/// referrer sometimes empty: a request without a usable `Referer`).
fn dimensioned(n: usize, start_us: i64, step_us: i64) -> Vec<DimensionedClick> {
    let referrers = [None, Some(""), Some("news.example.com"), Some("t.co")];
    let devices = [
        None,
        Some(Device::Desktop),
        Some(Device::Mobile),
        Some(Device::Tablet),
        Some(Device::Other),
    ];
    let countries = [None, Some(&b"DE"[..]), Some(b"US"), Some(b"JP")];
    (0..n)
        .map(|i| {
            let dimensions = Dimensions {
                agent: [Agent::Human, Agent::Bot, Agent::Preview][i % 3],
                referrer: referrers[(i / 2) % 4],
                device: devices[i % 5],
                country: countries[(i / 3) % 4].and_then(Country::parse),
            };
            let code = format!("k{}", (i * 31) % 7);
            (code, start_us + i as i64 * step_us, dimensions)
        })
        .collect()
}

/// What `click_breakdown` must hold for clicks sent at `version`: a version-1 click under agent
/// `unknown` alone, whatever its sender knew; a version-2 click under each dimension it
/// carries, an empty referrer as `(none)`.
fn expected(into: &mut Breakdown, version: u8, clicks: &[DimensionedClick]) {
    for (code, at, d) in clicks {
        let day = at.div_euclid(DAY_US) as i32;
        let values: Vec<(&str, &str)> = if version == 1 {
            vec![("agent", "unknown")]
        } else {
            d.values().map(|(dim, v)| (dim.as_str(), v)).collect()
        };
        for (dimension, value) in values {
            let key = (code.clone(), day, dimension.to_owned(), value.to_owned());
            *into.entry(key).or_default() += 1;
        }
    }
}

/// `source` (the view click_breakdown, or the table click_breakdown_counts) as [`Breakdown`].
async fn breakdown(client: &tokio_postgres::Client, source: &str) -> Breakdown {
    let sql =
        format!("SELECT code, (day - date '1970-01-01'), dimension, value, clicks FROM {source}");
    let rows = client.query(&sql, &[]).await.unwrap();
    rows.iter()
        .map(|r| ((r.get(0), r.get(1), r.get(2), r.get(3)), r.get(4)))
        .collect()
}

/// What of `b` the tables store: all but the agent `human`, which the view derives.
fn stored(b: &Breakdown) -> Breakdown {
    let human = |k: &(String, i32, String, String)| k.2 == "agent" && k.3 == "human";
    b.iter()
        .filter(|(k, _)| !human(k))
        .map(|(k, n)| (k.clone(), *n))
        .collect()
}

fn plain(clicks: &[DimensionedClick]) -> Vec<(String, i64)> {
    clicks.iter().map(|(c, at, _)| (c.clone(), *at)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_and_a_version_2_sender_are_exact_in_clicks_totals_and_breakdowns() {
    let p = place().await;
    // No fold while the lists are checked: the look finds nothing due for an hour.
    let mut c = start_collector(&p.db, &p.path, &["--compact-interval", "1h"]).await;
    // Across yesterday's UTC midnight; the version-1 clicks carry dimensions their encoder
    // leaves out.
    let old = dimensioned(3_000, start_us(), 1_000_003);
    let new = dimensioned(4_000, start_us() + 7, 999_997);
    let (old_grams, new_grams) = (datagrams_with(1, 0xa1, &old), datagrams_with(2, 0xb2, &new));
    assert!(old_grams.len() > 1 && new_grams.len() > 1);
    assert!(old_grams.iter().all(|g| g[0] == 1) && new_grams.iter().all(|g| g[0] == 2));
    // Interleaved, so that batches hold both.
    let mut grams = Vec::new();
    for i in 0..old_grams.len().max(new_grams.len()) {
        grams.extend(old_grams.get(i).cloned());
        grams.extend(new_grams.get(i).cloned());
    }
    send_all(&p.path, grams).await;
    await_rows(&p.client, None, 7_000).await;

    let mut sent = plain(&old);
    sent.extend(plain(&new));
    let totals_sent = expected_totals(&sent);
    sent.sort();
    assert_eq!(stored_clicks(&p.client).await, sent);
    assert_eq!(totals(&p.client, "click_totals").await, totals_sent);
    let mut want = Breakdown::new();
    expected(&mut want, 1, &old);
    expected(&mut want, 2, &new);
    // The test covers what it claims: each dimension, the empty referrer, both midnights' days.
    for (dimension, value) in [
        ("agent", "unknown"),
        ("agent", "human"),
        ("agent", "bot"),
        ("agent", "preview"),
        ("referrer", "(none)"),
        ("referrer", "t.co"),
        ("device", "tablet"),
        ("device", "other"),
        ("country", "JP"),
    ] {
        assert!(
            want.keys().any(|k| k.2 == dimension && k.3 == value),
            "{dimension} {value}"
        );
    }
    let days: std::collections::BTreeSet<i32> = want.keys().map(|k| k.1).collect();
    assert_eq!(days.len(), 2, "{days:?}");
    let unknown: i64 = want
        .iter()
        .filter(|(k, _)| k.3 == "unknown")
        .map(|(_, n)| n)
        .sum();
    assert_eq!(unknown, 3_000, "every version-1 click, and only those");

    let lists = "SELECT count(*) FROM click_breakdown_lists";
    assert!(count(&p.client, lists).await > 0, "not folded yet");
    assert_eq!(
        count(&p.client, "SELECT count(*) FROM click_breakdown_counts").await,
        0
    );
    assert_eq!(breakdown(&p.client, "click_breakdown").await, want);

    // A collector with a short interval folds the lists the last one left.
    c.service.signal(Signal::SIGTERM);
    assert!(c.service.wait_exit(LIMIT).await.success());
    let c = start_collector(&p.db, &p.path, &["--compact-interval", "1s"]).await;
    testkit::eventually("the breakdown lists folded", LIMIT, || async {
        (count(&p.client, lists).await == 0).then_some(())
    })
    .await;
    assert_eq!(
        breakdown(&p.client, "click_breakdown_counts").await,
        stored(&want)
    );
    assert_eq!(breakdown(&p.client, "click_breakdown").await, want);
    assert_eq!(totals(&p.client, "click_totals").await, totals_sent);
    // Counted once the fold's commit returned, a moment after the lists were seen gone.
    testkit::eventually("the fold counted", LIMIT, || async {
        (c.metric("collector_compactions_total").await >= 1.0).then_some(())
    })
    .await;
}

/// Retention deletes the breakdowns of the days whose partitions it drops, folded or not yet
/// folded, but the agent's (as click_totals keeps every day), and keeps the others exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_an_old_days_breakdowns_and_keeps_the_rest_exact() {
    let db = pgtest::test_db().await;
    let mut client = pgtest::connect(&db.url).await;
    let metrics = Metrics::default();
    // Ten days ago, the collector made that day's partitions; clicks landed there.
    let now = protocol::now_us();
    let then = now - now.rem_euclid(DAY_US) - 10 * DAY_US + 3_600_000_000;
    maintenance::keep_partitions(&client, &policy(None), &metrics, then)
        .await
        .unwrap();
    let (mut handoff, own) =
        writer_with_sums(&db.url, "retention", LIMIT, Arc::new(Counted::default())).await;
    let old = dimensioned(1_000, then, 1_000);
    let recent = dimensioned(1_500, start_us(), 1_000_000);
    write(&mut handoff, batch_of(&datagrams_with(2, 6, &old[..600]))).await;
    write(&mut handoff, batch_of(&datagrams_with(2, 7, &recent))).await;
    // Part of the old day folded before retention, part still in lists.
    fold_all(&mut client, &own).await.unwrap();
    write(&mut handoff, batch_of(&datagrams_with(2, 8, &old[600..]))).await;
    let mut all = Breakdown::new();
    expected(&mut all, 2, &old);
    expected(&mut all, 2, &recent);
    assert_eq!(breakdown(&client, "click_breakdown").await, all);
    let old_lists = "SELECT count(*) FROM click_breakdown_lists WHERE day < current_date - 5";
    assert!(count(&client, old_lists).await > 0);

    maintenance::keep_partitions(&client, &policy(Some(3)), &metrics, now)
        .await
        .unwrap();
    let mut kept = Breakdown::new();
    expected(&mut kept, 2, &recent);
    let mut old_day = Breakdown::new();
    expected(&mut old_day, 2, &old);
    kept.extend(old_day.into_iter().filter(|(k, _)| k.2 == "agent"));
    assert_eq!(breakdown(&client, "click_breakdown").await, kept);
    fold_all(&mut client, &own).await.unwrap();
    assert_eq!(
        breakdown(&client, "click_breakdown_counts").await,
        stored(&kept)
    );
    assert_eq!(breakdown(&client, "click_breakdown").await, kept);
    let mut sent = plain(&old);
    sent.extend(plain(&recent));
    assert_eq!(
        totals(&client, "click_totals").await,
        expected_totals(&sent),
        "totals keep every day"
    );
}

/// Breakdown lists alone make a fold due: here a stopped collector's, with no count waiting
/// that would make it due by the totals' rule. While their folds fail (here
/// `click_breakdown_counts` refuses every row) the backlog's gauges show them: the totals'
/// gauges count none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breakdown_lists_alone_make_a_fold_due() {
    let p = place().await;
    // Ready first: a round that fails makes /healthz say 503.
    let c = start_collector(&p.db, &p.path, &["--compact-interval", "1s"]).await;
    p.client
        .batch_execute(
            "ALTER TABLE click_breakdown_counts ADD CONSTRAINT refuse_all CHECK (false) NOT VALID;
             INSERT INTO click_breakdown_lists
                 (day, dimension, entries, code_list, value_list, count_list, writer, batch,
                  written_at)
             VALUES ('2026-01-01', 'referrer', 2, 'a b', 't.co (none)', '3 4', 77, 1,
                     now() - interval '1 minute'),
                    ('2026-01-01', 'agent', 1, 'a', 'bot', '5', 77, 1, now())",
        )
        .await
        .unwrap();
    c.await_metric("collector_breakdowns_pending", 3.0).await;
    assert!(c.metric("collector_breakdowns_oldest_seconds").await >= 60.0);
    assert_eq!(c.metric("collector_deltas_pending").await, 0.0);
    testkit::eventually("a fold refused", LIMIT, || async {
        (c.metric("collector_db_errors_total").await > 0.0).then_some(())
    })
    .await;
    p.client
        .batch_execute("ALTER TABLE click_breakdown_counts DROP CONSTRAINT refuse_all")
        .await
        .unwrap();
    let lists = "SELECT count(*) FROM click_breakdown_lists";
    testkit::eventually("the breakdown lists folded", LIMIT, || async {
        (count(&p.client, lists).await == 0).then_some(())
    })
    .await;
    let jan1 = 20_454; // 2026-01-01, in days since 1970-01-01
    let row = |code: &str, dimension: &str, value: &str, n| {
        let key = (
            code.to_owned(),
            jan1,
            dimension.to_owned(),
            value.to_owned(),
        );
        (key, n)
    };
    let want = Breakdown::from([
        row("a", "agent", "bot", 5),
        row("a", "referrer", "t.co", 3),
        row("b", "referrer", "(none)", 4),
    ]);
    assert_eq!(breakdown(&p.client, "click_breakdown_counts").await, want);
    testkit::eventually("the breakdown gauges back to 0", LIMIT, || async {
        let pending = c.metric("collector_breakdowns_pending").await;
        let oldest = c.metric("collector_breakdowns_oldest_seconds").await;
        (pending == 0.0 && oldest == 0.0).then_some(())
    })
    .await;
}
