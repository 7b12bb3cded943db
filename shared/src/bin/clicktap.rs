//! `clicktap`: socket-level inspection of the click pipeline. See `clicktap --help`.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    shared::init_logging();
    match shared::tap::run(shared::tap::Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("clicktap: {e}");
            ExitCode::FAILURE
        }
    }
}
