//! `cri-imaged`: parse the command line, then serve (with logging) or run a command for people
//! ([`cri_imaged::cli`], which has exit statuses of its own). Every error is one line on stderr,
//! `cri-imaged: …`, naming the flag, the value and what is accepted. Exit status: 0 after a clean
//! stop (and for `--help`, `--version`); 2 when the command line is refused before anything
//! starts (an unknown flag, a value its flag does not take, a config file that does not read);
//! 1 when the flags parse but the configuration is refused (`invalid configuration: …`, flags
//! that contradict each other) or the daemon cannot start or stops with an error.

use std::{ffi::OsString, process::ExitCode};

use cri_imaged::config::{self, Command, LoadError};

/// The exit status of a command line refused while parsing, as clap and most tools use.
const USAGE_ERROR: u8 = 2;

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let loaded = match config::load(&argv) {
        Ok(loaded) => loaded,
        Err(LoadError::Usage(error)) => match config::usage_error(&error) {
            Some(message) => {
                eprint!("{message}");
                return ExitCode::from(USAGE_ERROR);
            }
            // --help, --version: printed on stdout, exit 0.
            None => error.exit(),
        },
        Err(error @ LoadError::File(_)) => {
            eprintln!("cri-imaged: {error}");
            return ExitCode::from(USAGE_ERROR);
        }
    };
    let result = match loaded.cli.command {
        // Nothing of the daemon's starts for a client command: no logging under its output.
        Command::Client(command) => return cri_imaged::cli::run(command),
        Command::Serve(args) => match cri_imaged::daemon::async_runtime(&args) {
            Ok(runtime) => {
                cri_imaged::telemetry::init();
                let source = cri_imaged::reload::Source { argv, running: loaded.values };
                runtime.block_on(cri_imaged::daemon::run(args, source))
            }
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
