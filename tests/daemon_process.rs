//! The real binary: signals, its socket, a missing runtime, and grpcurl against it.

mod support;

use std::{os::unix::fs::PermissionsExt, sync::Arc, time::Duration};

use cri_imaged::cri::{ImageSpec, ImageStatusRequest, image_service_client::ImageServiceClient};
use support::{
    call, ensure,
    fake_runtime::{FakeImageService, FakeRuntime},
    process::{DaemonProcess, grpcurl, require_tool},
    reason, wait_for_health,
};
use tokio::sync::Notify;
use tonic::Code;
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient};

const IF_NOT_PRESENT: i32 = cri_imaged::api::PullPolicy::IfNotPresent as i32;

#[tokio::test]
async fn sigterm_stops_the_daemon_cleanly_and_removes_its_socket() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("run/cri-imaged.sock");
    let daemon = DaemonProcess::start(&socket, &dir.path().join("no-runtime.sock"), &[]).await;
    let mode = std::fs::metadata(&socket).expect("socket").permissions().mode() & 0o777;
    assert_eq!(mode, 0o660);

    let (status, log) = daemon.terminate().await;
    assert!(status.success(), "exit status {status:?}; log:\n{log}");
    assert!(log.contains("received SIGTERM"), "{log}");
    assert!(!socket.exists(), "the socket is removed on a clean stop");
}

/// A systemd restart or a rolling update: the old daemon drains a pull that never ends while its
/// successor binds the same path; the old one's exit must not take the new one's socket.
#[tokio::test]
async fn a_draining_daemon_leaves_its_successor_s_socket_in_place() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), FakeImageService::default());
    runtime.service.script.lock().unwrap().pull_gate = Some(Arc::new(Notify::new()));
    let socket = dir.path().join("cri-imaged.sock");
    let mut old = DaemonProcess::start(&socket, &runtime.socket, &[]).await;
    let mut client = daemon_client(&old);
    let stuck = tokio::spawn(async move { call(&mut client, ensure("busybox:1.36", IF_NOT_PRESENT)).await });
    wait_until("the pull reaches the runtime", || runtime.service.pulls().len() == 1).await;

    old.send_sigterm();
    wait_until("the old daemon stops accepting", || std::os::unix::net::UnixStream::connect(&socket).is_err()).await;
    let new = DaemonProcess::start(&socket, &runtime.socket, &[]).await;
    assert!(new.log_text().contains("replacing stale socket"), "{}", new.log_text());
    let status = old.wait_for_exit(Duration::from_secs(10)).await;
    assert!(status.success(), "the old daemon drained and exited: {}", old.log_text());
    let _ = stuck.await;

    assert!(socket.exists(), "the successor's socket is still there");
    let mut health = HealthClient::new(support::unix_channel(&socket));
    health.check(HealthCheckRequest { service: String::new() }).await.expect("the successor answers");
}

#[tokio::test]
async fn a_request_still_running_at_the_drain_deadline_is_told_the_daemon_is_shutting_down() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), FakeImageService::default());
    runtime.service.script.lock().unwrap().pull_gate = Some(Arc::new(Notify::new()));
    let mut daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &runtime.socket, &[]).await;
    let mut client = daemon_client(&daemon);
    let stuck = tokio::spawn(async move { call(&mut client, ensure("busybox:1.36", IF_NOT_PRESENT)).await });
    wait_until("the pull reaches the runtime", || runtime.service.pulls().len() == 1).await;

    daemon.send_sigterm();
    let status = stuck.await.expect("task").expect_err("the pull never finished");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(reason(&status), "ShuttingDown");
    assert!(status.message().starts_with("cri-imaged is shutting down: its drain deadline (2s)"), "{status:?}");
    assert!(daemon.wait_for_exit(Duration::from_secs(10)).await.success(), "{}", daemon.log_text());
}

