//! End to end: the real binary against a real containerd pulling from a loopback registry.
//! Images are built by the harness as OCI layouts and pushed; nothing is mocked.

mod support;

use std::time::Duration;

use cri_imaged::api::{
    EnsureImageExistsResponse, PullPolicy, WatchEventsRequest, image_manager_client::ImageManagerClient,
};
use cri_imaged::cri::{ImageSpec, PullImageRequest, image_service_client::ImageServiceClient};
use support::{
    call, ensure,
    process::{DaemonProcess, grpcurl, http_get, metric, metric_with_label, metrics_listen, require_tool},
    reason,
    stack::LocalStack,
    unix_channel,
};
use tonic::{Code, transport::Channel};

const ALWAYS: i32 = PullPolicy::Always as i32;
const IF_NOT_PRESENT: i32 = PullPolicy::IfNotPresent as i32;
const NEVER: i32 = PullPolicy::Never as i32;

struct E2e {
    stack: LocalStack,
    daemon: DaemonProcess,
    client: ImageManagerClient<Channel>,
    _dir: tempfile::TempDir,
}

async fn e2e() -> Option<E2e> {
    e2e_with(&[]).await
}

async fn e2e_with(flags: &[&str]) -> Option<E2e> {
    let stack = LocalStack::start()?;
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, flags).await;
    let client = ImageManagerClient::new(unix_channel(&daemon.socket));
    Some(E2e { stack, daemon, client, _dir: dir })
}

/// A CRI PullImage of `image`, without credentials.
fn cri_pull(image: &str) -> PullImageRequest {
    PullImageRequest { image: Some(ImageSpec { image: image.into(), ..Default::default() }), ..Default::default() }
}

fn assert_pulled(response: &EnsureImageExistsResponse, image: &str) {
    assert!(response.pulled, "{image} should have been pulled: {response:?}");
    assert!(response.image_ref.starts_with("sha256:"), "containerd's image id: {response:?}");
    assert!(response.image_size_bytes > 0, "containerd reports a size: {response:?}");
    assert!(response.message.starts_with(&format!("Successfully pulled image {image:?} in ")), "{response:?}");
}

#[tokio::test]
async fn policies_against_absent_and_present_images_behave_as_the_kubelet() {
    let Some(mut t) = e2e().await else { return };
    t.stack.seed("e2e/app:v1", "app v1");
    let image = t.stack.image("e2e/app:v1");

    // Absent × Never: refused without touching the registry.
    let status = call(&mut t.client, ensure(&image, NEVER)).await.expect_err("absent, never");
    assert_eq!((status.code(), reason(&status).as_str()), (Code::FailedPrecondition, "ErrImageNeverPull"));
    assert_eq!(status.message(), format!("Container image {image:?} is not present with pull policy of Never"));
    assert_eq!(t.stack.manifest_requests("e2e/app"), 0);

    // Absent × IfNotPresent: pulled.
    let pulled = call(&mut t.client, ensure(&image, IF_NOT_PRESENT)).await.expect("absent, if-not-present");
    assert_pulled(&pulled, &image);
    let after_pull = t.stack.manifest_requests("e2e/app");
    assert!(after_pull >= 1, "the registry served the manifest");

    // Present × IfNotPresent and Never: used as is, the registry untouched.
    for policy in [IF_NOT_PRESENT, NEVER] {
        let present = call(&mut t.client, ensure(&image, policy)).await.expect("present");
        assert!(!present.pulled);
        assert_eq!(present.image_ref, pulled.image_ref);
        assert_eq!(present.image_size_bytes, pulled.image_size_bytes);
        assert_eq!(
            present.message,
            format!("Container image {image:?} already present on machine and can be accessed by the pod")
        );
    }
    assert_eq!(t.stack.manifest_requests("e2e/app"), after_pull);

    // Present × Always: pulled again, so the registry is asked again.
    let again = call(&mut t.client, ensure(&image, ALWAYS)).await.expect("present, always");
    assert_pulled(&again, &image);
    assert_eq!(again.image_ref, pulled.image_ref, "same image, same id");
    assert!(t.stack.manifest_requests("e2e/app") > after_pull);

    // Absent × Always: pulled.
    t.stack.seed("e2e/other:v1", "other v1");
    let other = t.stack.image("e2e/other:v1");
    assert_pulled(&call(&mut t.client, ensure(&other, ALWAYS)).await.expect("absent, always"), &other);

    let log = t.daemon.log_text();
    assert!(log.contains(&format!("Pulling image {image:?}")), "the daemon logs in the kubelet's words:\n{log}");
    assert!(log.contains("including waiting). Image size: "), "{log}");
}

