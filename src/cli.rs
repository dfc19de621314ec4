//! The commands for people at a terminal, each talking to a running daemon over its socket.
//!
//! - `client`: the connection, each call bounded, each failure a [`CliError`].
//! - `connect`: the socket, and what to do when it is missing, refused or closed to us.
//! - `error`: [`CliError`], each naming the next step, and the [`Exit`] statuses.
//! - `output`: terminal or pipe, colour or not, text or JSON.
//! - `render`: pure formatting: sizes and ages, tables, the pull's progress frame, lines whose
//!   tones are kept apart from their text (and the one function that makes text printable), JSON
//!   lines.
//! - one module per command: `pull`, `images`, `status`, `events`, `gc`, `backoff`, `policy`,
//!   `prepull`, `top`, and
//!   `docs` (completions and man pages).
//!
//! Nothing here is part of the daemon: `serve` never runs this code, and this code imports none
//! of the daemon's parts, only the API, the flags and the pure grammars (`tests/layering.rs`).

mod backoff;
mod client;
mod connect;
mod docs;
mod error;
mod events;
mod gc;
mod images;
mod output;
mod policy;
mod prepull;
mod pull;
mod render;
mod secret;
mod status;
mod top;

use std::{future::Future, process::ExitCode};

pub use self::error::{CliError, Exit};
use crate::config::client::ClientCommand;

/// Runs `command` to its end; the exit status says how it went (see [`Exit`]). Errors are one line
/// on stderr, `cri-imaged: …`.
pub fn run(command: ClientCommand) -> ExitCode {
    let result = match command {
        ClientCommand::Completion(args) => docs::completion(args.shell),
        ClientCommand::GenerateMan(args) => docs::man_pages(&args.dir, args.date.as_deref()),
        command => match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(runtime) => runtime.block_on(interruptible(dispatch(command))),
            Err(error) => Err(CliError::Output(error)),
        },
    };
    match result {
        Ok(()) => ExitCode::from(Exit::Done as u8),
        Err(error) => {
            // The daemon's words (a registry's error, a pod's name) are in it: no escape gets through.
            eprintln!("cri-imaged: {}", render::line::printable(&error.to_string()));
            ExitCode::from(error.exit() as u8)
        }
    }
}

async fn dispatch(command: ClientCommand) -> Result<(), CliError> {
    match command {
        ClientCommand::Pull(args) => pull::run(args).await,
        ClientCommand::Images(args) => images::run(args).await,
        ClientCommand::Status(args) => status::run(args).await,
        ClientCommand::Events(args) => events::run(args).await,
        ClientCommand::Gc(args) => gc::run(args).await,
        ClientCommand::Backoff(args) => backoff::run(args).await,
        ClientCommand::Policy(args) => policy::run(args).await,
        ClientCommand::Prepull(args) => prepull::run(args).await,
        ClientCommand::Top(args) => top::run(args).await,
        ClientCommand::Completion(_) | ClientCommand::GenerateMan(_) => Ok(()),
    }
}

/// `work`, or [`CliError::Interrupted`] at Ctrl-C, SIGTERM or SIGHUP (the terminal closed): the
/// work is dropped (a pull's call ends, and the daemon cancels the pull unless someone else waits
/// for it), and the terminal is put back by the guards it holds, which drop with it.
async fn interruptible(work: impl Future<Output = Result<(), CliError>>) -> Result<(), CliError> {
    use tokio::signal::unix::{SignalKind, signal};
    let (mut terminate, mut hangup) = (signal(SignalKind::terminate()).ok(), signal(SignalKind::hangup()).ok());
    tokio::select! {
        result = work => result,
        _ = tokio::signal::ctrl_c() => Err(CliError::Interrupted),
        _ = received(&mut terminate) => Err(CliError::Interrupted),
        _ = received(&mut hangup) => Err(CliError::Interrupted),
    }
}

/// The next `signal`; never, when it could not be listened for.
async fn received(signal: &mut Option<tokio::signal::unix::Signal>) {
    match signal {
        Some(signal) => {
            signal.recv().await;
        }
        None => std::future::pending().await,
    }
}
