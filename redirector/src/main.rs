use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    shared::init_logging();
    let cfg = redirector::config::Config::parse();
    let result = match redirector::service::signalled() {
        Ok(shutdown) => redirector::service::run(cfg, shutdown).await,
        Err(e) => {
            shared::fatal!("installing signal handlers: {e}");
            return ExitCode::FAILURE;
        }
    };
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            shared::fatal!("redirector: {e}");
            ExitCode::FAILURE
        }
    }
}
