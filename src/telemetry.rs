//! Logging: structured tracing events on stderr, filtered by `RUST_LOG` (default `info`).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber; call once at start-up.
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal, not in journald or a log file.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}
