//! The database fails over: a primary and a streaming standby (`testkit::pgtest::Pair`), the
//! real binaries, and what each replication mode keeps of the clicks and the links. Also a
//! redirector that reads its links from the standby.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hyper::Method;
use testkit::eventually;
use testkit::pgtest::{test_db_on, Pair, Replication};
use testkit::redirector::{add_link, redirector, LIMIT};

/// What `GET /code` answers: `Some(location)` for a redirect, `None` for 404.
async fn served(http: SocketAddr, code: &str) -> Option<String> {
    let response = testkit::http::request(http, Method::GET, &format!("/{code}"))
        .await
        .expect("an answer");
    match response.status().as_u16() {
        302 => Some(response.headers()["location"].to_str().unwrap().to_owned()),
        404 => None,
        other => panic!("GET /{code} answered {other}"),
    }
}

/// Waits until `code` answers `want`; returns how long that took.
async fn await_served(http: SocketAddr, code: &str, want: Option<&str>) -> Duration {
    let start = Instant::now();
    let what = format!("/{code} to answer {want:?}");
    eventually(&what, LIMIT, || async {
        (served(http, code).await.as_deref() == want).then_some(())
    })
    .await;
    start.elapsed()
}

async fn execute(db: &tokio_postgres::Client, sql: &str) {
    db.batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {}", shared::db::describe(&e)));
}

#[tokio::test]
async fn a_redirector_reading_links_from_a_hot_standby_serves_changes_made_on_the_primary() {
    let pair = Pair::start(Replication::Asynchronous).await;
    let db = test_db_on(&pair.primary).await;
    let primary = testkit::pgtest::connect(&db.url).await;
    add_link(&primary, "before", "https://example.com/before").await;
    pair.await_replayed().await;
    let dir = tempfile::tempdir().unwrap();
    let on_standby = pair.standby.url(&db.name);
    let r = redirector(
        &db.url,
        &dir.path().join("collector.sock"),
        &["--clicks", "off", "--links-database-url", &on_standby],
    )
    .await;
    r.ready().await;
    r.service
        .wait_for_log("the links database is a hot standby", LIMIT)
        .await;
    assert_eq!(
        served(r.http, "before").await.as_deref(),
        Some("https://example.com/before")
    );
    let standby = testkit::pgtest::connect(&on_standby).await;
    let sessions = testkit::pgtest::strings(
        &standby,
        "SELECT application_name FROM pg_stat_activity WHERE application_name = 'redirector-links'",
    )
    .await;
    assert_eq!(sessions.len(), 1, "the loader reads from the standby");

    add_link(&primary, "added", "https://example.com/added").await;
    let insert = await_served(r.http, "added", Some("https://example.com/added")).await;
    execute(
        &primary,
        "UPDATE links SET url = 'https://example.com/moved' WHERE code = 'before'",
    )
    .await;
    let update = await_served(r.http, "before", Some("https://example.com/moved")).await;
    execute(&primary, "DELETE FROM links WHERE code = 'added'").await;
    let delete = await_served(r.http, "added", None).await;
    // The standby is polled every --reload-interval (1 s) and replicates within milliseconds
    // here: far less than this.
    for (what, took) in [("insert", insert), ("update", update), ("delete", delete)] {
        assert!(
            took < Duration::from_secs(5),
            "the {what} took {took:?} to be served"
        );
    }
    eprintln!("links from a hot standby: insert {insert:?}, update {update:?}, delete {delete:?}");
}
