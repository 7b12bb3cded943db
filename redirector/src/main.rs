use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    shared::init_logging();
    let cfg = redirector::config::Config::parse();
    let runtime = match shared::runtime::build() {
        Ok(runtime) => runtime,
        Err(e) => {
            shared::fatal!("redirector: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let shutdown = redirector::service::signalled()
            .map_err(|e| format!("installing signal handlers: {e}"))?;
        redirector::service::run(cfg, shutdown)
            .await
            .map_err(|e| e.to_string())
    });
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            shared::fatal!("redirector: {e}");
            ExitCode::FAILURE
        }
    }
}
