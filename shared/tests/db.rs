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
    assert_eq!(
        show(&client, "client_connection_check_interval").await,
        "4s"
    );
}

async fn show(client: &tokio_postgres::Client, setting: &str) -> String {
    let row = client.query_one(&format!("SHOW {setting}"), &[]).await;
    row.unwrap_or_else(|e| panic!("SHOW {setting}: {e}")).get(0)
}

/// A first host that accepts and never answers (a hung postmaster) is left for the next
/// within a share of the timeout: tokio-postgres bounds only the TCP connect, so the attempt
/// waited on it until the caller's deadline, and a failover to the second host was never
/// seen.
#[tokio::test]
async fn a_hung_first_host_is_left_for_the_next_within_the_timeout() {
    let hung = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hung_port = hung.local_addr().unwrap().port();
    // Accepts, keeps every connection open, and says nothing.
    let _silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = hung.accept().await {
            held.push(socket);
        }
    });
    let port = testkit::pgtest::tcp_cluster().port().unwrap();
    let url =
        format!("host=127.0.0.1,127.0.0.1 port={hung_port},{port} user=postgres dbname=postgres");
    let timeout = Duration::from_secs(4);
    let config = url
        .parse::<shared::db::Config>()
        .unwrap()
        .guarded(timeout, "test");
    let client = tokio::time::timeout(timeout, shared::db::connect(&config))
        .await
        .expect("a session within the timeout")
        .expect("a session with the second host");
    assert_eq!(show(&client, "port").await, port.to_string());
}
