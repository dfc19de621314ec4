//! The gRPC server: our API, health per service, reflection, and a bounded graceful shutdown.

/// `AsyncWrite` and tonic's `Connected` for a connection wrapper `$wrapper<IO>` that changes only
/// what is read: writes go untouched to its `inner` IO (`$wrapper, writes`: `AsyncWrite` alone).
macro_rules! writes_pass_through {
    ($wrapper:ident) => {
        writes_pass_through!($wrapper, writes);

        impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected for $wrapper<IO> {
            type ConnectInfo = IO::ConnectInfo;

            fn connect_info(&self) -> Self::ConnectInfo {
                self.inner.connect_info()
            }
        }
    };
    // Writes only: the wrapper says who connected itself.
    ($wrapper:ident, writes) => {
        impl<IO: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for $wrapper<IO> {
            fn poll_write(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
            }

            fn poll_write_vectored(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.inner.is_write_vectored()
            }

            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.get_mut().inner).poll_flush(cx)
            }

            fn poll_shutdown(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
            }
        }
    };
}

mod accept;
mod authority;
mod body_timeout;
mod connections;
mod cri_image_service;
mod deadline;
mod health;
mod image_manager;
mod last_reload;
pub mod metrics;
mod peer;
mod policy_views;
mod pre_pulls;
mod request;
mod roles;
mod status;
mod streams;
mod views;
mod watch;

use std::{sync::Arc, time::Duration};

use tokio::net::UnixListener;
use tokio_stream::StreamExt;
use tonic::service::Routes;

pub use self::{accept::ConnectionLimits, health::IMAGE_MANAGER_SERVICE, last_reload::LastReload};
// For the generated reference of reasons (`tests/docs_reference.rs`).
#[doc(hidden)]
pub use self::status::{CriPullError, server_refusals};
use self::{
    authority::AuthorityTolerant,
    body_timeout::BodyTimeoutLayer,
    connections::Http2Settings,
    cri_image_service::{CRI_IMAGE_SERVICE, CriImageService},
    deadline::{DeadlineLayer, DrainDeadline, Unanswered},
    image_manager::ImageManagerService,
    metrics::{CallMetrics, ConnectionMetrics},
    roles::{Recorder, RolesLayer},
    streams::EndOnShutdown,
    watch::WithWatch,
};
use crate::{
    access::Policy,
    api::{self, image_manager_server::ImageManagerServer},
    ensure,
    events::Events,
    gc::{ImageGc, ImageGuard},
    pinned::PinnedImages,
    policy::PolicyGate,
    prepull::PrePulls,
    presence::PresenceCache,
    pull::{path::PullPath, ratelimit::RegistryLimits},
    runtime::{ImageRuntime, MAX_MESSAGE_BYTES},
    shutdown::Shutdown,
};

/// What the server serves, each part built by the composition root and shared with it.
pub struct Services<R> {
    pub runtime: Arc<R>,
    pub manager: Arc<ensure::Manager<R>>,
    /// Every pull, EnsureImageExists's and CRI PullImage's.
    pub pulls: Arc<PullPath>,
    pub gc: Arc<ImageGc<R>>,
    pub presence: Arc<PresenceCache>,
    /// The images we pin, reported pinned in CRI answers.
    pub pinned: Arc<PinnedImages>,
    /// Marks what CRI ImageStatus hands out, for image GC.
    pub guard: Arc<ImageGuard>,
    /// Every image event, for WatchEvents.
    pub events: Arc<Events>,
    /// The registry rate limits the pull path applies, for GetStatus.
    pub limits: Arc<RegistryLimits>,
    /// Pre-pulls, asked for over the API or declared.
    pub pre_pulls: Arc<PrePulls<R>>,
    /// The node's image policy, for reloads and GetStatus.
    pub policy: Arc<PolicyGate>,
    /// The kubelet guard's warnings, once the daemon has read the kubelet (see
    /// [`crate::kubelet_guard`]).
    pub kubelet_warnings: Arc<std::sync::OnceLock<crate::kubelet_guard::Warnings>>,
    /// The last configuration reload's refusal, for GetStatus.
    pub last_reload: Arc<LastReload>,
    pub connections: Arc<ConnectionMetrics>,
    /// Calls by method, role and result.
    pub calls: Arc<CallMetrics>,
    /// The image service's health for the HTTP `/readyz`, kept with the gRPC health's.
    pub readiness: Arc<crate::readiness::Readiness>,
}

