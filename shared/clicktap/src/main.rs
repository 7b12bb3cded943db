//! `clicktap`: socket-level inspection of the click pipeline. See `clicktap --help`.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    shared::init_logging();
    match clicktap::run(clicktap::Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("clicktap: {e}");
            ExitCode::FAILURE
        }
    }
}
