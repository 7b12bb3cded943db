//! Crash-safe delivery, on the real binaries: with the socket held across the collector's restarts, as systemd holds it, the kills lose no click. Its own test binary, so that
//! PostgreSQL's crash hits only this test's private cluster.

use testkit::redirector::chaos::{crash_and_count, Scenario};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_socket_held_across_the_collectors_restarts_as_systemd_holds_it_the_kills_lose_no_click(
) {
    crash_and_count(Scenario {
        pairs: 1,
        activated: true,
    })
    .await;
}
