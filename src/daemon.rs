//! The composition root: builds every part of the daemon, hands each its collaborators, and
//! runs the `serve` command until it is told to stop.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use tokio::{
    net::UnixListener,
    sync::{mpsc, oneshot},
};

use crate::{
    backoff::BackoffStore,
    config::{ConfigError, NodeCredentialsError, PolicyLoadError, ServeArgs},
    credentials::NodeCredentials,
    ensure::{self, ManagerConfig, ManagerParts},
    events::Events,
    gc::{GcConfig, GcParts, ImageGc, ImageGuard, ages::AgesError, ages::AgesFile},
    kubelet_guard,
    listener::{self, ListenError},
    memory,
    metrics::{self, Metrics, MetricsServerError},
    notify,
    pinned::PinnedImages,
    policy::{InForce, PolicyGate},
    prepull::{
        PrePullConfig, PrePullParts, PrePulls,
        store::{PrePullStore, StoreError},
    },
    presence::{self, PresenceCache},
    pull::{
        path::{PathConfig, PullPath, Shared},
        ratelimit::RegistryLimits,
        scheduler::MakeRoom,
    },
    records::{PullRecords, RecordsError},
    registry::{HostsConfig, RegistryHosts},
    reload::{self, Reloadable},
    root_lock::{RootLock, RootLockError},
    runtime::{ContentStore, CriClient, ImageRuntime, RuntimeEndpoint, probe_within},
    server::{self, ServeError, ServeOptions, Services},
    shutdown::{self, Shutdown},
    signatures::{FetchLimits, Signatures, VerifiedFile},
};