#[tokio::test]
async fn untagged_image_gets_latest_and_a_digest_reference_pulls_by_digest() {
    let Some(mut t) = e2e().await else { return };
    t.stack.seed("e2e/plain:latest", "plain latest");
    let digest = t.stack.seed("e2e/pinned:v3", "pinned v3");

    let untagged = t.stack.image("e2e/plain");
    assert_pulled(&call(&mut t.client, ensure(&untagged, 0)).await.expect("untagged pulls :latest"), &untagged);

    let by_digest = format!("{}@{digest}", t.stack.image("e2e/pinned"));
    assert_pulled(&call(&mut t.client, ensure(&by_digest, 0)).await.expect("by digest"), &by_digest);
    // Unspecified policy with a digest is IfNotPresent: the second call uses what is there.
    assert!(!call(&mut t.client, ensure(&by_digest, 0)).await.expect("present by digest").pulled);
}

#[tokio::test]
async fn a_missing_image_is_err_image_pull_not_found() {
    let Some(mut t) = e2e().await else { return };
    let image = t.stack.image("e2e/missing:v1");
    let status = call(&mut t.client, ensure(&image, IF_NOT_PRESENT)).await.expect_err("missing");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert_eq!(reason(&status), "ErrImagePull");
    assert!(status.message().starts_with("rpc error: code = NotFound desc = failed to pull and unpack image"));
    assert!(status.message().contains("not found"), "{}", status.message());
}

