//! `cri-imaged`: parse the command line, start logging, serve. Every error is one line on stderr,
//! `cri-imaged: …`, naming the flag, the value and what is accepted. Exit status: 0 after a clean
//! stop (and for `--help`, `--version`); 2 when the command line is refused before anything
//! starts (an unknown flag, a value its flag does not take); 1 when the flags parse but the
//! configuration is refused (`invalid configuration: …`, flags that contradict each other) or the
//! daemon cannot start or stops with an error.

use std::process::ExitCode;

use clap::Parser;
use cri_imaged::config::{self, Cli, Command};

/// The exit status of a command line refused while parsing, as clap and most tools use.
const USAGE_ERROR: u8 = 2;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => match config::usage_error(&error) {
            Some(message) => {
                eprint!("{message}");
                return ExitCode::from(USAGE_ERROR);
            }
            // --help, --version: printed on stdout, exit 0.
            None => error.exit(),
        },
    };
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
