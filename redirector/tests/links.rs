//! The link table follows the database without a restart, and survives losing it.

use hyper::Method;
use redirector::testkit::{add_link, fixture, redirector, LIMIT};
use shared::testkit::eventually;

/// Waits until `GET /code` answers `status` (and, for a redirect, `location`).
async fn await_answer(http: std::net::SocketAddr, code: &str, status: u16, location: &str) {
    let what = format!("GET /{code} to answer {status} {location}");
    eventually(&what, LIMIT, || async {
        let response = shared::testkit::http::request(http, Method::GET, &format!("/{code}"))
            .await
            .expect("an answer");
        let got = response
            .headers()
            .get("location")
            .map_or("", |v| v.to_str().unwrap_or_default());
        (response.status() == status && got == location).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_link_changed_with_sql_is_served_on_its_notification() {
    let f = fixture(&[]).await;
    // A periodic reload far longer than any wait here: only the notification can deliver
    // each change in time.
    let r = redirector(&f.db.url, &f.socket, &["--reload-interval", "1h"]).await;
    r.ready().await;
    assert_eq!(
        shared::testkit::http::request(r.http, Method::GET, "/fresh")
            .await
            .expect("an answer")
            .status(),
        404
    );

    add_link(&f.client, "fresh", "https://example.com/fresh").await;
    await_answer(r.http, "fresh", 302, "https://example.com/fresh").await;

    f.client
        .execute(
            "UPDATE links SET url = 'https://example.com/moved' WHERE code = 'fresh'",
            &[],
        )
        .await
        .unwrap();
    await_answer(r.http, "fresh", 302, "https://example.com/moved").await;

    f.client
        .execute("DELETE FROM links WHERE code = 'fresh'", &[])
        .await
        .unwrap();
    await_answer(r.http, "fresh", 404, "").await;
}

#[tokio::test]
async fn keeps_serving_while_the_database_connection_is_lost_and_reconnects() {
    let f = fixture(&[("steady", "https://example.com/steady")]).await;
    let r = redirector(&f.db.url, &f.socket, &["--reload-interval", "1h"]).await;
    r.ready().await;

    // Cut the redirector's session from the server side, and refuse new ones for a while.
    let admin = redirector::testkit::cut_off(&f, &r).await;
    let response = shared::testkit::http::request(r.http, Method::GET, "/steady")
        .await
        .expect("an answer");
    assert_eq!(response.status(), 302, "the last table is still served");

    redirector::testkit::let_back(&f, &admin).await;
    let allowed_at = redirector::testkit::db_now(&admin).await;
    // Reconnected: a read of the change log after connections were allowed again. A new
    // session reads once at its start, so only now does a change test the notification.
    eventually(
        "a read of the change log after reconnecting",
        LIMIT,
        || async {
            let synced = r.metric("redirector_links_synced_timestamp_seconds").await;
            (synced > allowed_at).then_some(())
        },
    )
    .await;
    let fresh = shared::pgtest::connect(&f.db.url).await;
    add_link(&fresh, "after", "https://example.com/after").await;
    // The poll is an hour, far longer than the wait: only the re-established LISTEN can
    // deliver this change in time.
    await_answer(r.http, "after", 302, "https://example.com/after").await;
}

#[tokio::test]
async fn rows_with_an_unusable_url_are_skipped_and_counted() {
    // Passes the table's CHECK, but a newline cannot go in a Location header.
    let f = fixture(&[
        ("good", "https://example.com/good"),
        ("broken", "https://example.com/a\nb"),
    ])
    .await;
    let r = redirector(&f.db.url, &f.socket, &[]).await;
    r.ready().await;
    assert_eq!(r.metric("redirector_links").await, 1.0);
    assert_eq!(r.metric("redirector_links_skipped").await, 1.0);
    assert_eq!(
        shared::testkit::http::request(r.http, Method::GET, "/broken")
            .await
            .expect("an answer")
            .status(),
        404
    );
    assert_eq!(
        shared::testkit::http::request(r.http, Method::GET, "/good")
            .await
            .expect("an answer")
            .status(),
        302
    );
    assert!(r
        .service
        .log()
        .iter()
        .any(|l| l.contains("skipping link \"broken\"")));
}
