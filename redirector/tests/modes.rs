//! `--clicks off` records nothing; `--clicks direct` writes one row per redirect itself,
//! without a collector.

mod common;

use common::{fixture, load::Load, redirector, rows};

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
    let _collector = common::collector(&f.db.url, &f.socket).await;
    let r = redirector(&f.db.url, &f.socket, &["--clicks", "off"]).await;
    r.ready().await;
    let report = Load::get(r.http, "/quiet").run(2_000).await;
    assert_eq!(report.count(302), 2_000, "{report:?}");
    assert_eq!(r.metric("redirector_redirects_total").await, 2_000.0);
    assert_eq!(r.metric("redirector_clicks_queued_total").await, 0.0);
    assert_eq!(r.metric("redirector_clicks_sent_total").await, 0.0);
    assert_eq!(rows(&f.client, None).await, 0);
}
