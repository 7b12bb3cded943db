//! Who followed a link, and from where, through the real binaries into `click_breakdown`:
//! the agent of every click (human, bot, preview), and the referrer host, device class and
//! country a redirector records with `--dimensions`; no address and no user agent stored.

use std::collections::BTreeMap;

use hyper::Method;
use testkit::db::await_rows_settled;
use testkit::redirector::{collector_with, fixture, redirector, Fixture, Redirector};

const CHROME_DESKTOP: &str = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 \
    (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36";
const SAFARI_IPHONE: &str = "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) \
    AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Mobile/15E148 Safari/604.1";
const GOOGLEBOT: &str = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)";
const SLACK: &str = "Slackbot-LinkExpanding 1.0 (+https://api.slack.com/robots)";

/// The clicks sent, each as its request headers, and how many times.
fn clicks() -> Vec<(Vec<(&'static str, &'static str)>, usize)> {
    let news = ("referer", "https://News.Example.com/item?id=1");
    vec![
        (
            vec![("user-agent", CHROME_DESKTOP), news, ("x-country", "de")],
            3,
        ),
        (vec![("user-agent", SAFARI_IPHONE), ("x-country", "US")], 2),
        // A malformed country: left out, and counted.
        (vec![("user-agent", GOOGLEBOT), ("x-country", "XX")], 1),
        (vec![("user-agent", SLACK)], 1),
        (
            vec![("user-agent", CHROME_DESKTOP), ("sec-purpose", "prefetch")],
            1,
        ),
    ]
}

async fn send_clicks(r: &Redirector, code: &str) -> u64 {
    let mut sent = 0;
    for (headers, times) in clicks() {
        for _ in 0..times {
            let response =
                testkit::http::request_with(r.http, Method::GET, &format!("/{code}"), &headers)
                    .await
                    .expect("an answer");
            assert_eq!(response.status(), 302, "{headers:?}");
            sent += 1;
        }
    }
    sent
}

/// `click_breakdown` of `code`: clicks per (dimension, value).
async fn breakdown(db: &tokio_postgres::Client, code: &str) -> BTreeMap<(String, String), i64> {
    let rows = db
        .query(
            "SELECT dimension, value, clicks FROM click_breakdown WHERE code = $1",
            &[&code],
        )
        .await
        .unwrap();
    rows.iter()
        .map(|r| ((r.get(0), r.get(1)), r.get(2)))
        .collect()
}

fn expect(pairs: &[(&str, &str, i64)]) -> BTreeMap<(String, String), i64> {
    pairs
        .iter()
        .map(|&(d, v, n)| ((d.to_owned(), v.to_owned()), n))
        .collect()
}

/// A collector and a redirector with `flags` on a fresh database with the link `b`; the
/// clicks of [`clicks`] sent to `b` and written: the fixture, the redirector, how many.
async fn clicks_through(flags: &[&str]) -> (Fixture, Redirector, u64) {
    let f = fixture(&[("b", "https://example.com/b")]).await;
    let (collector, collector_admin) = collector_with(&f.db.url, &f.socket, &[]).await;
    let r = redirector(&f.db.url, &f.socket, flags).await;
    r.ready().await;
    let sent = send_clicks(&r, "b").await;
    await_rows_settled(&f.client, Some("b"), sent, &[r.admin, collector_admin]).await;
    drop(collector);
    (f, r, sent)
}

/// Every dimension recorded, the country from the header [`clicks`] sends.
const DIMENSIONS: [&str; 4] = [
    "--dimensions",
    "referrer,device,country",
    "--country-header",
    "X-Country",
];

/// The breakdown of [`clicks`] with [`DIMENSIONS`].
fn every_dimension() -> BTreeMap<(String, String), i64> {
    expect(&[
        ("agent", "human", 5),
        ("agent", "bot", 1),
        ("agent", "preview", 2),
        ("referrer", "news.example.com", 3),
        ("referrer", "(none)", 5),
        ("device", "desktop", 3),
        ("device", "mobile", 2),
        ("device", "other", 3),
        ("country", "DE", 3),
        ("country", "US", 2),
    ])
}

#[tokio::test]
async fn every_dimension_lands_in_click_breakdown_exactly() {
    let (f, r, sent) = clicks_through(&DIMENSIONS).await;
    assert_eq!(breakdown(&f.client, "b").await, every_dimension());
    assert_eq!(r.metric("redirector_country_invalid_total").await, 1.0);
    // Slack's fetch and the prefetch came without the header.
    assert_eq!(r.metric("redirector_country_missing_total").await, 2.0);
    let by_agent = |agent| format!("redirector_redirects_by_agent_total{{agent=\"{agent}\"}}");
    assert_eq!(r.metric(&by_agent("human")).await, 5.0);
    assert_eq!(r.metric(&by_agent("preview")).await, 2.0);
    let total: i64 = f
        .client
        .query_one(
            "SELECT sum(clicks)::int8 FROM click_totals WHERE code = 'b'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        total as u64, sent,
        "click_totals counts bots and previews too"
    );
}

#[tokio::test]
async fn the_dimensions_of_clicks_in_the_state_region_outlive_a_kill_of_the_redirector() {
    let f = fixture(&[("b", "https://example.com/b")]).await;
    let state = f.socket.with_file_name("redirector.state");
    let flags = [&DIMENSIONS[..], &["--state-file", state.to_str().unwrap()]].concat();
    // No collector yet: the clicks stay in the ring and the resend window.
    let mut r = redirector(&f.db.url, &f.socket, &flags).await;
    r.ready().await;
    let sent = send_clicks(&r, "b").await;
    r.kill().await;

    let (_collector, collector_admin) = collector_with(&f.db.url, &f.socket, &[]).await;
    let r = redirector(&f.db.url, &f.socket, &flags).await;
    r.ready().await;
    await_rows_settled(&f.client, Some("b"), sent, &[r.admin, collector_admin]).await;
    let recovered = r.metric("redirector_clicks_recovered_total").await;
    assert_eq!(
        recovered, sent as f64,
        "clicks adopted from the state region"
    );
    assert_eq!(breakdown(&f.client, "b").await, every_dimension());
}

#[tokio::test]
async fn without_dimensions_only_the_agent_is_recorded() {
    let (f, r, _) = clicks_through(&[]).await;
    assert_eq!(
        breakdown(&f.client, "b").await,
        expect(&[
            ("agent", "human", 5),
            ("agent", "bot", 1),
            ("agent", "preview", 2)
        ])
    );
    assert_eq!(r.metric("redirector_country_invalid_total").await, 0.0);
    assert_eq!(
        r.metric("redirector_country_missing_total").await,
        0.0,
        "not recorded, so not missing"
    );
}