/// Polls a timer made only when first needed: ready once `deadline` has passed. A connection or
/// body that is on time never costs a timer.
fn poll_deadline(
    timer: &mut Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    deadline: tokio::time::Instant,
    cx: &mut std::task::Context<'_>,
) -> std::task::Poll<()> {
    let timer = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
    std::future::Future::poll(timer.as_mut(), cx)
}

/// The largest request our own API takes: a pod's pull secrets are Kubernetes objects (1 MiB at
/// most, as etcd stores them), an image reference a few hundred bytes. The CRI pass-through keeps
/// the kubelet's 16 MiB.
pub const API_MAX_REQUEST_BYTES: usize = 2 * 1024 * 1024;

/// How the server behaves, beyond what it serves.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// After the shutdown signal, how long in-flight requests may take before we exit anyway.
    pub drain_timeout: Duration,
    /// How often the runtime is probed for the health service.
    pub health_probe_interval: Duration,
    /// How long one health probe may take before the runtime counts as unreachable.
    pub health_probe_timeout: Duration,
    /// `/livez` fails once the runtime has been unreachable this long (`None`: never).
    pub liveness_runtime_timeout: Option<Duration>,
    /// What one client may take: connections, streams, time.
    pub limits: ServeLimits,
    /// Who may do what (`--role`, `--default-role`), fixed at start.
    pub access: Arc<Policy>,
}

/// What one client may take of the daemon: connections, streams, time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// How many connections at once, and how soon each must begin HTTP/2.
    pub connections: ConnectionLimits,
    /// Streams open at once on one connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS).
    pub max_concurrent_streams: u32,
    /// From a request's headers to the end of its body.
    pub request_body_timeout: Duration,
    /// An HTTP/2 PING on a connection quiet this long.
    pub keepalive_interval: Duration,
    /// A PING unanswered this long closes its connection.
    pub keepalive_timeout: Duration,
    /// No request under way on a connection this long: GOAWAY. `None`: never.
    pub idle_timeout: Option<Duration>,
}

impl Default for ServeLimits {
    /// The flags' defaults.
    fn default() -> Self {
        Self {
            connections: ConnectionLimits {
                max_connections: 1024,
                handshake_timeout: Duration::from_secs(10),
                reserved: 32,
                reserved_uid: None,
                per_client: 64,
            },
            max_concurrent_streams: 1024,
            request_body_timeout: Duration::from_secs(10),
            keepalive_interval: Duration::from_secs(60),
            keepalive_timeout: Duration::from_secs(20),
            idle_timeout: Some(Duration::from_secs(300)),
        }
    }
}

/// After the drain deadline, how long the last answers may take to be written.
const ANSWER_GRACE: Duration = Duration::from_secs(1);

/// Why serving failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot build the reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
}

/// The services reflection advertises: those we serve. The CRI's descriptors are registered for
/// the types our API uses, not to advertise services we do not serve.
const ADVERTISED_SERVICES: [&str; 5] = [
    IMAGE_MANAGER_SERVICE,
    CRI_IMAGE_SERVICE,
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
];

