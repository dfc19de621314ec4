//! Shared test harness: a fake CRI runtime, the daemon in-process, clients over unix sockets.
#![allow(dead_code)] // each test binary uses a different part of the harness

pub mod accounts;
pub mod clients;
pub mod containers;
pub mod cosign;
pub mod daemonset;
pub mod delay_line;
pub mod fake_events;
pub mod fake_runtime;
pub mod fake_runtime_methods;
pub mod netrig;
pub mod oci_image;
pub mod private;
pub mod process;
pub mod registry_faults;
pub mod registry_push;
pub mod signed_pulls;
pub mod sigstore_pki;
pub mod stack;
pub mod test_ca;
pub mod throttle;
pub mod throttled_node;
pub mod tmux;

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use cri_imaged::{
    api::{EnsureImageExistsRequest, EnsureImageExistsResponse, image_manager_client::ImageManagerClient},
    credentials::NodeCredentials,
    daemon::Settings,
    ensure::ManagerConfig,
    runtime::RuntimeEndpoint,
    server::ServeOptions,
    shutdown::ShutdownTrigger,
};
use hyper_util::rt::TokioIo;
use tokio::{net::UnixStream, task::JoinHandle};
use tonic::transport::{Channel, Endpoint, Uri};
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient};
use tonic_types::StatusExt;

/// A channel that dials `path`, connecting on first use.
pub fn unix_channel(path: &Path) -> Channel {
    let path = path.to_owned();
    Endpoint::from_static("http://localhost").connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
    }))
}

/// cri-imaged served in this process against a runtime socket, started the way `main` starts it
/// (the same composition root, the event watcher included).
pub struct InProcessDaemon {
    pub socket: PathBuf,
    stop: Option<ShutdownTrigger>,
    task: JoinHandle<()>,
}

impl InProcessDaemon {
    /// Serves on `socket` with the kubelet's defaults, talking to the runtime at `runtime_socket`.
    pub async fn start(socket: &Path, runtime_socket: &Path) -> Self {
        Self::start_with(socket, runtime_socket, ManagerConfig::default()).await
    }

    /// As [`InProcessDaemon::start`], with `config`; probes health every 50 ms.
    pub async fn start_with(socket: &Path, runtime_socket: &Path, config: ManagerConfig) -> Self {
        Self::start_with_credentials(socket, runtime_socket, config, NodeCredentials::none()).await
    }

    /// As [`InProcessDaemon::start_with`], with the node's own credentials.
    pub async fn start_with_credentials(
        socket: &Path,
        runtime_socket: &Path,
        config: ManagerConfig,
        node_credentials: NodeCredentials,
    ) -> Self {
        let runtime_endpoint = RuntimeEndpoint::parse(&runtime_socket.to_string_lossy()).expect("runtime socket path");
        let (listener, _socket_file) = cri_imaged::listener::bind(socket).await.expect("daemon binds");
        let settings = Settings {
            runtime_endpoint,
            runtime_request_timeout: Duration::from_secs(10),
            manager: config,
            image_gc: cri_imaged::gc::GcConfig::off(),
            pre_pulls: cri_imaged::prepull::PrePullConfig::default(),
            policy: Default::default(),
            node_credentials: Arc::new(node_credentials),
            registry_hosts: Default::default(),
            root_dir: socket.parent().expect("the socket is in a directory").join("root"),
            kubelet_root_dir: None,
            serve: ServeOptions {
                drain_timeout: Duration::from_secs(5),
                health_probe_interval: Duration::from_millis(50),
                health_probe_timeout: Duration::from_millis(500),
                liveness_runtime_timeout: None,
                limits: cri_imaged::server::ServeLimits::default(),
                access: Arc::default(),
            },
            presence_cache: true,
            image_store_path: None,
            metrics: None,
            reload: None,
            kubelet_warnings: Default::default(),
        };
        let (stop, shutdown) = cri_imaged::shutdown::channel();
        let task = tokio::spawn(async move {
            cri_imaged::daemon::serve(listener, settings, shutdown).await.expect("daemon serves");
        });
        Self { socket: socket.to_owned(), stop: Some(stop), task }
    }

    pub fn client(&self) -> ImageManagerClient<Channel> {
        ImageManagerClient::new(unix_channel(&self.socket))
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            stop.request();
        }
        let _ = (&mut self.task).await;
    }
}

/// A scripted runtime and the daemon in front of it, in a temp dir that lives as long as they do.
pub struct FakeStack {
    pub runtime: fake_runtime::FakeRuntime,
    pub daemon: InProcessDaemon,
    pub dir: tempfile::TempDir,
}

impl FakeStack {
    pub async fn start(config: ManagerConfig) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let service = fake_runtime::FakeImageService::default();
        let runtime = fake_runtime::FakeRuntime::start(&dir.path().join("runtime.sock"), service);
        let daemon = InProcessDaemon::start_with(&dir.path().join("cri-imaged.sock"), &runtime.socket, config).await;
        Self { runtime, daemon, dir }
    }
}

