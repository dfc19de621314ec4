//! The commands: `cri-imaged serve` and the commands for people ([`super::client`]), the defaults
//! their flags name, and clap's errors in the daemon's style.

use clap::{Parser, Subcommand};

use super::{ServeArgs, client::ClientCommand};

/// Where the daemon listens unless told otherwise.
pub const DEFAULT_LISTEN: &str = "/run/cri-imaged/cri-imaged.sock";
/// cri-imaged's own state.
pub const DEFAULT_ROOT_DIR: &str = "/var/lib/cri-imaged";
/// containerd's usual CRI socket.
pub const DEFAULT_RUNTIME_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";
/// `--max-connections` unset, before it is fitted to the open-file limit.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// cri-imaged: the kubelet's image manager as a node daemon in front of the CRI runtime.
#[derive(Debug, Parser)]
#[command(name = "cri-imaged", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// One per process, read once: the size of `serve`'s flags costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve EnsureImageExists on a unix socket, pulling through the CRI runtime.
    Serve(ServeArgs),
    #[command(flatten)]
    Client(ClientCommand),
}

/// A command line clap refused (an unknown flag, a value its flag does not take), in the daemon's
/// one error style: `cri-imaged: invalid value '0' for '--worker-threads <N>': expected …`, then
/// clap's usage hint. `None` for what is not an error: `--help` and `--version`.
pub fn usage_error(error: &clap::Error) -> Option<String> {
    if !error.use_stderr() {
        return None;
    }
    let text = error.render().to_string();
    Some(match text.strip_prefix("error: ") {
        Some(message) => format!("cri-imaged: {message}"),
        // `cri-imaged` with no command: clap's help, which names every command.
        None => text,
    })
}