/// A reflection builder with our descriptors, google.rpc's (so error details print) and health's.
fn reflection() -> tonic_reflection::server::Builder<'static> {
    let descriptor_sets =
        [api::FILE_DESCRIPTOR_SET, tonic_types::pb::FILE_DESCRIPTOR_SET, tonic_health::pb::FILE_DESCRIPTOR_SET];
    let builder = descriptor_sets.into_iter().fold(tonic_reflection::server::Builder::configure(), |builder, set| {
        builder.register_encoded_file_descriptor_set(set)
    });
    ADVERTISED_SERVICES.into_iter().fold(builder, |builder, name| builder.with_service_name(name))
}

/// Serves `services` until `shutdown` is requested, then drains for at most `options.drain_timeout`.
pub async fn serve<R: ImageRuntime>(
    listener: UnixListener,
    services: &Services<R>,
    options: ServeOptions,
    shutdown: Shutdown,
) -> Result<(), ServeError> {
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;

    let (reporter, health_service) = tonic_health::server::health_reporter();
    tokio::spawn(health::probe_runtime(
        services.runtime.clone(),
        (reporter.clone(), services.readiness.clone()),
        (options.health_probe_interval, options.health_probe_timeout),
        shutdown.clone(),
    ));

    let calls = Arc::new(Recorder::new(services.calls.clone()));
    tokio::spawn(roles::summarise_refusals(calls.clone(), shutdown.clone()));

    let cri_image_service = CriImageService::new(services);
    let image_manager = ImageManagerServer::new(ImageManagerService::new(services, calls.clone()))
        .max_decoding_message_size(API_MAX_REQUEST_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let image_manager = WithWatch::new(image_manager, services.events.clone(), shutdown.clone());

    let draining = Arc::new(tokio::sync::Notify::new());
    let signal = {
        let (draining, shutdown) = (draining.clone(), shutdown.clone());
        async move {
            shutdown.requested().await;
            tracing::info!("shutting down: no new requests; draining in-flight ones");
            draining.notify_one();
        }
    };
    // Connections within the limits, each one's incoming HTTP/2 made acceptable to h2 whatever its
    // `:authority`.
    let limits = options.limits;
    let incoming = accept::connections(listener, limits.connections, services.connections.clone())
        .map(|accepted| accepted.map(AuthorityTolerant::new));
    let (drain_deadline, drained) = tokio::sync::watch::channel(None);
    let unanswered = Unanswered::default();
    let routes = Routes::new(EndOnShutdown::new(health_service, shutdown.clone()))
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(image_manager)
        .add_service(cri_image_service);
    let service = tower::ServiceBuilder::new()
        .layer(DeadlineLayer::new(drained, unanswered.clone()))
        .layer(BodyTimeoutLayer::new(limits.request_body_timeout))
        .layer(RolesLayer::new(options.access.clone(), calls))
        .service(routes);
    let http2 = Http2Settings {
        max_concurrent_streams: limits.max_concurrent_streams,
        keepalive: (limits.keepalive_interval, limits.keepalive_timeout),
        idle_timeout: limits.idle_timeout,
    };
    let server = connections::serve(incoming, service, http2, signal);

    tokio::pin!(server);
    // Draining: every answer is waited for, up to the drain deadline; open streams are not.
    let drained_in_time = async {
        draining.notified().await;
        tokio::select! {
            () = unanswered.all_answered() => true,
            () = tokio::time::sleep(options.drain_timeout) => false,
        }
    };
    let result = tokio::select! {
        () = &mut server => Ok(()),
        in_time = drained_in_time => {
            if !in_time {
                tracing::warn!(timeout = ?options.drain_timeout, "drain deadline passed; telling in-flight requests we are shutting down");
                drain_deadline.send_replace(Some(DrainDeadline(options.drain_timeout)));
            }
            // The last answers are written before the connections close; a peer that never
            // reads them, or a watcher that stopped reading, does not hold the exit up for long.
            // Past the grace, whatever is still open is dropped with the process.
            let _ = tokio::time::timeout(ANSWER_GRACE, server).await;
            Ok(())
        }
    };
    result
}
