//! Every duration flag of the redirector goes through the shared parser: zero (which once
//! panicked the link loader's timer) and absurd values are refused with the reason.

#[test]
fn every_duration_flag_refuses_zero_and_absurd_values() {
    let command = <redirector::config::Config as clap::CommandFactory>::command();
    testkit::assert_duration_flags_refuse_zero_and_absurd(command, &["--database-url", "x"]);
}

/// A connection string naming no host (libpq would take its default socket) is refused at
/// start rather than taken for a database that is down, and the reason reaches stderr even
/// with `RUST_LOG=off`.
#[tokio::test]
async fn a_database_url_naming_no_host_is_refused_at_start_even_with_logging_off() {
    let mut cmd = std::process::Command::new(testkit::binary("redirector"));
    cmd.env("RUST_LOG", "off")
        .args(["--database-url", "dbname=clicks user=clicks-redirector"]);
    let mut redirector = testkit::Service::spawn("redirector", cmd);
    let status = redirector
        .wait_exit(std::time::Duration::from_secs(20))
        .await;
    assert_eq!(status.code(), Some(1));
    let log = redirector.log();
    assert!(log.iter().any(|l| l.contains("names no host")), "{log:?}");
}

/// A runtime worker count tokio would panic on is refused with its reason, not a panic.
#[test]
fn a_worker_thread_count_that_is_no_count_is_refused_at_start() {
    testkit::assert_bad_worker_threads_refused("redirector");
}