#[tokio::test]
async fn a_frozen_runtime_is_reported_not_serving_within_two_probe_intervals_and_serving_once_thawed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), FakeImageService::default());
    // Probes every 100 ms, each bounded by 200 ms (the harness's flags); runtime calls by 2 minutes.
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &runtime.socket, &[]).await;
    let service = "imagemanager.v1.ImageManager";
    wait_for_health(&daemon.socket, service, ServingStatus::Serving, Duration::from_secs(5)).await;

    runtime.service.freeze();
    wait_for_health(&daemon.socket, service, ServingStatus::NotServing, Duration::from_millis(1000)).await;
    assert!(daemon.log_text().contains("image service NOT_SERVING"), "{}", daemon.log_text());
    runtime.service.thaw();
    wait_for_health(&daemon.socket, service, ServingStatus::Serving, Duration::from_millis(1000)).await;
}

#[tokio::test]
async fn a_runtime_call_that_times_out_is_deadline_exceeded_not_cancelled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), FakeImageService::default());
    let flags = ["--runtime-request-timeout", "300ms"];
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &runtime.socket, &flags).await;
    runtime.service.freeze();
    let mut client = daemon_client(&daemon);
    let mut cri = ImageServiceClient::new(support::unix_channel(&daemon.socket));
    // tonic's client timer and ours fire in the same tick; every attempt must come out the same.
    for _ in 0..3 {
        let status = call(&mut client, ensure("busybox:1.36", IF_NOT_PRESENT)).await.expect_err("frozen runtime");
        assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
        assert_eq!(reason(&status), "ImageInspectError");
        let expected = r#"Failed to inspect image "busybox:1.36": rpc error: code = DeadlineExceeded"#;
        assert!(status.message().starts_with(expected), "{status:?}");

        let spec = Some(ImageSpec { image: "busybox:1.36".into(), ..Default::default() });
        let status = cri.image_status(ImageStatusRequest { image: spec, verbose: false }).await.expect_err("frozen");
        assert_eq!(status.code(), Code::DeadlineExceeded, "the pass-through too: {status:?}");
    }
    runtime.service.thaw();
}

#[tokio::test]
async fn an_open_health_watch_does_not_hold_the_drain_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), FakeImageService::default());
    let flags = ["--shutdown-timeout", "20s"];
    let mut daemon = DaemonProcess::spawn(&dir.path().join("cri-imaged.sock"), &runtime.socket, &flags);
    daemon.wait_until_serving().await;
    let mut health = HealthClient::new(support::unix_channel(&daemon.socket));
    let request = HealthCheckRequest { service: String::new() };
    let mut watch = health.watch(request).await.expect("watch").into_inner();
    watch.message().await.expect("first status").expect("a status");

    daemon.send_sigterm();
    let ended = tokio::time::timeout(Duration::from_secs(5), watch.message()).await.expect("the stream ends");
    let status = ended.expect_err("ended with a status");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("shutting down"), "{status:?}");
    assert!(daemon.wait_for_exit(Duration::from_secs(5)).await.success(), "{}", daemon.log_text());
}

/// Polls `condition` every 10 ms for at most 5 s.
async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    for _ in 0..500 {
        if condition() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not within 5s");
}

#[tokio::test]
async fn a_second_daemon_refuses_a_socket_that_is_in_use() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("cri-imaged.sock");
    let runtime = dir.path().join("no-runtime.sock");
    let _first = DaemonProcess::start(&socket, &runtime, &[]).await;

    // Its own --root-dir: on the first's, the root dir's lock would refuse it before the socket.
    let other_root = dir.path().join("second-root");
    let mut second = DaemonProcess::spawn(&socket, &runtime, &["--root-dir", other_root.to_str().expect("utf-8")]);
    let status = second.wait_for_exit(Duration::from_secs(10)).await;
    assert!(!status.success());
    let log = second.log_text();
    assert!(log.contains("is in use: another process answers on it"), "{log}");
}

