//! Database sessions as both services open them, against the harness's clusters.

use std::time::Duration;

/// A guarded session over TCP has the server keep it alive and time it out too, so that a
/// backend whose client vanished from the network does not hold its locks for the kernel's
/// two hours; the search path is pinned either way.
#[tokio::test]
async fn a_guarded_session_is_watched_from_the_servers_side_too() {
    let url = testkit::pgtest::tcp_cluster().url("postgres");
    let config: shared::db::Config = url.parse().unwrap();
    let plain = shared::db::connect(&config).await.unwrap();
    assert_eq!(show(&plain, "search_path").await, "public");
    let guarded = config.guarded(Duration::from_secs(4), "test");
    let client = shared::db::connect(&guarded).await.unwrap();
    assert_eq!(show(&client, "search_path").await, "public");
    assert_eq!(show(&client, "tcp_keepalives_idle").await, "10");
    assert_eq!(show(&client, "tcp_keepalives_interval").await, "5");
    assert_eq!(show(&client, "tcp_keepalives_count").await, "3");
    assert_eq!(show(&client, "tcp_user_timeout").await, "12000");
}

async fn show(client: &tokio_postgres::Client, setting: &str) -> String {
    let row = client.query_one(&format!("SHOW {setting}"), &[]).await;
    row.unwrap_or_else(|e| panic!("SHOW {setting}: {e}")).get(0)
}
