//! Reading the clicks back.

use std::net::SocketAddr;
use std::sync::Mutex;

use super::{eventually, http, LIMIT};

/// Rows in `clicks` for `code`, or for every code if `None`.
pub async fn rows(client: &tokio_postgres::Client, code: Option<&str>) -> u64 {
    let sql = "SELECT count(*) FROM clicks WHERE $1::text IS NULL OR code = $1";
    let row = client
        .query_one(sql, &[&code])
        .await
        .unwrap_or_else(|e| panic!("counting clicks: {}", shared::db::describe(&e)));
    row.get::<_, i64>(0) as u64
}

/// Waits until `clicks` holds `expected` rows for `code` (every code if `None`), and checks it
/// holds no more: more rows than clicks sent is a duplicate. It returns as soon as the count
/// is reached: a duplicate that arrives a moment later goes unseen; [`await_rows_settled`]
/// waits for it.
pub async fn await_rows(client: &tokio_postgres::Client, code: Option<&str>, expected: u64) {
    let what = format!("{expected} rows in clicks for {code:?}");
    let got = eventually(&what, LIMIT, || async {
        let n = rows(client, code).await;
        (n >= expected).then_some(n)
    })
    .await;
    assert_eq!(got, expected, "more rows in clicks than clicks sent");
}

/// [`await_rows`], and then that the count stays: waits until the pipeline is quiet and checks
/// that `clicks` still holds exactly `expected` rows for `code`, so that a click written twice
/// a moment later (a resend taken again) fails the test.
///
/// `admins` are the admin listeners of the services still running, redirectors and
/// collectors (told apart by their `/metrics`), at least one collector. Quiet is: on two
/// reads in a row, every redirector has nothing in its ring and nothing unacknowledged, every
/// collector has no click accepted and not committed, and neither read saw a datagram sent or
/// received that the other did not. A click the collector took before the second read is then
/// committed, and counted by the count that follows that read; one still to come would have
/// to be a datagram sent before the first read and still unread by an idle collector after
/// the second.
pub async fn await_rows_settled(
    client: &tokio_postgres::Client,
    code: Option<&str>,
    expected: u64,
    admins: &[SocketAddr],
) {
    await_rows(client, code, expected).await;
    let last = Mutex::new(None);
    let what = format!("the pipeline to be quiet with {expected} rows in clicks for {code:?}");
    eventually(&what, LIMIT, || async {
        let quiet = quiet(admins).await;
        let n = rows(client, code).await;
        assert!(
            n <= expected,
            "{n} rows in clicks for {code:?} once the pipeline settled, {expected} expected: \
             a click written twice"
        );
        let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
        let settled = quiet.is_some() && *last == quiet;
        *last = quiet;
        settled.then_some(())
    })
    .await;
    let n = rows(client, code).await;
    assert_eq!(
        n, expected,
        "rows in clicks for {code:?} once the pipeline settled"
    );
}

/// The datagrams each service of `admins` sent (redirectors: first sends, resends, resyncs) or
/// received (collectors), if every one of them is quiet (see [`await_rows_settled`]).
async fn quiet(admins: &[SocketAddr]) -> Option<Vec<f64>> {
    let mut traffic = Vec::with_capacity(admins.len());
    let mut collectors = 0;
    let mut quiet = true;
    for &admin in admins {
        let (status, body) = http::get(admin, "/metrics")
            .await
            .unwrap_or_else(|e| panic!("GET /metrics from {admin}: {e}"));
        assert_eq!(status, 200, "GET /metrics from {admin}: {body}");
        let sample = |series: &str| {
            shared::metrics::sample(&body, series)
                .unwrap_or_else(|| panic!("no {series} in the /metrics of {admin}:\n{body}"))
        };
        if body.contains("\nredirector_unacked_clicks ") {
            quiet &= sample("redirector_ring_depth") == 0.0;
            quiet &= sample("redirector_unacked_clicks") == 0.0;
            traffic.push(
                sample("redirector_datagrams_sent_total")
                    + sample("redirector_resends_total")
                    + sample("redirector_resyncs_total"),
            );
        } else if body.contains("\ncollector_pending_clicks ") {
            collectors += 1;
            quiet &= sample("collector_pending_clicks") == 0.0;
            traffic.push(sample("collector_datagrams_received_total"));
        } else {
            panic!(
                "{admin} is the admin listener of neither a redirector nor a collector:\n{body}"
            );
        }
    }
    assert!(
        collectors > 0,
        "await_rows_settled needs the collector's admin listener"
    );
    quiet.then_some(traffic)
}
