//! The collector's admin listener against clients that hold its connections open, on the real
//! binary under the descriptor limit of its unit (`LimitNOFILE=1024`): a scraper on a fresh
//! connection is still answered promptly, the held connections take no more descriptors than
//! the listener's bound, and the collector can still connect to its database.

use std::time::Duration;

use shared::admin::MAX_CONNECTIONS;
use testkit::collector::*;
use testkit::http::get;
use testkit::{eventually, limit_descriptors, open_descriptors, raise_own_descriptor_limit};
use tokio::net::TcpStream;

/// collector.service's `LimitNOFILE=`.
const NOFILE: u64 = 1_024;
/// More connections than the descriptor limit allows, held open.
const HELD: usize = 1_100;
/// Shorter than the admin listener's header read timeout (10 s), which closes a connection that
/// sends no request by itself: what happens within it is the bound's doing.
const PROMPT: Duration = Duration::from_secs(5);
/// Descriptors that may still be closing (an evicted connection's task closes it shortly after
/// its successor was accepted), and the test's own requests.
const CLOSING: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_admin_connections_neither_lock_out_a_scraper_nor_take_the_descriptors() {
    raise_own_descriptor_limit(HELD as u64 + 200);
    let p = place().await;
    let mut cmd = command(&p.db, &p.path, &[]);
    limit_descriptors(&mut cmd, NOFILE);
    let c = Collector::spawn(cmd).await;
    c.ready().await;
    let pid = c.service.pid();
    let before = open_descriptors(pid);

    let mut held = Vec::with_capacity(HELD);
    for i in 0..HELD {
        let stream = tokio::time::timeout(PROMPT, TcpStream::connect(c.admin))
            .await
            .unwrap_or_else(|_| panic!("held connection {i}: not connected within {PROMPT:?}"))
            .unwrap_or_else(|e| panic!("held connection {i}: {e}"));
        held.push(stream);
    }

    // A scraper and a health check, each on a fresh connection, accepted after all the held
    // ones (accept takes connections in order).
    for path in ["/metrics", "/healthz"] {
        let (status, body) = tokio::time::timeout(PROMPT, get(c.admin, path))
            .await
            .unwrap_or_else(|_| {
                panic!("GET {path} with {HELD} connections held: no answer within {PROMPT:?}")
            })
            .unwrap_or_else(|e| panic!("GET {path} with {HELD} connections held: {e}"));
        assert_eq!(status, 200, "GET {path}: {body}");
    }
    let bound = before + MAX_CONNECTIONS + CLOSING;
    eventually(
        &format!(
            "the collector to hold at most {bound} descriptors ({before} before the {HELD} \
             connections, {MAX_CONNECTIONS} admin connections at most)"
        ),
        PROMPT,
        || async { (open_descriptors(pid) <= bound).then_some(()) },
    )
    .await;
    let evicted = c
        .metric("collector_admin_connections_closed_total{reason=\"evicted\"}")
        .await;
    assert!(
        evicted >= (HELD - MAX_CONNECTIONS) as f64,
        "{evicted} held connections evicted"
    );
    assert_eq!(
        c.metric("collector_admin_connections_closed_total{reason=\"refused\"}")
            .await,
        0.0
    );

    // What the held connections used to cost: the collector could not connect to its database
    // again. Its sessions ended, the next clicks still land.
    let ended: i64 = p
        .client
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid() \
               AND backend_type = 'client backend'",
            &[],
        )
        .await
        .expect("ending the collector's sessions")
        .get(0);
    assert!(ended > 0, "the collector had no database session to end");
    let sent = clicks(1_000, 10, start_us(), 1_000);
    send_all(&p.path, datagrams(7, &sent)).await;
    await_rows(&p.client, None, sent.len() as u64).await;
    assert!(open_descriptors(pid) <= bound);
    drop(held);
}
