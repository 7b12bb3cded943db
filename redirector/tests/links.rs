//! The link table follows the database without a restart, and survives losing it.

use hyper::Method;
use testkit::eventually;
use testkit::pgtest;
use testkit::redirector::{
    add_link, add_link_predating_check, fixture, fixture_on, redirector, scalar, LIMIT,
};

/// Waits until `GET /code` answers `status` (and, for a redirect, `location`).
async fn await_answer(http: std::net::SocketAddr, code: &str, status: u16, location: &str) {
    let what = format!("GET /{code} to answer {status} {location}");
    eventually(&what, LIMIT, || async {
        let response = testkit::http::request(http, Method::GET, &format!("/{code}"))
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
        testkit::http::request(r.http, Method::GET, "/fresh")
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
    let admin = testkit::redirector::cut_off(&f, &r).await;
    let response = testkit::http::request(r.http, Method::GET, "/steady")
        .await
        .expect("an answer");
    assert_eq!(response.status(), 302, "the last table is still served");

    testkit::redirector::let_back(&f, &admin).await;
    let allowed_at = testkit::redirector::db_now(&admin).await;
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
    let fresh = testkit::pgtest::connect(&f.db.url).await;
    add_link(&fresh, "after", "https://example.com/after").await;
    // The poll is an hour, far longer than the wait: only the re-established LISTEN can
    // deliver this change in time.
    await_answer(r.http, "after", 302, "https://example.com/after").await;
}

/// A column the loader cannot decode (its type changed by an operator) fails the read, which
/// is counted and retried while the last table is served; once it decodes again the loader
/// goes on. Its thread once panicked there, and followed nothing more.
#[tokio::test]
async fn a_column_that_does_not_decode_fails_the_read_and_the_loader_goes_on() {
    let f = fixture(&[("steady", "https://example.com/steady")]).await;
    let r = redirector(&f.db.url, &f.socket, &[]).await;
    r.ready().await;
    let retype = |to: &str| format!("ALTER TABLE links ALTER COLUMN forward_query TYPE {to}");
    f.client.batch_execute(&retype("text")).await.unwrap();
    let moved = "UPDATE links SET url = 'https://example.com/moved' WHERE code = 'steady'";
    f.client.batch_execute(moved).await.unwrap();
    // The first read fails on its statement prepared for the old type; those of the new
    // sessions after it, on decoding the column.
    eventually("reads that failed to decode, counted", LIMIT, || async {
        let errors = r.metric("redirector_link_load_errors_total").await;
        (errors >= 3.0).then_some(())
    })
    .await;
    await_answer(r.http, "steady", 302, "https://example.com/steady").await;
    let back = format!("{} USING forward_query::boolean", retype("boolean"));
    f.client.batch_execute(&back).await.unwrap();
    await_answer(r.http, "steady", 302, "https://example.com/moved").await;
}

/// In a `SQL_ASCII` database a URL need not be UTF-8. Such a row is skipped and counted, in a
/// full load and in a read of changes, and the changes beside it are followed: once, one such
/// row failed every read that met it, and no change was followed again.
#[tokio::test]
async fn a_url_that_is_not_utf8_is_skipped_and_the_changes_beside_it_followed() {
    let sql_ascii = "TEMPLATE template0 ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C'";
    let db = pgtest::migrated(pgtest::cluster().fresh_database_with(sql_ascii).await).await;
    let f = fixture_on(db, &[("good", "https://example.com/good")]).await;
    let latin1 = |code: &str| {
        format!("INSERT INTO links (code, url) VALUES ('{code}', E'https://example.com/caf\\xe9')")
    };
    f.client.batch_execute(&latin1("loaded")).await.unwrap();
    let r = redirector(&f.db.url, &f.socket, &["--reload-interval", "1h"]).await;
    r.ready().await;
    assert_eq!(r.metric("redirector_links").await, 1.0);
    assert_eq!(r.metric("redirector_links_skipped").await, 1.0);

    let fresh = "INSERT INTO links (code, url) VALUES ('fresh', 'https://example.com/fresh')";
    let changes = format!("BEGIN; {}; {fresh}; COMMIT", latin1("changed"));
    f.client.batch_execute(&changes).await.unwrap();
    await_answer(r.http, "fresh", 302, "https://example.com/fresh").await;
    assert_eq!(r.metric("redirector_links_skipped").await, 2.0);
    for code in ["loaded", "changed"] {
        await_answer(r.http, code, 404, "").await;
    }
    let fixed = "UPDATE links SET url = 'https://example.com/cafe' WHERE code = 'changed'";
    f.client.batch_execute(fixed).await.unwrap();
    await_answer(r.http, "changed", 302, "https://example.com/cafe").await;
    assert_eq!(r.metric("redirector_links_skipped").await, 1.0);
    assert_eq!(r.metric("redirector_link_load_errors_total").await, 0.0);
    assert!(r
        .service
        .log()
        .iter()
        .any(|l| l.contains("URL is not UTF-8")));
}

#[tokio::test]
async fn rows_from_before_the_url_check_are_skipped_and_counted() {
    // Rows links_url_clean (migration 7) would refuse, written before it: a control
    // character, a tab, one byte over 2,048. The redirector's rule is the CHECK's.
    let f = fixture(&[("good", "https://example.com/good")]).await;
    let long = format!("https://example.com/{}", "x".repeat(2049 - 20));
    assert_eq!(long.len(), 2049);
    for (code, url) in [
        ("broken", "https://example.com/a\nb"),
        ("tabbed", "https://example.com/a\tb"),
        ("long", long.as_str()),
    ] {
        add_link_predating_check(&f.client, code, url).await;
    }
    let r = redirector(&f.db.url, &f.socket, &[]).await;
    r.ready().await;
    assert_eq!(r.metric("redirector_links").await, 1.0);
    assert_eq!(r.metric("redirector_links_skipped").await, 3.0);
    for code in ["broken", "tabbed", "long"] {
        let path = format!("/{code}");
        let status = testkit::http::request(r.http, Method::GET, &path)
            .await
            .expect("an answer")
            .status();
        assert_eq!(status, 404, "{code} must not be served");
    }
    assert_eq!(
        testkit::http::request(r.http, Method::GET, "/good")
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

#[tokio::test]
async fn a_change_beyond_a_reads_horizon_is_applied_once_it_commits() {
    let f = fixture(&[]).await;
    // Only notifications wake the loader: each read below is the one a commit caused.
    let r = redirector(&f.db.url, &f.socket, &["--reload-interval", "1h"]).await;
    r.ready().await;
    let insert = "INSERT INTO links (code, url) VALUES ($1, 'https://example.com/' || $1)";
    // A transaction that completes elsewhere in the cluster can widen the read's horizon and
    // spoil the case: then try again, with new codes.
    for attempt in 0..20 {
        let (older, newer) = (format!("older{attempt}"), format!("newer{attempt}"));
        let mut older_db = testkit::pgtest::connect(&f.db.url).await;
        let mut newer_db = testkit::pgtest::connect(&f.db.url).await;
        // `older` takes its transaction id first; `newer` a higher one but the lower change id.
        let older_tx = older_db.transaction().await.unwrap();
        older_tx
            .execute("SELECT pg_current_xact_id()", &[])
            .await
            .unwrap();
        let newer_tx = newer_db.transaction().await.unwrap();
        let newer_xid: i64 = newer_tx
            .query_one("SELECT pg_current_xact_id()::text::bigint", &[])
            .await
            .unwrap()
            .get(0);
        newer_tx.execute(insert, &[&newer]).await.unwrap();
        older_tx.execute(insert, &[&older]).await.unwrap();
        older_tx.commit().await.unwrap();
        let url = |code: &str| format!("https://example.com/{code}");
        await_answer(r.http, &older, 302, &url(&older)).await;
        // The horizon now; the read that served `older` came before, so its was no wider.
        let sql = "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint";
        let xmax: i64 = scalar(&f.client, sql).await;
        newer_tx.commit().await.unwrap();
        await_answer(r.http, &newer, 302, &url(&newer)).await;
        if xmax <= newer_xid {
            return;
        }
    }
    panic!("in no attempt did a read leave the newer transaction beyond its horizon");
}