#[tokio::test]
async fn a_missing_runtime_socket_is_an_unavailable_inspect_error_and_not_serving() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = dir.path().join("absent-runtime.sock");
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &runtime, &[]).await;

    let mut client = daemon_client(&daemon);
    let status = call(&mut client, ensure("busybox:1.36", IF_NOT_PRESENT)).await.expect_err("no runtime");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(reason(&status), "ImageInspectError");
    assert!(status.message().starts_with(r#"Failed to inspect image "busybox:1.36": rpc error: code = Unavailable"#));
    let limit = Duration::from_secs(10);
    for service in ["imagemanager.v1.ImageManager", "runtime.v1.ImageService"] {
        wait_for_health(&daemon.socket, service, ServingStatus::NotServing, limit).await;
    }
}

#[tokio::test]
async fn an_invalid_flag_value_fails_at_start_with_a_clear_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut daemon = DaemonProcess::spawn(
        &dir.path().join("s.sock"),
        &dir.path().join("r.sock"),
        &["--runtime-request-timeout", "soon"],
    );
    let status = daemon.wait_for_exit(Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(2), "clap's usage-error status");
    assert!(daemon.log_text().contains(r#""soon" is not a duration"#), "{}", daemon.log_text());
}

#[tokio::test]
async fn an_image_gc_policy_the_kubelet_would_refuse_stops_the_start_with_its_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    let flags = ["--image-gc-high-threshold", "70", "--image-gc-low-threshold", "75"];
    let mut daemon = DaemonProcess::spawn(&dir.path().join("s.sock"), &dir.path().join("r.sock"), &flags);
    let status = daemon.wait_for_exit(Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(1));
    let expected = "invalid configuration: imageGCLowThresholdPercent (--image-gc-low-threshold) 75 must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) 70";
    assert!(daemon.log_text().contains(expected), "{}", daemon.log_text());
    assert!(!dir.path().join("s.sock").exists(), "nothing was served");
}

#[tokio::test]
async fn an_unusable_node_docker_config_or_credential_provider_config_stops_the_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broken = dir.path().join("config.json");
    std::fs::write(&broken, r#"{"auths": {"registry.local": {"auth": "bm8tY29sb24="}}}"#).expect("written");
    let plugins = dir.path().join("providers.yaml");
    std::fs::write(&plugins, "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders: []\n")
        .expect("written");
    let bin_dir = dir.path().to_str().expect("utf-8 path");
    let cases: [(&[&str], String); 3] = [
        (
            &["--node-docker-config", "/nonexistent/config.json"],
            "cri-imaged: cannot read the node docker config /nonexistent/config.json".to_owned(),
        ),
        (
            &["--node-docker-config", broken.to_str().expect("utf-8 path")],
            format!(
                "cri-imaged: the node docker config {} has an entry for \"registry.local\" that cannot be used: unable to parse auth field, must be formatted as base64(username:password)",
                broken.display()
            ),
        ),
        (
            &[
                "--image-credential-provider-config",
                plugins.to_str().expect("utf-8 path"),
                "--image-credential-provider-bin-dir",
                bin_dir,
            ],
            format!(
                "cri-imaged: the credential provider config {}: providers: at least 1 item in plugins is required",
                plugins.display()
            ),
        ),
    ];
    for (flags, expected) in cases {
        let root_dir = dir.path().join("root");
        let flags = [&["--root-dir", root_dir.to_str().expect("utf-8 path")], flags].concat();
        let mut daemon = DaemonProcess::spawn(&dir.path().join("s.sock"), &dir.path().join("r.sock"), &flags);
        let status = daemon.wait_for_exit(Duration::from_secs(10)).await;
        assert_eq!(status.code(), Some(1), "{flags:?}");
        assert!(daemon.log_text().contains(&expected), "{flags:?}: {}", daemon.log_text());
        assert!(!dir.path().join("s.sock").exists(), "nothing was served");
    }
}

#[tokio::test]
async fn grpcurl_lists_describes_and_calls_the_api_with_error_details() {
    let Some(grpcurl_bin) = require_tool("grpcurl") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), FakeImageService::default());
    runtime.service.fail_pull("missing:1", tonic::Status::not_found("manifest unknown"));
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &runtime.socket, &[]).await;
    let sock = daemon.socket.clone();
    // grpcurl blocks; run it off the runtime that serves the fake.
    let run = move |flags: Vec<&'static str>, verb: Vec<String>| {
        let (bin, sock) = (grpcurl_bin.clone(), sock.clone());
        tokio::task::spawn_blocking(move || {
            let verb: Vec<&str> = verb.iter().map(String::as_str).collect();
            grpcurl(&bin, &sock, &flags, &verb)
        })
    };

    let (ok, services, err) = run(vec![], vec!["list".into()]).await.expect("grpcurl list");
    assert!(ok, "{err}");
    for service in [
        "imagemanager.v1.ImageManager",
        "runtime.v1.ImageService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
    ] {
        assert!(services.lines().any(|line| line == service), "{service} missing from:\n{services}");
    }
    assert!(!services.contains("runtime.v1.RuntimeService"), "only served services are advertised:\n{services}");

    let verb = vec!["describe".into(), "imagemanager.v1.EnsureImageExistsRequest".into()];
    let (ok, described, err) = run(vec![], verb).await.expect("grpcurl describe");
    assert!(ok, "{err}");
    assert!(described.contains(".runtime.v1.PodSandboxConfig pod_sandbox_config"), "{described}");
    let verb = vec!["describe".into(), "imagemanager.v1.PullSecret".into()];
    let (ok, described, err) = run(vec![], verb).await.expect("grpcurl describe");
    assert!(ok, "{err}");
    for field in ["string docker_config_json = 3;", "string uid = 4;", "string type = 5;"] {
        assert!(described.contains(field), "{field} in:\n{described}");
    }

    let method = "imagemanager.v1.ImageManager/EnsureImageExists".to_owned();
    let body = r#"{"image":"busybox:1.36","pull_policy":"IF_NOT_PRESENT","pod":{"namespace":"default","name":"web"}}"#;
    let (ok, answer, err) = run(vec!["-d", body], vec![method.clone()]).await.expect("grpcurl call");
    assert!(ok, "{err}");
    assert!(answer.contains(r#""pulled": true"#), "{answer}");
    assert!(answer.contains(r#"Successfully pulled image \"busybox:1.36\""#), "{answer}");

    let broken = r#"{"image":"other:1","pull_secrets":[{"name":"regcred","namespace":"team","docker_config_json":"{\"auths\": hunter2"}]}"#;
    let (ok, out, err) = run(vec!["-d", broken], vec![method.clone()]).await.expect("grpcurl call");
    assert!(!ok, "a broken pull secret is refused: {out}");
    assert!(err.contains("Code: InvalidArgument"), "{err}");
    assert!(err.contains("pull secret team/regcred: its .dockerconfigjson is not valid JSON"), "{err}");
    assert!(err.contains(r#""reason":"ErrImagePull""#) && !err.contains("hunter2"), "{err}");

    let missing = r#"{"image":"missing:1","pull_policy":"IF_NOT_PRESENT"}"#;
    let (ok, out, err) = run(vec!["-d", missing], vec![method]).await.expect("grpcurl failing call");
    assert!(!ok, "a failed pull is an error: {out}");
    assert!(err.contains("Code: NotFound"), "{err}");
    assert!(err.contains("type.googleapis.com/google.rpc.ErrorInfo"), "error details print: {err}");
    assert!(err.contains(r#""reason":"ErrImagePull""#), "{err}");
}

#[tokio::test]
async fn without_containerd_events_every_presence_check_asks_the_runtime() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), FakeImageService::default());
    runtime.service.add_image("busybox:1.36", "sha256:busybox", 1000);
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &runtime.socket, &[]).await;
    let mut client = daemon_client(&daemon);
    for _ in 0..3 {
        let answer = call(&mut client, ensure("busybox:1.36", IF_NOT_PRESENT)).await.expect("present");
        assert!(!answer.pulled);
    }
    // The fake serves no containerd event service, like CRI-O: nothing may be remembered.
    assert_eq!(runtime.service.script.lock().unwrap().status_calls, 3);
    let (_, log) = daemon.terminate().await;
    assert!(log.contains("the runtime has no containerd event service"), "{log}");
    assert!(log.contains("presence checks will always ask the runtime"), "{log}");
}

#[tokio::test]
async fn the_daemon_serves_on_several_threads_when_asked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), FakeImageService::default());
    let flags = ["--worker-threads", "3"];
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &runtime.socket, &flags).await;
    let answer = call(&mut daemon_client(&daemon), ensure("busybox:1.36", IF_NOT_PRESENT)).await.expect("pulled");
    assert!(answer.pulled);
    let threads = std::fs::read_dir(format!("/proc/{}/task", daemon.pid())).expect("/proc/PID/task").count();
    assert!(threads >= 4, "main thread and 3 workers, found {threads}");
}

