//! Crash-safe delivery, on the real binaries: a collector killed three times and PostgreSQL crashed once under load lose no click and double none. Its own test binary, so that
//! PostgreSQL's crash hits only this test's private cluster.

use testkit::redirector::chaos::{crash_and_count, Scenario};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_killed_three_times_and_postgresql_crashed_once_under_load_lose_no_click_and_double_none(
) {
    crash_and_count(Scenario {
        pairs: 1,
        activated: false,
    })
    .await;
}
