//! What each link says of its redirect, through the real binaries: its status and the caching
//! headers that fit it, the request's query merged into its URL unless it opts out, and its
//! expiry (410 Gone, no click).

use hyper::Method;
use testkit::db::await_rows_settled;
use testkit::redirector::{collector_with, fixture, redirector, rows, LIMIT};

/// `method path`: the status, the `Location` (empty if none) and the `Cache-Control`.
async fn ask(http: std::net::SocketAddr, method: Method, path: &str) -> (u16, String, String) {
    let response = testkit::http::request(http, method, path)
        .await
        .expect("an answer");
    let header = |name| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    let (location, cache) = (header("location"), header("cache-control"));
    (response.status().as_u16(), location, cache)
}

#[tokio::test]
async fn each_link_redirects_with_its_status_its_query_forwarding_and_its_expiry() {
    let f = fixture(&[
        ("plain", "https://example.com/p"),
        ("own", "https://example.com/o?a=1#top"),
        ("optout", "https://example.com/x"),
        ("s301", "https://example.com/301"),
        ("s307", "https://example.com/307"),
        ("s308", "https://example.com/308"),
        ("gone", "https://example.com/gone"),
        ("later", "https://example.com/later"),
        ("soon301", "https://example.com/soon"),
        ("day308", "https://example.com/day"),
    ])
    .await;
    f.client
        .batch_execute(
            "UPDATE links SET forward_query = false WHERE code = 'optout';
             UPDATE links SET status = 301 WHERE code = 's301';
             UPDATE links SET status = 307 WHERE code = 's307';
             UPDATE links SET status = 308 WHERE code = 's308';
             UPDATE links SET expires_at = now() - interval '1 second' WHERE code = 'gone';
             UPDATE links SET expires_at = now() + interval '1 day' WHERE code = 'later';
             UPDATE links SET status = 301, expires_at = now() + interval '10 minutes'
              WHERE code = 'soon301';
             UPDATE links SET status = 308, expires_at = now() + interval '1 day'
              WHERE code = 'day308';",
        )
        .await
        .unwrap();
    let (_collector, collector_admin) = collector_with(&f.db.url, &f.socket, &[]).await;
    let r = redirector(&f.db.url, &f.socket, &[]).await;
    r.ready().await;

    let no_store = "no-store".to_owned();
    let cached = "private, max-age=3600".to_owned();
    let expected = [
        (
            "/plain?utm_source=mail&b=2",
            302,
            "https://example.com/p?utm_source=mail&b=2",
            &no_store,
        ),
        (
            "/own?a=9&utm_source=x",
            302,
            "https://example.com/o?a=1&utm_source=x#top",
            &no_store,
        ),
        (
            "/optout?utm_source=x",
            302,
            "https://example.com/x",
            &no_store,
        ),
        ("/s301", 301, "https://example.com/301", &cached),
        ("/s307?k=v", 307, "https://example.com/307?k=v", &no_store),
        ("/s308", 308, "https://example.com/308", &cached),
        ("/later", 302, "https://example.com/later", &no_store),
        ("/day308", 308, "https://example.com/day", &cached),
    ];
    for (path, status, location, cache) in expected {
        let got = ask(r.http, Method::GET, path).await;
        assert_eq!(
            got,
            (status, location.to_owned(), cache.clone()),
            "GET {path}"
        );
    }
    // A permanent redirect that expires within the hour is kept by browsers until then only:
    // not followed from their cache past its expiry.
    let (status, _, cache) = ask(r.http, Method::GET, "/soon301").await;
    assert_eq!(status, 301);
    let age: i64 = cache
        .strip_prefix("private, max-age=")
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("Cache-Control {cache:?}"));
    assert!(
        (1..=600).contains(&age),
        "max-age {age} for 10 minutes left"
    );
    for method in [Method::GET, Method::HEAD] {
        let got = ask(r.http, method.clone(), "/gone?x=1").await;
        assert_eq!(
            got,
            (410, String::new(), no_store.clone()),
            "{method} /gone"
        );
    }
    assert_eq!(r.metric("redirector_expired_total").await, 2.0);
    // A query that would make Location too long (here of a HEAD, not a click) is not forwarded.
    let long = format!("/plain?q={}", "x".repeat(5_000));
    let got = ask(r.http, Method::HEAD, &long).await;
    assert_eq!(
        got,
        (302, "https://example.com/p".to_owned(), no_store.clone())
    );
    assert_eq!(r.metric("redirector_query_not_forwarded_total").await, 1.0);

    // Every redirect is a click; the expired link's requests are none.
    await_rows_settled(
        &f.client,
        None,
        expected.len() as u64 + 1,
        &[r.admin, collector_admin],
    )
    .await;
    assert_eq!(rows(&f.client, Some("gone")).await, 0);

    // A link that expires while served answers 410 once the change reaches the redirector.
    f.client
        .batch_execute("UPDATE links SET expires_at = now() WHERE code = 'later'")
        .await
        .unwrap();
    testkit::eventually("the expired link to answer 410", LIMIT, || async {
        (ask(r.http, Method::GET, "/later").await.0 == 410).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_status_outside_the_four_is_refused_by_the_table() {
    let f = fixture(&[("x", "https://example.com/")]).await;
    let err = f
        .client
        .batch_execute("UPDATE links SET status = 303 WHERE code = 'x'")
        .await
        .unwrap_err();
    assert!(
        err.as_db_error()
            .is_some_and(|e| e.constraint() == Some("links_status_redirect")),
        "{err:?}"
    );
}
