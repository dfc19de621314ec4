use std::process::ExitCode;

use clap::Parser;
use cri_imaged::config::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    cri_imaged::telemetry::init();
    let result = match cli.command {
        Command::Serve(args) => match cri_imaged::daemon::async_runtime(&args) {
            Ok(runtime) => runtime.block_on(cri_imaged::daemon::run(args)),
            Err(error) => {
                eprintln!("cri-imaged: cannot start the async runtime: {error}");
                return ExitCode::FAILURE;
            }
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("cri-imaged: {error}");
            ExitCode::FAILURE
        }
    }
}