fn daemon_client(
    daemon: &DaemonProcess,
) -> cri_imaged::api::image_manager_client::ImageManagerClient<tonic::transport::Channel> {
    cri_imaged::api::image_manager_client::ImageManagerClient::new(support::unix_channel(&daemon.socket))
}

#[tokio::test]
async fn grpcurl_watches_events_as_they_happen() {
    let Some(grpcurl_bin) = require_tool("grpcurl") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), FakeImageService::default());
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &runtime.socket, &[]).await;
    let sock = daemon.socket.clone();
    // grpcurl prints each event as it comes and gives up after -max-time.
    let watching = tokio::task::spawn_blocking(move || {
        let filter = r#"{"namespace":"default"}"#;
        grpcurl(&grpcurl_bin, &sock, &["-max-time", "4", "-d", filter], &["imagemanager.v1.ImageManager/WatchEvents"])
    });
    // Until the watch is open, events go nowhere: ask until one is seen.
    let mut client = daemon_client(&daemon);
    while !watching.is_finished() {
        call(&mut client, ensure("busybox:1.36", IF_NOT_PRESENT)).await.expect("pulled or present");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_ok, stdout, stderr) = watching.await.expect("grpcurl ran");
    assert!(stdout.contains(r#""reason": "Pulled""#), "no Pulled event in:\n{stdout}\n{stderr}");
    assert!(stdout.contains(r#""type": "Normal""#) && stdout.contains(r#""uid": "0b7c6d5e-uid""#), "{stdout}");
    assert!(stderr.contains("DeadlineExceeded"), "ended by -max-time: {stderr}");
}

#[tokio::test]
async fn grpcurl_reads_the_status() {
    let Some(grpcurl_bin) = require_tool("grpcurl") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), FakeImageService::default());
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &runtime.socket, &[]).await;
    let sock = daemon.socket.clone();
    let (ok, stdout, stderr) = tokio::task::spawn_blocking(move || {
        grpcurl(&grpcurl_bin, &sock, &[], &["imagemanager.v1.ImageManager/GetStatus"])
    })
    .await
    .expect("grpcurl ran");
    assert!(ok, "{stderr}");
    let status: serde_json::Value = serde_json::from_str(&stdout).expect("grpcurl prints JSON");
    assert_eq!(status["version"], env!("CARGO_PKG_VERSION"), "{stdout}");
    assert_eq!(status["runtimeReachable"], true, "{stdout}");
}

