//! Crash-safe delivery, on the real binaries: three hosts on one database, one of whose collectors is killed, lose no click. Its own test binary, so that
//! PostgreSQL's crash hits only this test's private cluster.

use testkit::redirector::chaos::{crash_and_count, Scenario};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hosts_on_one_database_one_of_whose_collectors_is_killed_lose_no_click() {
    crash_and_count(Scenario {
        pairs: 3,
        activated: false,
    })
    .await;
}
