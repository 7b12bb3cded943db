use std::process::ExitCode;

use clap::Parser;
use collector::config::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let url = cli.database_url().unwrap_or_else(|e| e.exit()).to_owned();
    shared::init_logging();
    let runtime = match shared::runtime::build() {
        Ok(runtime) => runtime,
        Err(e) => {
            shared::fatal!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Some(Command::Migrate) => collector::service::migrate(&url).await,
            None => collector::service::run(&url, cli.run).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            shared::fatal!("{e}");
            ExitCode::FAILURE
        }
    }
}