/// A registry that refuses the connection is `RegistryUnavailable` from the first pull, as CRI-O
/// names it: to EnsureImageExists the kubelet's reason, and its words around containerd's own
/// message; through CRI PullImage, containerd's answer with the name before it (UNKNOWN, the form
/// the kubelet's CRI client hands to its prefix test); the pull's event, its metric and the CLI
/// say so too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_that_refuses_connections_is_registry_unavailable_from_the_first_pull() {
    let (port, listen) = metrics_listen();
    let Some(mut t) = e2e_with(&["--metrics-listen", &listen]).await else { return };
    // Port 1 on loopback: nothing listens there, so the connection is refused at once.
    let image = "127.0.0.1:1/e2e/app:v1";
    let mut containerd = ImageServiceClient::new(unix_channel(&t.stack.containerd_socket));
    let direct = containerd.pull_image(cri_pull(image)).await.expect_err("refused straight to containerd");
    eprintln!("containerd on a refused connection: {:?}: {}", direct.code(), direct.message());
    assert_eq!(direct.code(), Code::Unknown, "{direct:?}");
    assert!(direct.message().contains("connect: connection refused"), "{}", direct.message());
    let mut events = t.client.watch_events(WatchEventsRequest::default()).await.expect("watching").into_inner();

    let status = call(&mut t.client, ensure(image, IF_NOT_PRESENT)).await.expect_err("refused");
    assert_eq!((status.code(), reason(&status).as_str()), (Code::Unavailable, "RegistryUnavailable"), "{status:?}");
    let kubelets = format!("image pull failed for {image} because the registry is unavailable: {}", direct.message());
    assert_eq!(status.message(), kubelets);
    let failed = loop {
        let event = tokio::time::timeout(Duration::from_secs(5), events.message()).await;
        let event = event.expect("an event within 5 s").expect("the stream goes on").expect("an event");
        if event.reason == "Failed" {
            break event;
        }
    };
    assert_eq!(failed.message, format!("Failed to pull image {image:?}: RegistryUnavailable: {}", direct.message()));

    let mut through = ImageServiceClient::new(unix_channel(&t.daemon.socket));
    let cri = through.pull_image(cri_pull(image)).await.expect_err("refused through cri-imaged");
    assert_eq!(cri.code(), Code::Unknown, "{cri:?}");
    assert_eq!(cri.message(), format!("RegistryUnavailable: {}", direct.message()));

    let socket = format!("--socket={}", t.daemon.socket.display());
    let cli = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_cri-imaged")).args(["pull", &socket, image]).output()
    });
    let cli = cli.await.expect("joined").expect("cri-imaged runs");
    let stderr = String::from_utf8_lossy(&cli.stderr);
    assert_eq!(cli.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim_end(), format!("cri-imaged: RegistryUnavailable: {kubelets}"));

    let counted = tokio::task::spawn_blocking(move || {
        ["registry_unavailable", "failure"]
            .map(|result| metric_with_label(port, "cri_imaged_pulls_total", &format!(r#"result="{result}""#)))
    });
    assert_eq!(counted.await.expect("metrics"), [3.0, 0.0], "each of the three pulls, as registry_unavailable");
}

#[tokio::test]
async fn invalid_names_are_refused_before_containerd_is_asked() {
    let Some(mut t) = e2e().await else { return };
    let long_path = format!("{}/{}:v1", t.stack.registry, "a".repeat(256));
    for image in ["", "team/App", "app:bad tag", "app@sha256:short", &"f".repeat(64), &long_path] {
        let status = call(&mut t.client, ensure(image, IF_NOT_PRESENT)).await.expect_err(image);
        assert_eq!(status.code(), Code::InvalidArgument, "{image:?}: {status:?}");
        assert_eq!(reason(&status), "InvalidImageName", "{image:?}");
        assert!(status.message().starts_with("Failed to apply default image tag"), "{}", status.message());
    }
}

#[tokio::test]
async fn grpcurl_pulls_through_the_daemon_into_containerd() {
    let Some(t) = e2e().await else { return };
    let Some(grpcurl_bin) = require_tool("grpcurl") else { return };
    t.stack.seed("e2e/curl:v1", "curl v1");
    let body =
        format!(r#"{{"image":"{}","pod":{{"namespace":"default","name":"web"}}}}"#, t.stack.image("e2e/curl:v1"));
    let method = "imagemanager.v1.ImageManager/EnsureImageExists";
    let socket = t.daemon.socket.clone();
    let run = move || grpcurl(&grpcurl_bin, &socket, &["-d", &body], &[method]);

    let (ok, first, err) = tokio::task::spawn_blocking(run.clone()).await.expect("grpcurl");
    assert!(ok, "{err}");
    assert!(first.contains(r#""pulled": true"#), "{first}");
    let (ok, second, err) = tokio::task::spawn_blocking(run).await.expect("grpcurl");
    assert!(ok, "{err}");
    assert!(second.contains("already present on machine"), "{second}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_herd_of_two_hundred_requests_makes_one_manifest_resolution() {
    let Some(stack) = LocalStack::start() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let (port, metrics_addr) = metrics_listen();
    let flags = ["--metrics-listen", metrics_addr.as_str()];
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &flags).await;
    stack.seed("herd/app:v1", "herd v1");
    let image = stack.image("herd/app:v1");

    let channel = unix_channel(&daemon.socket);
    let calls: Vec<_> = (0..200)
        .map(|pod| {
            let mut client = ImageManagerClient::new(channel.clone());
            let mut request = ensure(&image, IF_NOT_PRESENT);
            request.pod.as_mut().expect("pod").uid = format!("herd-pod-{pod}");
            tokio::spawn(async move { call(&mut client, request).await })
        })
        .collect();
    let (mut pulled, mut refs) = (0, std::collections::HashSet::new());
    for call in calls {
        let response = call.await.expect("task").expect("every request succeeds");
        pulled += usize::from(response.pulled);
        refs.insert(response.image_ref);
    }
    let resolutions = stack.manifest_resolutions("herd/app", "v1");
    let metrics = tokio::task::spawn_blocking(move || http_get(port, "/metrics")).await.expect("metrics");
    let joins = metrics.lines().find(|l| l.starts_with("cri_imaged_pull_joins_total ")).unwrap_or_default().to_owned();
    eprintln!(
        "herd: 200 requests, {pulled} answered by the pull ({joins}), the rest already present; {resolutions} manifest resolution(s)"
    );

    assert_eq!(refs.len(), 1, "one image ref for everyone");
    assert_eq!(resolutions, 1, "the registry resolved the tag once");
    assert!(pulled >= 1, "someone pulled");
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(metrics.contains(r#"cri_imaged_pulls_total{result="success"} 1"#), "{metrics}");
    let pulled_requests =
        format!(r#"cri_imaged_image_pull_duration_seconds_count{{image_size_in_bytes="0-10MB"}} {pulled}"#);
    assert!(metrics.lines().any(|line| line == pulled_requests), "{pulled_requests} in:\n{metrics}");

    // As Prometheus reads it, the kubelet's names beside ours.
    let body = metrics.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    let samples = openmetrics_samples(body);
    let kubelets = samples.iter().find(|sample| {
        sample["name"] == "kubelet_image_pull_duration_seconds_count"
            && sample["labels"]["image_size_in_bytes"] == "0-10MB"
    });
    assert_eq!(kubelets.map(|sample| sample["value"].as_f64()), Some(Some(pulled as f64)), "{samples:?}");
}

/// Every sample of an OpenMetrics `text`, as Prometheus's own Python parser reads it
/// (`tests/clients/parse_metrics.py`); a text it refuses fails the test.
fn openmetrics_samples(text: &str) -> Vec<serde_json::Value> {
    use std::io::Write;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/parse_metrics.py");
    let mut child = std::process::Command::new("python3")
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    child.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("written");
    let output = child.wait_with_output().expect("parsed");
    assert!(output.status.success(), "{}\n{text}", String::from_utf8_lossy(&output.stderr));
    let lines = String::from_utf8(output.stdout).expect("utf-8");
    lines.lines().map(|line| serde_json::from_str(line).expect("a JSON sample")).collect()
}

#[tokio::test]
async fn the_presence_cache_forgets_an_image_removed_behind_its_back() {
    let Some(stack) = LocalStack::start() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let (port, metrics_addr) = metrics_listen();
    let flags = ["--metrics-listen", metrics_addr.as_str()];
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &flags).await;
    let mut client = ImageManagerClient::new(unix_channel(&daemon.socket));
    stack.seed("cache/app:v1", "cache v1");
    let image = stack.image("cache/app:v1");
    let metric = |name: &'static str| async move {
        tokio::task::spawn_blocking(move || metric(port, name)).await.expect("metrics") as u64
    };
    // Watching starts once our marker event comes back from containerd.
    for _ in 0..250 {
        if metric("cri_imaged_presence_cache_watching").await == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(metric("cri_imaged_presence_cache_watching").await, 1, "{}", daemon.log_text());

    assert!(call(&mut client, ensure(&image, IF_NOT_PRESENT)).await.expect("pull").pulled);
    // The pull's own image events may still be on their way and void an answer or two.
    for _ in 0..100 {
        assert!(!call(&mut client, ensure(&image, IF_NOT_PRESENT)).await.expect("present").pulled);
        if metric("cri_imaged_presence_cache_hits_total").await > 0 {
            break;
        }
    }
    assert!(metric("cri_imaged_presence_cache_hits_total").await > 0, "a presence answer was remembered");

    // Removed straight on containerd, not through cri-imaged: only the event tells.
    let invalidations = metric("cri_imaged_presence_cache_invalidations_total").await;
    let mut runtime =
        cri_imaged::cri::image_service_client::ImageServiceClient::new(unix_channel(&stack.containerd_socket));
    let spec = cri_imaged::cri::ImageSpec { image: image.clone(), ..Default::default() };
    runtime
        .remove_image(cri_imaged::cri::RemoveImageRequest { image: Some(spec) })
        .await
        .expect("containerd removes it");
    for _ in 0..250 {
        if metric("cri_imaged_presence_cache_invalidations_total").await > invalidations {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(metric("cri_imaged_presence_cache_invalidations_total").await > invalidations, "no image event arrived");
    let again = call(&mut client, ensure(&image, IF_NOT_PRESENT)).await.expect("pulled again");
    assert_pulled(&again, &image);
}
