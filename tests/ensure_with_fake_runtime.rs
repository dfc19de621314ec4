//! EnsureImageExists over the daemon's socket against a scripted CRI runtime: every reason and
//! code on the wire, pass-through of the pull request, and the runtime going away and back.

mod support;

use std::time::Duration;

use cri_imaged::api::PullPolicy;
use cri_imaged::cri::PodSandboxConfig;
use cri_imaged::ensure::ManagerConfig;
use support::{FakeStack, call, ensure, fake_runtime::FakeRuntime, reason, wait_for_health};
use tonic::{Code, Status};
use tonic_health::pb::health_check_response::ServingStatus;

const ALWAYS: i32 = PullPolicy::Always as i32;
const IF_NOT_PRESENT: i32 = PullPolicy::IfNotPresent as i32;
const NEVER: i32 = PullPolicy::Never as i32;

async fn stack() -> FakeStack {
    FakeStack::start(ManagerConfig::default()).await
}

#[tokio::test]
async fn absent_image_is_pulled_then_reported_present() {
    let stack = stack().await;
    let mut client = stack.daemon.client();

    let first = call(&mut client, ensure("busybox:1.36", IF_NOT_PRESENT)).await.expect("pull succeeds");
    assert!(first.pulled);
    assert!(first.pull_duration.is_some(), "a pull reports its duration");
    assert_eq!(first.image_size_bytes, 4096);
    assert!(first.message.starts_with(r#"Successfully pulled image "busybox:1.36" in "#), "{}", first.message);

    let second = call(&mut client, ensure("busybox:1.36", IF_NOT_PRESENT)).await.expect("present");
    assert!(!second.pulled);
    assert_eq!(second.pull_duration, None);
    assert_eq!(second.image_ref, first.image_ref);
    assert_eq!(
        second.message,
        r#"Container image "busybox:1.36" already present on machine and can be accessed by the pod"#
    );
    assert_eq!(stack.runtime.service.pulls().len(), 1, "the second call did not pull");
}

#[tokio::test]
async fn pull_request_carries_default_tag_handler_annotations_and_sandbox_config() {
    let stack = stack().await;
    let mut request = ensure("registry.local:5000/team/app", 0);
    request.runtime_handler = "kata".into();
    request.pod.as_mut().expect("pod").annotations.insert("owner".into(), "payments".into());
    request.pod_sandbox_config = Some(PodSandboxConfig { hostname: "web-0".into(), ..Default::default() });
    call(&mut stack.daemon.client(), request).await.expect("pull succeeds");

    let pulls = stack.runtime.service.pulls();
    assert_eq!(pulls.len(), 1);
    let spec = pulls[0].image.clone().expect("image spec");
    assert_eq!(spec.image, "registry.local:5000/team/app:latest");
    assert_eq!(spec.runtime_handler, "kata");
    assert_eq!(spec.annotations.get("owner").map(String::as_str), Some("payments"));
    assert_eq!(pulls[0].sandbox_config.as_ref().map(|c| c.hostname.as_str()), Some("web-0"));
}

#[tokio::test]
async fn unspecified_policy_pulls_latest_every_time_but_a_pinned_tag_once() {
    let stack = stack().await;
    let mut client = stack.daemon.client();
    for _ in 0..2 {
        assert!(call(&mut client, ensure("busybox", 0)).await.expect("latest").pulled);
        call(&mut client, ensure("busybox:1.36", 0)).await.expect("pinned");
    }
    let pulled: Vec<String> =
        stack.runtime.service.pulls().into_iter().map(|p| p.image.unwrap_or_default().image).collect();
    assert_eq!(pulled, ["busybox:latest", "busybox:1.36", "busybox:latest"]);
}

#[tokio::test]
async fn always_pulls_a_present_image_and_never_uses_it() {
    let stack = stack().await;
    stack.runtime.service.add_image("busybox:1.36", "sha256:present", 10);
    let mut client = stack.daemon.client();
    assert!(call(&mut client, ensure("busybox:1.36", ALWAYS)).await.expect("always").pulled);
    let never = call(&mut client, ensure("busybox:1.36", NEVER)).await.expect("never, present");
    assert!(!never.pulled);
}

/// containerd's message for a pull from a registry that refuses connections.
const REFUSED: &str = r#"failed to pull and unpack image "docker.io/library/refused:1": failed to resolve reference "docker.io/library/refused:1": failed to do request: Head "https://registry-1.docker.io/v2/library/refused/manifests/1": dial tcp 10.0.0.2:443: connect: connection refused"#;

/// Each failure, as the caller sees it: code, ErrorInfo reason, and message.
#[tokio::test]
async fn every_failure_reaches_the_caller_with_its_code_reason_and_message() {
    let stack = stack().await;
    let service = &stack.runtime.service;
    service.fail_pull("missing:1", Status::not_found("failed to resolve reference \"missing:1\": not found"));
    service.fail_pull("private:1", Status::unauthenticated("pull access denied"));
    service.fail_pull("forbidden:1", Status::permission_denied("denied"));
    service.fail_pull("broken:1", Status::internal("disk full"));
    service.fail_pull("offline:1", Status::unknown("RegistryUnavailable: dial tcp: connection refused"));
    // containerd's own words: a network-level failure (refused, reset) is named for it, one the
    // registry answered (a certificate it was refused over) is not.
    service.fail_pull("refused:1", Status::unknown(REFUSED));
    service.fail_pull(
        "reset:1",
        Status::unknown("failed to copy: read tcp 10.0.0.1:3344->10.0.0.2:443: read: connection reset by peer"),
    );
    service.fail_pull(
        "untrusted:1",
        Status::unknown("tls: failed to verify certificate: x509: certificate signed by unknown authority"),
    );
    service.fail_pull("unsigned:1", Status::unknown("SignatureValidationFailed: no trusted signature"));
    let mut client = stack.daemon.client();

    let cases = [
        ("Busybox", IF_NOT_PRESENT, Code::InvalidArgument, "InvalidImageName", "Failed to apply default image tag"),
        ("absent:1", NEVER, Code::FailedPrecondition, "ErrImageNeverPull", "is not present with pull policy of Never"),
        ("missing:1", IF_NOT_PRESENT, Code::NotFound, "ErrImagePull", "rpc error: code = NotFound desc = failed"),
        ("private:1", IF_NOT_PRESENT, Code::Unauthenticated, "ErrImagePull", "pull access denied"),
        ("forbidden:1", IF_NOT_PRESENT, Code::PermissionDenied, "ErrImagePull", "denied"),
        ("broken:1", IF_NOT_PRESENT, Code::Unknown, "ErrImagePull", "code = Internal desc = disk full"),
        (
            "offline:1",
            IF_NOT_PRESENT,
            Code::Unavailable,
            "RegistryUnavailable",
            "image pull failed for offline:1 because the registry is unavailable: dial tcp: connection refused",
        ),
        (
            "refused:1",
            IF_NOT_PRESENT,
            Code::Unavailable,
            "RegistryUnavailable",
            &format!("image pull failed for refused:1 because the registry is unavailable: {REFUSED}"),
        ),
        (
            "reset:1",
            IF_NOT_PRESENT,
            Code::Unavailable,
            "RegistryUnavailable",
            "because the registry is unavailable: failed to copy: read tcp 10.0.0.1:3344->10.0.0.2:443: read: connection reset by peer",
        ),
        ("untrusted:1", IF_NOT_PRESENT, Code::Unknown, "ErrImagePull", "x509: certificate signed by unknown authority"),
        ("unsigned:1", IF_NOT_PRESENT, Code::PermissionDenied, "SignatureValidationFailed", "signature validation"),
        ("busybox", 7, Code::InvalidArgument, "InvalidRequest", "pull_policy 7 is not a known PullPolicy"),
    ];
    for (image, policy, code, expected_reason, message) in cases {
        let status = call(&mut client, ensure(image, policy)).await.expect_err(image);
        assert_eq!(status.code(), code, "{image}: {status:?}");
        assert_eq!(reason(&status), expected_reason, "{image}");
        assert!(status.message().contains(message), "{image}: {:?} lacks {message:?}", status.message());
    }
}

#[tokio::test]
async fn an_over_long_service_account_token_is_an_invalid_argument_naming_the_field_not_the_token() {
    use tonic_types::StatusExt;
    let stack = stack().await;
    let token = format!("eyJhbGciOi-{}", "t".repeat(16 << 10));
    let mut request = ensure("busybox:1.36", IF_NOT_PRESENT);
    request.service_account = Some(cri_imaged::api::ServiceAccount {
        namespace: "default".into(),
        name: "builder".into(),
        uid: "sa-uid".into(),
        annotations: Default::default(),
        tokens: vec![cri_imaged::api::ServiceAccountToken { audience: "registry.io".into(), token: token.clone() }],
    });
    let status = call(&mut stack.daemon.client(), request).await.expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(reason(&status), "InvalidRequest");
    let details = status.get_error_details();
    let field = details.error_info().and_then(|info| info.metadata.get("field").cloned());
    assert_eq!(field.as_deref(), Some("service_account.tokens"));
    assert_eq!(
        status.message(),
        format!(
            "service_account.tokens: the token for audience \"registry.io\" is {} bytes, more than 16384",
            token.len()
        )
    );
    assert!(!format!("{status:?}").contains("eyJhbGciOi"), "the token is never echoed");
    assert!(stack.runtime.service.pulls().is_empty(), "nothing pulled");
}

#[tokio::test]
async fn an_empty_image_ref_is_an_err_image_pull() {
    let stack = stack().await;
    stack.runtime.service.script.lock().unwrap().empty_image_ref = true;
    let status = call(&mut stack.daemon.client(), ensure("busybox:1.36", IF_NOT_PRESENT)).await.expect_err("empty");
    assert_eq!(status.code(), Code::Unknown);
    assert_eq!(reason(&status), "ErrImagePull");
    assert_eq!(status.message(), r#"imageRef of image "busybox:1.36" is not set"#);
}

#[tokio::test]
async fn a_failing_image_status_is_an_unavailable_image_inspect_error() {
    let stack = stack().await;
    stack.runtime.service.script.lock().unwrap().status_error = Some(Status::internal("metadata store corrupt"));
    let status = call(&mut stack.daemon.client(), ensure("busybox:1.36", IF_NOT_PRESENT)).await.expect_err("inspect");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(reason(&status), "ImageInspectError");
    assert_eq!(
        status.message(),
        r#"Failed to inspect image "busybox:1.36": rpc error: code = Internal desc = metadata store corrupt"#
    );
}

#[tokio::test]
async fn the_runtime_going_away_and_coming_back_is_survived() {
    let stack = stack().await;
    let FakeStack { runtime, daemon, dir: _dir } = stack;
    let socket = runtime.socket.clone();
    let mut client = daemon.client();
    let service = "imagemanager.v1.ImageManager";
    let limit = Duration::from_secs(10);

    call(&mut client, ensure("busybox:1.36", IF_NOT_PRESENT)).await.expect("runtime up");
    wait_for_health(&daemon.socket, service, ServingStatus::Serving, limit).await;

    let script = runtime.stop().await;
    let status = call(&mut client, ensure("other:1", IF_NOT_PRESENT)).await.expect_err("runtime down");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(reason(&status), "ImageInspectError");
    wait_for_health(&daemon.socket, service, ServingStatus::NotServing, limit).await;

    // A restarted runtime re-creates its socket; the daemon reconnects without being restarted.
    let _runtime = FakeRuntime::start(&socket, script);
    wait_for_health(&daemon.socket, service, ServingStatus::Serving, limit).await;
    let present = call(&mut client, ensure("busybox:1.36", IF_NOT_PRESENT)).await.expect("runtime back");
    assert!(!present.pulled, "the restarted runtime still has the image");
    daemon.stop().await;
}

#[tokio::test]
async fn callers_without_a_pod_uid_get_no_backoff_and_never_share_one() {
    let stack = stack().await;
    stack.runtime.service.fail_pull("missing:1", Status::not_found("manifest unknown"));
    let mut client = stack.daemon.client();
    let agent = |uid: &str| {
        let mut request = ensure("missing:1", IF_NOT_PRESENT);
        request.pod = (!uid.is_empty()).then(|| cri_imaged::api::PodRef { uid: uid.into(), ..Default::default() });
        request
    };
    for attempt in 1..=2 {
        let status = call(&mut client, agent("")).await.expect_err("the pull fails");
        assert_eq!((status.code(), reason(&status).as_str()), (Code::NotFound, "ErrImagePull"), "attempt {attempt}");
    }
    assert_eq!(stack.runtime.service.pulls().len(), 2, "both pod-less calls reached the runtime");
    let status = call(&mut client, agent("pod-a")).await.expect_err("the pull fails");
    assert_eq!(reason(&status), "ErrImagePull", "a pod's first failure is its own, not the pod-less callers'");
    let status = call(&mut client, agent("pod-a")).await.expect_err("backing off");
    assert_eq!(reason(&status), "ImagePullBackOff", "pods still back off");
}

/// A plugin for registry.local given tokens for the audience `registry.local`, that saves each
/// request it gets in `dir/plugin-requests` and logs in as `plugin-user`; the daemon's flags.
fn token_plugin(dir: &std::path::Path) -> Vec<String> {
    let bin_dir = dir.join("plugins");
    std::fs::create_dir_all(&bin_dir).expect("plugin dir");
    let response = r#"{"kind":"CredentialProviderResponse","apiVersion":"credentialprovider.kubelet.k8s.io/v1","cacheKeyType":"Registry","auth":{"registry.local":{"username":"plugin-user","password":"plugin-pw"}}}"#;
    let script = format!(
        "#!/bin/sh\ncat >>'{requests}'\necho >>'{requests}'\nprintf '%s\\n' '{response}'\n",
        requests = dir.join("plugin-requests").display()
    );
    let plugin = bin_dir.join("token-credentials");
    std::fs::write(&plugin, script).expect("plugin written");
    std::fs::set_permissions(&plugin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let config = dir.join("credential-providers.yaml");
    let yaml = "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n\
        - name: token-credentials\n  matchImages: [registry.local]\n  defaultCacheDuration: 1m\n  \
        apiVersion: credentialprovider.kubelet.k8s.io/v1\n  tokenAttributes:\n    \
        serviceAccountTokenAudience: registry.local\n    cacheType: ServiceAccount\n    \
        requireServiceAccount: true\n";
    std::fs::write(&config, yaml).expect("config written");
    let path = |path: &std::path::Path| path.to_str().expect("utf-8 path").to_owned();
    vec![
        "--image-credential-provider-config".into(),
        path(&config),
        "--image-credential-provider-bin-dir".into(),
        path(&bin_dir),
    ]
}

#[tokio::test]
async fn a_service_account_token_reaches_the_plugin_its_login_the_pull_and_never_the_trace_log() {
    use support::{fake_runtime::FakeImageService, process::DaemonProcess};
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), FakeImageService::default());
    let flags = token_plugin(dir.path());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &runtime.socket, &flags).await;
    let token = "eyJhbGciOiJSUzI1NiJ9.service-account-token-secret";
    // As a node agent sends it with grpcurl's default flags (the API from reflection, JSON names).
    let body = serde_json::json!({
        "image": "registry.local/team/app:v1",
        "pullPolicy": "IF_NOT_PRESENT",
        "pod": { "namespace": "default", "name": "web", "uid": "pod-uid" },
        "serviceAccount": {
            "namespace": "default", "name": "builder", "uid": "sa-uid",
            "tokens": [{ "audience": "registry.local", "token": token }],
        },
    })
    .to_string();
    let grpcurl_bin =
        support::process::require_tool("grpcurl").expect("grpcurl is installed by scripts/install-deps.sh");
    let socket = daemon.socket.clone();
    let (ok, stdout, stderr) = tokio::task::spawn_blocking(move || {
        support::process::grpcurl(
            &grpcurl_bin,
            &socket,
            &["-d", &body],
            &["imagemanager.v1.ImageManager/EnsureImageExists"],
        )
    })
    .await
    .expect("grpcurl ran");
    assert!(ok, "{stderr}");
    let answer: serde_json::Value = serde_json::from_str(&stdout).expect("the answer as JSON");
    assert_eq!(answer["pulled"], true, "{stdout}");
    let pulls = runtime.service.pulls();
    let auth = pulls[0].auth.as_ref().expect("pulled with the plugin's login");
    assert_eq!((auth.username.as_str(), auth.password.as_str()), ("plugin-user", "plugin-pw"));
    let requests = std::fs::read_to_string(dir.path().join("plugin-requests")).expect("the plugin ran");
    let sent: serde_json::Value = serde_json::from_str(requests.trim()).expect("one request");
    assert_eq!(sent["serviceAccountToken"], token);
    let (_, log) = daemon.terminate().await;
    assert!(log.contains("credential provider answered"), "the plugin's run is in the log:\n{log}");
    assert!(!log.contains("service-account-token-secret"), "the token leaked into the log:\n{log}");
}