/// The calling process as the daemon logs it: what SO_PEERCRED says of this test.
fn this_process() -> String {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    // "Uid:\treal\teffective\t…": the kernel gives the effective ids of the process that connected.
    let effective = |key: &str| {
        let line = status.lines().find_map(|line| line.strip_prefix(key)).expect("a uid/gid line");
        line.split_whitespace().nth(1).expect("an effective id").to_owned()
    };
    format!("peer=uid={} gid={} pid={}", effective("Uid:"), effective("Gid:"), std::process::id())
}

#[tokio::test]
async fn each_pull_is_logged_with_the_uid_and_pid_of_the_process_that_asked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), FakeImageService::default());
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &runtime.socket, &[]).await;
    let answer = call(&mut daemon_client(&daemon), ensure("busybox:1.36", IF_NOT_PRESENT)).await.expect("pulled");
    assert!(answer.pulled);
    let mut cri = ImageServiceClient::new(support::unix_channel(&daemon.socket));
    let image = Some(ImageSpec { image: "alpine:3.20".into(), ..Default::default() });
    cri.pull_image(cri_imaged::cri::PullImageRequest { image, ..Default::default() }).await.expect("pulled");
    let (_, log) = daemon.terminate().await;
    let peer = this_process();
    for image in ["busybox:1.36", "alpine:3.20"] {
        let pulling = log.lines().find(|line| line.contains(&format!("Pulling image \"{image}")));
        assert!(pulling.is_some_and(|line| line.contains(&peer)), "no `{peer}` on the pull of {image}:\n{log}");
    }
}

