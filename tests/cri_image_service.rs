//! `runtime.v1.ImageService` served by cri-imaged, against scripted runtimes: forwarding without
//! loss, PullImage through the scheduler, errors unchanged, credentials never logged.

mod support;

use std::{convert::Infallible, future::Future, pin::Pin, sync::Arc, time::Duration};

use bytes::Bytes;
use cri_imaged::cri::{
    AuthConfig, ImageFsInfoRequest, ImageSpec, ImageStatusRequest, ListImagesRequest, PullImageRequest,
    RemoveImageRequest, image_service_client::ImageServiceClient,
};
use cri_imaged::{
    api::{GarbageCollectRequest, image_manager_client::ImageManagerClient},
    ensure::ManagerConfig,
    runtime::passthrough::RawCodec,
};
use support::{
    FakeStack, InProcessDaemon,
    fake_runtime::{FakeImageService, FakeRuntime},
    process::DaemonProcess,
    raw_grpc_call, unix_channel,
};
use tokio::sync::Notify;
use tonic::{Code, Status, codegen::http::uri::PathAndQuery, transport::Channel};

async fn stack() -> FakeStack {
    FakeStack::start(ManagerConfig::default()).await
}

fn cri(socket: &std::path::Path) -> ImageServiceClient<Channel> {
    ImageServiceClient::new(unix_channel(socket))
}

fn pull_request(image: &str) -> PullImageRequest {
    PullImageRequest { image: Some(ImageSpec { image: image.into(), ..Default::default() }), ..Default::default() }
}

#[tokio::test]
async fn reads_and_removals_answer_as_the_runtime_does() {
    let stack = stack().await;
    stack.runtime.service.add_image("busybox:1.36", "sha256:abc", 1234);
    let mut through = cri(&stack.daemon.socket);
    let mut direct = cri(&stack.runtime.socket);

    let listed = through.list_images(ListImagesRequest::default()).await.expect("list").into_inner();
    assert_eq!(listed, direct.list_images(ListImagesRequest::default()).await.expect("list").into_inner());
    assert_eq!(listed.images.len(), 1);

    let status = ImageStatusRequest {
        image: Some(ImageSpec { image: "busybox:1.36".into(), ..Default::default() }),
        verbose: false,
    };
    let through_status = through.image_status(status.clone()).await.expect("status").into_inner();
    assert_eq!(through_status, direct.image_status(status).await.expect("status").into_inner());
    assert_eq!(through_status.image.map(|image| image.id).as_deref(), Some("sha256:abc"));

    let fs = through.image_fs_info(ImageFsInfoRequest {}).await.expect("fs info").into_inner();
    assert_eq!(fs.image_filesystems.len(), 1);
    let remove = RemoveImageRequest { image: Some(ImageSpec { image: "missing:1".into(), ..Default::default() }) };
    through.remove_image(remove).await.expect("removing a missing image succeeds");
}

