//! The `serve` command: wires the listener, the runtime client, the manager and the server.

use std::sync::Arc;

use crate::{
    config::{ConfigError, ServeArgs},
    ensure::ImageManager,
    listener::{self, ListenError},
    metrics::{self, MetricsServerError},
    runtime::CriClient,
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
    #[error(transparent)]
    Metrics(#[from] MetricsServerError),
    #[error("cannot install the signal handler: {0}")]
    Signal(std::io::Error),
}

/// The async runtime `serve` runs on: a single thread unless told otherwise.
pub fn async_runtime(args: &ServeArgs) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = match args.worker_threads.get() {
        1 => tokio::runtime::Builder::new_current_thread(),
        threads => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(threads);
            builder
        }
    };
    builder.enable_all().build()
}

/// Serves until SIGTERM or SIGINT, then drains and returns.
pub async fn run(args: ServeArgs) -> Result<(), DaemonError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).map_err(DaemonError::Signal)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(DaemonError::Signal)?;

    let config = args.manager_config()?;
    let (listener, socket_file) = listener::bind(&args.listen).await?;
    let metrics_listener = match args.metrics_listen {
        Some(addr) => Some(metrics::bind(addr).await?),
        None => None,
    };
    let runtime = CriClient::new(&args.runtime_endpoint, args.runtime_request_timeout);
    let events = runtime.channel();
    let manager = Arc::new(ImageManager::new(Arc::new(runtime), config));
    let watcher =
        args.presence_cache.then(|| tokio::spawn(crate::runtime::events::watch(events, manager.presence().clone())));
    tracing::info!(
        listen = %args.listen.display(),
        runtime_endpoint = %args.runtime_endpoint,
        metrics_listen = ?args.metrics_listen,
        version = env!("CARGO_PKG_VERSION"),
        "cri-imaged serving"
    );

    // One stop signal for every server.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until_stopped = move || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|stopped| *stopped).await;
        }
    };
    tokio::spawn(async move {
        tokio::select! {
            _ = terminate.recv() => tracing::info!("received SIGTERM"),
            _ = interrupt.recv() => tracing::info!("received SIGINT"),
        }
        stop.send_replace(true);
    });
    let metrics_server = metrics_listener.map(|listener| {
        let served = metrics::serve(listener, manager.metrics().clone(), until_stopped());
        tokio::spawn(async move {
            if let Err(error) = served.await {
                tracing::error!(%error, "metrics endpoint stopped");
            }
        })
    });

    let options = ServeOptions {
        drain_timeout: args.shutdown_timeout,
        health_probe_interval: args.health_probe_interval,
        health_probe_timeout: args.health_probe_timeout,
    };
    server::serve(listener, manager, options, until_stopped()).await?;
    for task in [metrics_server, watcher].into_iter().flatten() {
        task.abort();
    }
    // The socket file would otherwise look like a stale daemon to the next start; a successor
    // that bound the path while we drained keeps its own.
    socket_file.remove_if_ours();
    tracing::info!("cri-imaged stopped");
    Ok(())
}
