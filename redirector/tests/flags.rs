//! Every duration flag of the redirector goes through the shared parser: zero (which once
//! panicked the link loader's timer) and absurd values are refused with the reason.

#[test]
fn every_duration_flag_refuses_zero_and_absurd_values() {
    let command = <redirector::config::Config as clap::CommandFactory>::command();
    testkit::assert_duration_flags_refuse_zero_and_absurd(command, &["--database-url", "x"]);
}