#[tokio::test]
async fn concurrent_cri_pulls_of_one_image_share_one_upstream_pull() {
    let stack = stack().await;
    let gate = Arc::new(Notify::new());
    stack.runtime.service.script.lock().unwrap().pull_gate = Some(gate.clone());
    let pulls: Vec<_> = (0..100)
        .map(|_| {
            let mut client = cri(&stack.daemon.socket);
            tokio::spawn(async move { client.pull_image(pull_request("herd:v1")).await })
        })
        .collect();
    for _ in 0..500 {
        if !stack.runtime.service.pulls().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    gate.notify_waiters();
    let mut refs = std::collections::HashSet::new();
    for pull in pulls {
        refs.insert(pull.await.expect("task").expect("pull succeeds").into_inner().image_ref);
    }
    assert_eq!(refs.len(), 1);
    assert_eq!(stack.runtime.service.pulls().len(), 1);
}

#[tokio::test]
async fn a_dozen_pulls_in_a_second_succeed_with_default_flags() {
    let stack = stack().await;
    let mut client = cri(&stack.daemon.socket);
    for i in 0..12 {
        client.pull_image(pull_request(&format!("image-{i}:v1"))).await.expect("waits for a token instead of failing");
    }
    assert_eq!(stack.runtime.service.pulls().len(), 12);
}

#[tokio::test]
async fn runtime_errors_reach_the_cri_caller_unchanged() {
    let stack = stack().await;
    let runtime_status = Status::with_details(
        Code::NotFound,
        "failed to resolve reference: not found",
        Bytes::from_static(b"\x0a\x01x"),
    );
    stack.runtime.service.fail_pull("missing:v1", runtime_status);
    let status = cri(&stack.daemon.socket).pull_image(pull_request("missing:v1")).await.expect_err("not found");
    assert_eq!(status.code(), Code::NotFound);
    assert_eq!(status.message(), "failed to resolve reference: not found");
    assert_eq!(status.details(), b"\x0a\x01x");
}

#[tokio::test]
async fn a_one_millisecond_deadline_ends_in_deadline_exceeded() {
    let stack = stack().await;
    let _gate = {
        let gate = Arc::new(Notify::new());
        stack.runtime.service.script.lock().unwrap().pull_gate = Some(gate.clone());
        gate
    };
    let message = prost::Message::encode_to_vec(&pull_request("slow:v1"));
    let path = "/runtime.v1.ImageService/PullImage";
    let (code, message) = raw_grpc_call(&stack.daemon.socket, path, &message, "1m").await;
    assert_eq!(Code::from(code), Code::DeadlineExceeded, "the server itself answers: {message}");
}

/// A runtime that answers ImageStatus with the request's own bytes, to see what arrives.
#[derive(Clone)]
struct EchoRuntime;

impl tonic::server::NamedService for EchoRuntime {
    const NAME: &'static str = "runtime.v1.ImageService";
}

impl tower::Service<http::Request<tonic::body::Body>> for EchoRuntime {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let echo = tower::service_fn(|call: tonic::Request<Bytes>| async move {
            Ok::<_, Status>(tonic::Response::new(call.into_inner()))
        });
        Box::pin(async move { Ok(tonic::server::Grpc::new(RawCodec).unary(echo, request).await) })
    }
}

#[tokio::test]
async fn fields_unknown_to_our_bindings_pass_through_both_ways() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime_socket = dir.path().join("echo.sock");
    let listener = tokio::net::UnixListener::bind(&runtime_socket).expect("bind echo runtime");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(EchoRuntime)
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let daemon = InProcessDaemon::start(&dir.path().join("cri-imaged.sock"), &runtime_socket).await;

    // ImageStatusRequest{image: {image: "busybox"}} plus field 99 (a string) that no CRI version has.
    let mut message = vec![0x0a, 0x09, 0x0a, 0x07];
    message.extend_from_slice(b"busybox");
    message.extend_from_slice(&[0x9a, 0x06, 0x05]);
    message.extend_from_slice(b"extra");
    let mut grpc = tonic::client::Grpc::new(unix_channel(&daemon.socket));
    grpc.ready().await.expect("ready");
    let path = PathAndQuery::from_static("/runtime.v1.ImageService/ImageStatus");
    let answer = grpc.unary(tonic::Request::new(Bytes::from(message.clone())), path, RawCodec).await.expect("echoed");
    assert_eq!(answer.into_inner(), Bytes::from(message), "the runtime got, and we returned, every byte");
}

#[tokio::test]
async fn credentials_never_reach_the_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), FakeImageService::default());
    runtime.service.fail_pull("private:v1", Status::unauthenticated("bad credentials"));
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &runtime.socket, &[]).await;
    let secret_fields = AuthConfig {
        username: "alice-user".into(),
        password: "p4ss-w0rd-secret".into(),
        auth: "YWxpY2U6cDRzcw==".into(),
        identity_token: "identity-token-secret".into(),
        registry_token: "registry-token-secret".into(),
        server_address: "registry.local".into(),
    };
    let mut client = cri(&daemon.socket);
    for image in ["public:v1", "private:v1"] {
        let request = PullImageRequest { auth: Some(secret_fields.clone()), ..pull_request(image) };
        let _ = client.pull_image(request).await;
    }
    let pulls = runtime.service.pulls();
    assert_eq!(
        pulls[0].auth.as_ref().map(|auth| auth.password.as_str()),
        Some("p4ss-w0rd-secret"),
        "passed as received"
    );
    let (_, log) = daemon.terminate().await;
    assert!(log.contains("Pulling image"), "the pulls were logged:\n{log}");
    for secret in
        ["alice-user", "p4ss-w0rd-secret", "YWxpY2U6cDRzcw==", "identity-token-secret", "registry-token-secret"]
    {
        assert!(!log.contains(secret), "{secret} leaked into the log:\n{log}");
    }
}

