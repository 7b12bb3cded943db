use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    shared::init_logging();
    let cfg = redirector::config::Config::parse();
    let result = match redirector::service::signalled() {
        Ok(shutdown) => redirector::service::run(cfg, shutdown).await,
        Err(e) => {
            tracing::error!("installing signal handlers: {e}");
            return ExitCode::FAILURE;
        }
    };
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("redirector: {e}");
            ExitCode::FAILURE
        }
    }
}
