use std::process::ExitCode;

use clap::Parser;
use cri_imaged::config::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    cri_imaged::telemetry::init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cri-imaged: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Serve(args) => runtime.block_on(cri_imaged::daemon::run(args)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("cri-imaged: {error}");
            ExitCode::FAILURE
        }
    }
}
