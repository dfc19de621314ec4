//! The `serve` command: wires the listener, the runtime client, the manager and the server.

use std::sync::Arc;

use crate::{
    config::{ConfigError, ServeArgs},
    cri::CriClient,
    listener::{self, ListenError},
    manager::ImageManager,
    server::{self, ServeError, ServeOptions},
};

/// Why the daemon stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Listen(#[from] ListenError),
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error("cannot install the signal handler: {0}")]
    Signal(std::io::Error),
}

/// Serves until SIGTERM or SIGINT, then drains and returns.
pub async fn run(args: ServeArgs) -> Result<(), DaemonError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).map_err(DaemonError::Signal)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(DaemonError::Signal)?;

    let config = args.manager_config()?;
    let listener = listener::bind(&args.listen).await?;
    let runtime = CriClient::new(&args.runtime_endpoint, args.runtime_request_timeout);
    let manager = Arc::new(ImageManager::new(Arc::new(runtime), config));
    tracing::info!(
        listen = %args.listen.display(),
        runtime_endpoint = %args.runtime_endpoint,
        version = env!("CARGO_PKG_VERSION"),
        "cri-imaged serving"
    );
    let options =
        ServeOptions { drain_timeout: args.shutdown_timeout, health_probe_interval: args.health_probe_interval };
    let shutdown = async move {
        tokio::select! {
            _ = terminate.recv() => tracing::info!("received SIGTERM"),
            _ = interrupt.recv() => tracing::info!("received SIGINT"),
        }
    };
    server::serve(listener, manager, options, shutdown).await?;
    // The socket file would otherwise look like a stale daemon to the next start.
    let _ = std::fs::remove_file(&args.listen);
    tracing::info!("cri-imaged stopped");
    Ok(())
}