/// Why the daemon stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    NodeCredentials(#[from] NodeCredentialsError),
    #[error(transparent)]
    Policy(#[from] PolicyLoadError),
    #[error(transparent)]
    RootLock(#[from] RootLockError),
    #[error(transparent)]
    Listen(#[from] ListenError),
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error(transparent)]
    Metrics(#[from] MetricsServerError),
    #[error("cannot install the signal handler: {0}")]
    Signal(std::io::Error),
    #[error(transparent)]
    Records(#[from] RecordsError),
    #[error(transparent)]
    ImageAges(#[from] AgesError),
    #[error(transparent)]
    PrePulls(#[from] StoreError),
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

/// Every shared part of a daemon, built here and nowhere else: each gets its collaborators.
pub struct Parts<R> {
    /// What the server serves.
    pub services: Services<R>,
    pub metrics: Arc<Metrics>,
    pub records: Arc<PullRecords>,
    /// containerd's registry host settings signatures are read with; containerd's defaults until
    /// replaced.
    pub registry_hosts: Arc<RegistryHosts>,
}

impl<R: ImageRuntime + ContentStore> Parts<R> {
    /// The pull path (rate limits around the runtime's pull, run by the scheduler), the backoff
    /// store, the presence cache and the manager over them, and the image collector beside it,
    /// all counting into one set of metrics.
    pub fn build(
        runtime: Arc<R>,
        (config, gc_config, pre_pull_config, policy): (ManagerConfig, GcConfig, PrePullConfig, InForce),
        node_credentials: Arc<NodeCredentials>,
        root_dir: &Path,
    ) -> Result<Self, DaemonError> {
        let metrics = Arc::new(Metrics::default());
        let records = Arc::new(PullRecords::open(root_dir, metrics.records.clone())?);
        let guard = Arc::new(ImageGuard::default());
        let events = Arc::new(Events::default().counted(metrics.events.clone()));
        let presence = Arc::new(
            PresenceCache::new(metrics.presence.clone(), config.presence_max_staleness)
                .with_fs_info_max_age(config.image_fs_info_max_age),
        );
        let limits = Arc::new(RegistryLimits::new(&config.rate_limits, metrics.pulls.clone(), events.clone()));
        let policy = Arc::new(PolicyGate::new(policy, metrics.policy.clone()));
        let registry_hosts = Arc::new(RegistryHosts::default());
        let signatures =
            Signatures::new(FetchLimits::within(config.scheduler.pull_timeout), metrics.signatures.clone())
                .with_registry_hosts(registry_hosts.clone())
                .kept_in(VerifiedFile::at(root_dir, metrics.records.quarantined("signatures")));
        let pulls = Arc::new(PullPath::over(
            runtime.clone(),
            limits.clone(),
            PathConfig { scheduler: config.scheduler, progress: config.progress },
            Shared {
                records: records.clone(),
                guard: guard.clone(),
                events: events.clone(),
                presence: presence.clone(),
                policy: policy.clone(),
                signatures: Arc::new(signatures),
            },
            metrics.pulls.clone(),
        ));
        let manager = Arc::new(ensure::Manager::new(ManagerParts {
            runtime: runtime.clone(),
            pulls: pulls.clone(),
            backoff: BackoffStore::new(config.backoff),
            presence: presence.clone(),
            node_credentials,
            records: records.clone(),
            guard: guard.clone(),
            events: events.clone(),
            verification: config.verification,
            policy: policy.clone(),
            metrics: metrics.ensure.clone(),
        }));
        let pinned = Arc::new(PinnedImages::default());
        let gc_parts = GcParts {
            runtime: runtime.clone(),
            config: gc_config,
            guard: guard.clone(),
            presence: presence.clone(),
            pinned: pinned.clone(),
            records: records.clone(),
            ages: AgesFile::open(root_dir)?.counting_quarantined(metrics.records.quarantined("ages")),
            events: events.clone(),
            metrics: metrics.gc.clone(),
        };
        let gc = Arc::new(ImageGc::new(gc_parts, tokio::time::Instant::now()));
        pulls.scheduler().make_room_with(Arc::new(CollectFirst(gc.clone())));
        let pre_pull_parts = PrePullParts {
            runtime: runtime.clone(),
            manager: manager.clone(),
            gc: gc.clone(),
            pinned: pinned.clone(),
            presence: presence.clone(),
            events: events.clone(),
            store: PrePullStore::open(root_dir)?.counting_quarantined(metrics.records.quarantined("pre_pull")),
            metrics: metrics.pre_pulls.clone(),
        };
        let pre_pulls = Arc::new(PrePulls::new(pre_pull_parts, pre_pull_config));
        let services = Services {
            runtime,
            manager,
            pulls,
            gc,
            presence,
            pinned,
            guard,
            events,
            limits,
            pre_pulls,
            policy,
            kubelet_warnings: Arc::default(),
            last_reload: Arc::default(),
            connections: metrics.connections.clone(),
            calls: metrics.calls.clone(),
            readiness: Arc::default(),
        };
        Ok(Self { services, metrics, records, registry_hosts })
    }
}

/// Image GC as the pull scheduler asks it to make room before a pull.
struct CollectFirst<R>(Arc<ImageGc<R>>);

impl<R: ImageRuntime> MakeRoom for CollectFirst<R> {
    fn make_room(&self) -> futures_util::future::BoxFuture<'_, ()> {
        Box::pin(self.0.make_room())
    }
}

/// What a daemon serves with, besides its socket.
pub struct Settings {
    pub runtime_endpoint: RuntimeEndpoint,
    /// Deadline of runtime calls other than pulls.
    pub runtime_request_timeout: Duration,
    pub manager: ManagerConfig,
    pub image_gc: GcConfig,
    pub pre_pulls: PrePullConfig,
    /// The node's image policy, its files already read.
    pub policy: InForce,
    /// The node's docker config and credential plugins, already read.
    pub node_credentials: Arc<NodeCredentials>,
    /// containerd's registry host settings, already read.
    pub registry_hosts: HostsConfig,
    /// cri-imaged's state: the pull records live under `image_manager/`, image ages under
    /// `image_gc/`, verified signatures under `signatures/`.
    pub root_dir: PathBuf,
    /// The kubelet's root dir, whose pull records are adopted as ours settle.
    pub kubelet_root_dir: Option<PathBuf>,
    pub serve: ServeOptions,
    /// Whether to watch a change signal (containerd's image events, CRI-O's image store) and
    /// remember presence answers.
    pub presence_cache: bool,
    /// The image store to watch when the runtime's ImageFsInfo names none (`--image-store-path`).
    pub image_store_path: Option<PathBuf>,
    /// Where to serve `/metrics`, already bound.
    pub metrics: Option<tokio::net::TcpListener>,
    /// What a reload reads again, and the requests for one (SIGHUP); `None`: no reloads.
    pub reload: Option<(reload::Source, mpsc::UnboundedReceiver<()>)>,
    /// What the kubelet guard found wrong with the kubelet whose image service this socket is.
    pub kubelet_warnings: kubelet_guard::Warnings,
}

/// Builds every part for `settings` and serves `listener` until `shutdown` is requested, then
/// drains. `main` and the tests' in-process daemon both start here.
pub async fn serve(listener: UnixListener, settings: Settings, shutdown: Shutdown) -> Result<(), DaemonError> {
    // The background parts stop when shutdown is requested, and also when serving ends early
    // (an error): the forwarder holds their trigger, and dropping it stops them.
    let (parts_trigger, parts_shutdown) = shutdown::channel();
    let forwarder = tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            shutdown.requested().await;
            parts_trigger.request();
        }
    });
    let shutdown = parts_shutdown;
    let runtime = Arc::new(CriClient::new(&settings.runtime_endpoint, settings.runtime_request_timeout));
    let started = SystemTime::now();
    let configs = (settings.manager, settings.image_gc, settings.pre_pulls, settings.policy);
    let node_credentials = settings.node_credentials;
    let parts = Parts::build(runtime.clone(), configs, node_credentials.clone(), &settings.root_dir)?;
    parts.registry_hosts.replace(settings.registry_hosts);
    if let Some(kubelet_root_dir) = &settings.kubelet_root_dir {
        parts.records.adopt_from(kubelet_root_dir);
    }
    parts.metrics.kubelet_guard.set(&settings.kubelet_warnings);
    let _ = parts.services.kubelet_warnings.set(settings.kubelet_warnings);
    // A reload's READY=1 must not come before the first one, which says the daemon is up.
    let (announce_ready, ready_announced) = oneshot::channel();
    if let Some((source, requests)) = settings.reload {
        let reloadable = Reloadable {
            limits: parts.services.limits.clone(),
            manager: parts.services.manager.clone(),
            gc: parts.services.gc.clone(),
            pre_pulls: parts.services.pre_pulls.clone(),
            policy: parts.services.policy.clone(),
            credentials: node_credentials,
            registry_hosts: parts.registry_hosts.clone(),
            metrics: parts.metrics.reloads.clone(),
            last: parts.services.last_reload.clone(),
        };
        tokio::spawn(reloadable.serve(source, requests, ready_announced, shutdown.clone()));
    }
    // The records are read into memory, and what a crash left behind is settled, while serving.
    tokio::spawn({
        let (records, runtime) = (parts.records.clone(), runtime.clone());
        async move { records.settle(&*runtime, started).await }
    });
    tokio::spawn(parts.services.gc.clone().run(shutdown.clone()));
    tokio::spawn(parts.services.pulls.signed().signatures().clone().keep(shutdown.clone()));
    tokio::spawn(parts.services.pre_pulls.clone().run(shutdown.clone()));
    tokio::spawn(memory::trim_periodically(shutdown.clone()));
    if settings.presence_cache {
        let (channel, cache, store) = (runtime.channel(), parts.services.presence.clone(), settings.image_store_path);
        tokio::spawn(presence::signal::watch(channel, runtime.clone(), store, cache, shutdown.clone()));
    }
    if let Some(listener) = settings.metrics {
        let (metrics, readiness) = (parts.metrics.clone(), parts.services.readiness.clone());
        let liveness = settings.serve.liveness_runtime_timeout;
        let served = metrics::serve(listener, metrics, (readiness, liveness), shutdown.clone().requested());
        tokio::spawn(async move {
            if let Err(error) = served.await {
                tracing::error!(%error, "metrics endpoint stopped");
            }
        });
    }
    // systemd starts what is ordered after us once we serve and know how the runtime is.
    let serving = listener::path_of(&listener).map(|path| path.display().to_string());
    tokio::spawn({
        let (runtime, timeout) = (runtime.clone(), settings.serve.health_probe_timeout);
        async move {
            let at = serving.unwrap_or_else(|| "the socket systemd passed".to_owned());
            let status = match probe_within(&*runtime, timeout).await {
                Ok(()) => format!("serving on {at}; the runtime answers"),
                Err(error) => format!("serving on {at}; the runtime does not answer: {error}"),
            };
            notify::ready(&status);
            let _ = announce_ready.send(());
        }
    });
    let served = server::serve(listener, &parts.services, settings.serve, shutdown).await;
    forwarder.abort();
    Ok(served?)
}

/// Serves until SIGTERM or SIGINT, then drains and returns; SIGHUP reloads `source`.
pub async fn run(args: ServeArgs, source: reload::Source) -> Result<(), DaemonError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).map_err(DaemonError::Signal)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(DaemonError::Signal)?;
    let mut hangup = signal(SignalKind::hangup()).map_err(DaemonError::Signal)?;
    let (reload_requests, reloads) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            tracing::info!("received SIGHUP: reloading the configuration");
            if reload_requests.send(()).is_err() {
                return;
            }
        }
    });

    let manager = args.manager_config()?;
    let image_gc = args.gc_config()?;
    let access = Arc::new(args.access_policy()?);
    let pre_pulls = args.pre_pull_config()?;
    let kubelet_root_dir = args.kubelet_root_dir()?;
    let node_credentials = Arc::new(args.node_credentials()?);
    let policy = args.image_policy()?;
    let registry_hosts = args.registry_hosts();
    // One daemon per root dir, before the socket is touched; one taking the socket over waits.
    let root_lock = RootLock::take(&args.root_dir, args.take_over_socket)?;
    // Socket activation: systemd's socket (its unit sets the path, mode and group), else our own.
    let (listener, socket_file) = match listener::passed_by_systemd()? {
        Some(listener) => (listener, None),
        None => {
            let (listener, socket_file) = if args.take_over_socket {
                listener::take_over(&args.listen).await?
            } else {
                listener::bind(&args.listen).await?
            };
            (listener, Some(socket_file))
        }
    };
    let listen = listener::path_of(&listener).unwrap_or_else(|| args.listen.clone()).display().to_string();
    let metrics = match args.metrics_listen {
        Some(addr) => Some(metrics::bind(addr).await?),
        None => None,
    };
    let metrics_listen = args.metrics_listen.map_or_else(|| "off".to_owned(), |addr| addr.to_string());
    // Read before serving, off the async threads: /proc and the kubelet's config file.
    let guarded = (PathBuf::from(&listen), socket_file.is_none(), args.kubelet_config.clone());
    let kubelet_warnings = tokio::task::spawn_blocking(move || kubelet_guard::check(&guarded.0, guarded.1, &guarded.2))
        .await
        .unwrap_or_default();
    for warning in [&kubelet_warnings.unactivated, &kubelet_warnings.serial_pulls].into_iter().flatten() {
        tracing::warn!("{warning}");
    }
    tracing::info!(
        %listen,
        socket_activated = socket_file.is_none(),
        runtime_endpoint = %args.runtime_endpoint,
        %metrics_listen,
        version = env!("CARGO_PKG_VERSION"),
        "cri-imaged serving"
    );
    let (trigger, shutdown) = shutdown::channel();
    root_lock.release_on(shutdown.clone());
    tokio::spawn(async move {
        tokio::select! {
            _ = terminate.recv() => tracing::info!("received SIGTERM"),
            _ = interrupt.recv() => tracing::info!("received SIGINT"),
        }
        notify::stopping("draining: answering the requests under way, taking no new ones");
        trigger.request();
    });
    let mut limits = args.serve_limits();
    let open_files = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    if let Some(open_files) = open_files {
        let (fitted, lowered) = limits.connections.fitted_to(open_files);
        match (lowered, args.max_connections) {
            (None, _) => {}
            (Some(max_connections), None) => {
                tracing::warn!(
                    max_connections,
                    open_files,
                    "--max-connections lowered from its default to fit the open-file limit (RLIMIT_NOFILE), with room for the runtime, state files and plugins"
                );
                limits.connections = fitted;
            }
            (Some(fits), Some(asked)) => tracing::warn!(
                max_connections = asked,
                open_files,
                fits,
                "--max-connections is more than the open-file limit (RLIMIT_NOFILE) leaves room for; at the limit, accepting waits"
            ),
        }
    }
    let settings = Settings {
        runtime_endpoint: args.runtime_endpoint,
        runtime_request_timeout: args.runtime_request_timeout,
        manager,
        image_gc,
        pre_pulls,
        policy,
        node_credentials,
        registry_hosts,
        root_dir: args.root_dir,
        kubelet_root_dir,
        serve: ServeOptions {
            drain_timeout: args.shutdown_timeout,
            health_probe_interval: args.health_probe_interval,
            health_probe_timeout: args.health_probe_timeout,
            liveness_runtime_timeout: (!args.liveness_runtime_timeout.is_zero())
                .then_some(args.liveness_runtime_timeout),
            limits,
            access,
        },
        presence_cache: args.presence_cache,
        image_store_path: args.image_store_path,
        metrics,
        reload: Some((source, reloads)),
        kubelet_warnings,
    };
    serve(listener, settings, shutdown).await?;
    // The socket file would otherwise look like a stale daemon to the next start; a successor
    // that bound the path while we drained keeps its own. systemd's socket stays: it is its own.
    if let Some(socket_file) = socket_file {
        socket_file.remove_if_ours();
    }
    tracing::info!("cri-imaged stopped");
    Ok(())
}
