//! Migration 4: the change log of `links` the redirectors follow.

use testkit::pgtest;

async fn logged(client: &tokio_postgres::Client) -> Vec<String> {
    let rows = client
        .query("SELECT code FROM link_changes ORDER BY id, code", &[])
        .await
        .unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

async fn state(client: &tokio_postgres::Client) -> (i64, i64, i64) {
    let row = client
        .query_one(
            "SELECT pruned_id, pruned_xid::text::bigint, epoch FROM link_changes_state",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

#[tokio::test]
async fn every_changed_code_is_logged_once_per_statement_and_a_rename_logs_both() {
    let db = pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    client
        .batch_execute(
            "INSERT INTO links (code, url) SELECT 'c' || n, 'https://x/' || n FROM generate_series(1, 3) AS n;
             UPDATE links SET url = 'https://y/' WHERE code = 'c1';
             UPDATE links SET code = 'renamed' WHERE code = 'c2';
             DELETE FROM links WHERE code = 'c3';",
        )
        .await
        .unwrap();
    assert_eq!(
        logged(&client).await,
        ["c1", "c2", "c3", "c1", "c2", "renamed", "c3"]
    );
}

#[tokio::test]
async fn truncate_bumps_the_epoch_and_pruning_records_how_far_it_went() {
    let db = pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    client
        .batch_execute(
            "INSERT INTO links (code, url) VALUES ('a', 'https://x/'), ('b', 'https://x/')",
        )
        .await
        .unwrap();
    assert_eq!(state(&client).await, (0, 0, 0));
    client.batch_execute("TRUNCATE links").await.unwrap();
    assert_eq!(state(&client).await.2, 1);

    let kept: i64 = client
        .query_one("SELECT prune_link_changes('1 hour')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(kept, 0, "nothing is an hour old");
    let top: (i64, i64) = client
        .query_one(
            "SELECT max(id), max(xid)::text::bigint FROM link_changes",
            &[],
        )
        .await
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();
    let pruned: i64 = client
        .query_one("SELECT prune_link_changes('0 s')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(pruned, 2);
    assert!(logged(&client).await.is_empty());
    assert_eq!(state(&client).await, (top.0, top.1, 1));
}

#[tokio::test]
async fn a_role_that_may_only_change_links_still_logs_its_changes() {
    let db = pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    let role = format!("linker_{}", db.name);
    client
        .batch_execute(&format!(
            "CREATE ROLE {role};
             GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON links TO {role};
             SET ROLE {role};
             INSERT INTO links (code, url) VALUES ('mine', 'https://x/');
             TRUNCATE links;
             RESET ROLE;"
        ))
        .await
        .unwrap_or_else(|e| panic!("{}", shared::db::describe(&e)));
    assert_eq!(logged(&client).await, ["mine"]);
    assert_eq!(state(&client).await.2, 1);
}