/// An EnsureImageExists request for `image` with `policy` (an `api::PullPolicy` as i32).
pub fn ensure(image: &str, policy: i32) -> EnsureImageExistsRequest {
    EnsureImageExistsRequest {
        image: image.into(),
        pull_policy: policy,
        pod: Some(cri_imaged::api::PodRef {
            namespace: "default".into(),
            name: "web".into(),
            uid: "0b7c6d5e-uid".into(),
            annotations: Default::default(),
        }),
        container_name: "app".into(),
        ..Default::default()
    }
}

/// Calls EnsureImageExists.
pub async fn call(
    client: &mut ImageManagerClient<Channel>,
    request: EnsureImageExistsRequest,
) -> Result<EnsureImageExistsResponse, tonic::Status> {
    client.ensure_image_exists(request).await.map(tonic::Response::into_inner)
}

/// The ErrorInfo reason of a status; panics when the status carries none.
/// Whether `message` is containerd's refusal of a pull the registry did not authorise: 1.6 and 1.7
/// quote the registry's `401 Unauthorized`, 2.x says the authorization failed.
pub fn refused_as_unauthorized(message: &str) -> bool {
    message.contains("401 Unauthorized") || message.contains("authorization failed")
}

pub fn reason(status: &tonic::Status) -> String {
    let details = status.get_error_details();
    let info = details.error_info().unwrap_or_else(|| panic!("status without ErrorInfo: {status:?}"));
    info.reason.clone()
}

/// Waits, at most `limit`, until the health of `service` on `socket` is `wanted`. A service not
/// registered yet (the daemon's first probe has not run) is waited for too.
pub async fn wait_for_health(socket: &Path, service: &str, wanted: ServingStatus, limit: Duration) {
    let mut client = HealthClient::new(unix_channel(socket));
    let watch = async {
        loop {
            let request = HealthCheckRequest { service: service.into() };
            let mut stream = match client.watch(request).await {
                Ok(stream) => stream.into_inner(),
                Err(status) if status.code() == tonic::Code::NotFound => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
                Err(status) => panic!("health watch: {status:?}"),
            };
            while let Some(update) = stream.message().await.expect("health stream") {
                if update.status == wanted as i32 {
                    return;
                }
            }
            panic!("health stream ended before {service} became {wanted:?}");
        }
    };
    tokio::time::timeout(limit, watch)
        .await
        .unwrap_or_else(|_| panic!("{service} did not become {wanted:?} within {limit:?}"));
}

/// One unary gRPC call over raw HTTP/2, with `grpc-timeout` sent as a plain header, so that no
/// client-side timer races the server: returns the server's own (grpc-status, grpc-message).
pub async fn raw_grpc_call(socket: &Path, path: &str, message: &[u8], grpc_timeout: &str) -> (i32, String) {
    let status = raw_unary(h2_connection(socket).await, path, message, grpc_timeout).await;
    (status.code() as i32, status.message().to_owned())
}

/// An HTTP/2 connection to `socket`, driven in the background.
pub async fn h2_connection(socket: &Path) -> h2::client::SendRequest<bytes::Bytes> {
    let stream = UnixStream::connect(socket).await.expect("connect");
    let (client, connection) = h2::client::handshake(stream).await.expect("h2 handshake");
    tokio::spawn(connection);
    client
}

/// A gRPC request's headers for `path`, with `grpc_timeout` as a plain header when given.
pub fn grpc_request(path: &str, grpc_timeout: Option<&str>) -> http::Request<()> {
    let mut request = http::Request::post(format!("http://localhost{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(timeout) = grpc_timeout {
        request = request.header("grpc-timeout", timeout);
    }
    request.body(()).expect("request")
}

/// One unary gRPC call on an HTTP/2 connection, `grpc-timeout` a plain header (tonic's client
/// would time the call itself and answer CANCELLED first): the server's own status, its details
/// included (OK for an answer).
pub async fn raw_unary(
    client: h2::client::SendRequest<bytes::Bytes>,
    path: &str,
    message: &[u8],
    grpc_timeout: &str,
) -> tonic::Status {
    let mut client = client.ready().await.expect("h2 ready");
    let (response, mut body) =
        client.send_request(grpc_request(path, Some(grpc_timeout)), false).expect("send headers");
    let mut frame = vec![0u8];
    frame.extend_from_slice(&u32::try_from(message.len()).expect("small message").to_be_bytes());
    frame.extend_from_slice(message);
    body.send_data(frame.into(), true).expect("send message");
    response_status(response).await
}

/// Polls `condition` every 20 ms until it holds, for at most `limit`; fails naming `what`.
pub async fn eventually(what: &str, limit: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !condition() {
        assert!(tokio::time::Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The status an HTTP/2 gRPC response ends with: from its headers (a trailers-only answer) or
/// its trailers, message decoded and details kept.
pub async fn response_status(response: h2::client::ResponseFuture) -> tonic::Status {
    let mut response = response.await.expect("response");
    if let Some(status) = tonic::Status::from_header_map(response.headers()) {
        return status;
    }
    let body = response.body_mut();
    while let Some(chunk) = body.data().await {
        chunk.expect("body");
    }
    let trailers = body.trailers().await.expect("trailers").expect("grpc trailers");
    tonic::Status::from_header_map(&trailers).expect("a grpc-status trailer")
}