#[tokio::test]
async fn a_split_image_filesystem_passes_through_and_image_gc_measures_the_image_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = FakeRuntime::start_for_gc(&dir.path().join("runtime.sock"), FakeImageService::default());
    let daemon =
        InProcessDaemon::start_with(&dir.path().join("d.sock"), &runtime.socket, ManagerConfig::default()).await;
    // A tmpfs has a size of its own, unlike the root filesystem.
    let image_fs = std::path::PathBuf::from("/dev/shm");
    {
        let mut script = runtime.service.script.lock().unwrap();
        script.image_fs = Some(image_fs.clone());
        script.container_fs = Some("/".into());
    }
    let through = cri(&daemon.socket).image_fs_info(ImageFsInfoRequest {}).await.expect("through").into_inner();
    let direct = cri(&runtime.socket).image_fs_info(ImageFsInfoRequest {}).await.expect("direct").into_inner();
    assert_eq!(through, direct);
    let container_fs = through.container_filesystems.first().and_then(|fs| fs.fs_id.clone());
    assert_eq!(container_fs.map(|id| id.mountpoint).as_deref(), Some("/"));

    let mut api = ImageManagerClient::new(unix_channel(&daemon.socket));
    let asked = GarbageCollectRequest { dry_run: true, delete_unused: false };
    let report = api.garbage_collect(asked).await.expect("a dry run").into_inner();
    let (capacity, _) = support::stack::statfs(&image_fs);
    assert_ne!(capacity, support::stack::statfs(std::path::Path::new("/")).0, "two filesystems of different sizes");
    assert_eq!(report.usage_before.map(|usage| usage.capacity_bytes), Some(capacity), "the image filesystem's");
}

#[tokio::test]
async fn an_image_listed_for_two_runtime_handlers_is_collected_for_each_by_its_handler() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = FakeRuntime::start_for_gc(&dir.path().join("runtime.sock"), FakeImageService::default());
    {
        // KEP-4216: the runtime lists one image id once per runtime handler it keeps it for.
        let mut script = runtime.service.script.lock().unwrap();
        script.image_fs = Some("/dev/shm".into());
        let image = |handler: &str| cri_imaged::cri::Image {
            id: "sha256:aa".into(),
            repo_tags: vec!["a:1".into()],
            size: 4096,
            spec: Some(ImageSpec { image: "sha256:aa".into(), runtime_handler: handler.into(), ..Default::default() }),
            ..Default::default()
        };
        script.images.insert("a:1".into(), image(""));
        script.images.insert("a:1 for kata".into(), image("kata"));
    }
    let socket = dir.path().join("cri-imaged.sock");
    let daemon = DaemonProcess::start(&socket, &runtime.socket, &["--minimum-image-ttl-duration", "0s"]).await;
    let mut api = ImageManagerClient::new(unix_channel(&socket));
    let asked = GarbageCollectRequest { dry_run: false, delete_unused: true };
    let report = api.garbage_collect(asked).await.expect("a pass").into_inner();
    let mut chosen: Vec<(String, String, bool)> =
        report.images.into_iter().map(|image| (image.image_id, image.runtime_handler, image.removed)).collect();
    chosen.sort();
    let expected = [("sha256:aa", "", true), ("sha256:aa", "kata", true)];
    assert_eq!(chosen, expected.map(|(id, handler, removed)| (id.to_owned(), handler.to_owned(), removed)));
    let mut removals: Vec<(String, String)> = (runtime.service.script.lock().unwrap().removals.iter())
        .map(|spec| (spec.image.clone(), spec.runtime_handler.clone()))
        .collect();
    removals.sort();
    let expected = [("sha256:aa", ""), ("sha256:aa", "kata")];
    assert_eq!(removals, expected.map(|(id, handler)| (id.to_owned(), handler.to_owned())), "each by its handler");
    daemon.terminate().await;
}