#[tokio::test]
async fn serving_the_kubelets_image_service_socket_without_socket_activation_is_warned_of_everywhere() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), FakeImageService::default());
    let socket = dir.path().join("cri-imaged.sock");
    let kubelet_config = dir.path().join("kubelet-config.yaml");
    let config = format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nimageServiceEndpoint: unix://{}\n",
        socket.display()
    );
    std::fs::write(&kubelet_config, config).expect("kubelet config");
    let (port, listen) = support::process::metrics_listen();
    let flags = ["--kubelet-config", kubelet_config.to_str().expect("utf-8"), "--metrics-listen", &listen];
    let daemon = DaemonProcess::start(&socket, &runtime.socket, &flags).await;

    let log = daemon.log_text();
    let warning = log.lines().find(|line| line.contains("is this socket, but cri-imaged is not socket-activated"));
    assert!(warning.is_some_and(|line| line.contains("WARN")), "a loud warning at start:\n{log}");
    let mut client = daemon_client(&daemon);
    let status = client.get_status(cri_imaged::api::GetStatusRequest::default()).await.expect("status").into_inner();
    assert!(
        status.kubelet_image_service_warning.contains("run cri-imaged under systemd socket activation"),
        "{status:?}"
    );
    assert_eq!(guard_gauges(port).await, (1.0, 1.0), "unactivated, and serial: serializeImagePulls is unset");
    // serializeImagePulls unset is the kubelet's default: one pull at a time.
    let serial =
        log.lines().find(|line| line.contains("the kubelet whose image service is this socket pulls serially"));
    assert!(serial.is_some_and(|line| line.contains("WARN")), "a warning at start:\n{log}");
    assert!(
        status.kubelet_serial_image_pulls_warning.contains("set serializeImagePulls: false in the kubelet's config"),
        "{status:?}"
    );

    // Another socket than the kubelet's: nothing to warn of.
    // Its own --root-dir: the first daemon, still serving, holds theirs.
    let other_root = dir.path().join("other-root");
    let other_flags = [flags[0], flags[1], "--root-dir", other_root.to_str().expect("utf-8")];
    let other = DaemonProcess::start(&dir.path().join("agents.sock"), &runtime.socket, &other_flags).await;
    let mut client = daemon_client(&other);
    let status = client.get_status(cri_imaged::api::GetStatusRequest::default()).await.expect("status").into_inner();
    assert_eq!(status.kubelet_image_service_warning, "", "{}", other.log_text());
    assert_eq!(status.kubelet_serial_image_pulls_warning, "", "{}", other.log_text());
}

