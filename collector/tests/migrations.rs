//! The schema against a real PostgreSQL cluster from the test harness.

use collector::migrations;
use shared::pgtest;

/// Every table, view, function and trigger with its definition, to compare schemas.
const SCHEMA: &str = "
    SELECT string_agg(line, E'\n' ORDER BY line) FROM (
        SELECT format('%s.%s %s', table_name, column_name, data_type) AS line
          FROM information_schema.columns WHERE table_schema = 'public'
        UNION ALL SELECT 'view ' || pg_get_viewdef('click_totals'::regclass)
        UNION ALL SELECT 'check ' || conname || ' ' || pg_get_constraintdef(oid)
          FROM pg_constraint WHERE connamespace = 'public'::regnamespace
        UNION ALL SELECT 'trigger ' || tgname FROM pg_trigger WHERE NOT tgisinternal
        UNION ALL SELECT 'migration ' || version FROM schema_migrations
    ) AS s";

#[tokio::test]
async fn applying_twice_changes_nothing() {
    let db = pgtest::cluster().fresh_database().await;
    let mut client = pgtest::connect(&db.url).await;
    assert_eq!(migrations::apply(&mut client).await.unwrap(), [1, 2, 4]);
    let before: String = client.query_one(SCHEMA, &[]).await.unwrap().get(0);
    for column in [
        "clicks.clicked_at timestamp with time zone",
        "click_writers.last_batch bigint",
    ] {
        assert!(before.contains(column), "{column} in {before}");
    }
    assert_eq!(
        migrations::apply(&mut client).await.unwrap(),
        Vec::<i32>::new()
    );
    let after: String = client.query_one(SCHEMA, &[]).await.unwrap().get(0);
    assert_eq!(before, after);
}

#[tokio::test]
async fn concurrent_starts_apply_each_migration_once() {
    let db = pgtest::cluster().fresh_database().await;
    let runs = (0..4).map(|_| {
        let url = db.url.clone();
        tokio::spawn(async move {
            let mut client = pgtest::connect(&url).await;
            migrations::apply(&mut client).await.unwrap()
        })
    });
    let mut applied = Vec::new();
    for run in runs {
        applied.extend(run.await.unwrap());
    }
    assert_eq!(applied, [1, 2, 4]);
}

#[tokio::test]
async fn links_accept_only_http_urls_and_valid_codes() {
    let db = migrations::test_db().await;
    let client = pgtest::connect(&db.url).await;
    let insert = "INSERT INTO links (code, url) VALUES ($1, $2)";
    client
        .execute(insert, &[&"ok", &"https://example.com/"])
        .await
        .unwrap();
    client
        .execute(insert, &[&"ok2", &"http://example.com/"])
        .await
        .unwrap();
    for (code, url) in [
        ("bad", "ftp://x"),
        ("bad", "javascript:alert(1)"),
        ("a b", "https://x"),
    ] {
        let err = client.execute(insert, &[&code, &url]).await.unwrap_err();
        assert_eq!(
            err.code(),
            Some(&tokio_postgres::error::SqlState::CHECK_VIOLATION),
            "{code} {url}: {err:?}"
        );
    }
}

#[tokio::test]
async fn changing_links_notifies_links_changed() {
    let db = migrations::test_db().await;
    let (listener, mut conn) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = std::pin::pin!(std::future::poll_fn(move |cx| {
            loop {
                match conn.poll_message(cx) {
                    std::task::Poll::Ready(Some(Ok(
                        tokio_postgres::AsyncMessage::Notification(n),
                    ))) => {
                        let _ = tx.send(n.channel().to_owned());
                    }
                    std::task::Poll::Ready(Some(Ok(_))) => {}
                    std::task::Poll::Ready(_) => return std::task::Poll::Ready(()),
                    std::task::Poll::Pending => return std::task::Poll::Pending,
                }
            }
        }));
        (&mut messages).await
    });
    listener
        .batch_execute("LISTEN links_changed")
        .await
        .unwrap();
    let writer = pgtest::connect(&db.url).await;
    writer
        .execute(
            "INSERT INTO links (code, url) VALUES ('n1', 'https://e.x/')",
            &[],
        )
        .await
        .unwrap();
    let got = tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
        .await
        .expect("no links_changed notification within 10 s");
    assert_eq!(got.as_deref(), Some("links_changed"));
}

#[tokio::test]
async fn totals_view_adds_unfolded_deltas() {
    let db = migrations::test_db().await;
    let client = pgtest::connect(&db.url).await;
    client
        .batch_execute(
            "INSERT INTO click_counts VALUES ('a', '2026-01-01', 10);
             INSERT INTO click_count_deltas VALUES ('a', '2026-01-01', 2), ('a', '2026-01-01', 3),
                                                   ('b', '2026-01-02', 1);",
        )
        .await
        .unwrap();
    let rows = client
        .query(
            "SELECT code, day::text, clicks FROM click_totals ORDER BY code",
            &[],
        )
        .await
        .unwrap();
    let got: Vec<(String, String, i64)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        got,
        [
            ("a".into(), "2026-01-01".into(), 15),
            ("b".into(), "2026-01-02".into(), 1)
        ]
    );
}