/// `(cri_imaged_kubelet_image_service_unactivated, cri_imaged_kubelet_serial_image_pulls)`.
async fn guard_gauges(port: u16) -> (f64, f64) {
    tokio::task::spawn_blocking(move || {
        (
            support::process::metric(port, "cri_imaged_kubelet_image_service_unactivated"),
            support::process::metric(port, "cri_imaged_kubelet_serial_image_pulls"),
        )
    })
    .await
    .expect("metrics")
}

#[tokio::test]
async fn a_kubelet_that_pulls_in_parallel_through_this_socket_is_not_warned_of_serial_pulls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), FakeImageService::default());
    let socket = dir.path().join("cri-imaged.sock");
    let kubelet_config = dir.path().join("kubelet-config.yaml");
    let config = format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nimageServiceEndpoint: unix://{}\nserializeImagePulls: false\n",
        socket.display()
    );
    std::fs::write(&kubelet_config, config).expect("kubelet config");
    let (port, listen) = support::process::metrics_listen();
    let flags = ["--kubelet-config", kubelet_config.to_str().expect("utf-8"), "--metrics-listen", &listen];
    let daemon = DaemonProcess::start(&socket, &runtime.socket, &flags).await;

    let mut client = daemon_client(&daemon);
    let status = client.get_status(cri_imaged::api::GetStatusRequest::default()).await.expect("status").into_inner();
    assert_eq!(status.kubelet_serial_image_pulls_warning, "", "{}", daemon.log_text());
    assert_ne!(status.kubelet_image_service_warning, "", "still not socket-activated");
    assert_eq!(guard_gauges(port).await, (1.0, 0.0));
    let log = daemon.log_text();
    assert!(!log.contains("pulls serially"), "{log}");
}

/// The agents DaemonSet's rolling update with surge: the new daemon takes the socket over while
/// the old one serves, then the old one drains and exits; an agent dialling all along is never
/// refused.
#[tokio::test]
async fn a_daemon_taking_the_socket_over_refuses_no_caller_while_the_old_one_drains() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), FakeImageService::default());
    let socket = dir.path().join("agents.sock");
    let take_over = ["--take-over-socket", "true"];
    let mut old = DaemonProcess::start(&socket, &runtime.socket, &take_over).await;
    let dialling = {
        let socket = socket.clone();
        tokio::spawn(async move {
            let (mut answered, mut failed) = (0, Vec::new());
            let until = tokio::time::Instant::now() + Duration::from_secs(4);
            while tokio::time::Instant::now() < until {
                // A new connection each time, as an agent started anew dials.
                let mut health = HealthClient::new(support::unix_channel(&socket));
                match health.check(HealthCheckRequest { service: String::new() }).await {
                    Ok(_) => answered += 1,
                    Err(status) => failed.push(status.to_string()),
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            (answered, failed)
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let new = DaemonProcess::start(&socket, &runtime.socket, &take_over).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    old.send_sigterm();
    let status = old.wait_for_exit(Duration::from_secs(10)).await;
    assert!(status.success(), "the old daemon drained and exited: {}", old.log_text());
    let (answered, failed) = dialling.await.expect("the agent ran");
    assert!(
        failed.is_empty(),
        "{} of {} calls failed: {:?}",
        failed.len(),
        answered + failed.len(),
        &failed[..failed.len().min(3)]
    );
    assert!(answered > 100, "{answered} calls");
    assert!(new.log_text().contains("took the socket over"), "{}", new.log_text());
    assert!(
        !old.log_text().contains("took the socket over"),
        "nothing to take over at a fresh start: {}",
        old.log_text()
    );
    // Both name the path agents use, never the name the new one bound before renaming it.
    let listen = format!("listen={} ", socket.display());
    for log in [old.log_text(), new.log_text()] {
        assert!(log.contains(&listen) && !log.contains(".new"), "expected `{listen}` in:\n{log}");
    }
    assert!(socket.exists(), "the new daemon's socket stays");
}
