use std::collections::HashMap;

use crate::cri::PodSandboxConfig;

use super::*;
use crate::{
    credentials::{NodeCredentials, RegistryAuth, secrets::PullSecret},
    gc::ImageGuard,
    pull::path::Shared,
    records::verification::{Allowlist, VerificationPolicy},
    runtime::fake::{FakeRuntime, Hold},
};

/// A registry that serves `sha256:private` to `user` only.
fn private_for(user: &str) -> FakeRuntime {
    FakeRuntime::default().pulling_to(Ok("sha256:private")).pulls_only_as(user)
}

/// The manager as the daemon builds it, with the scripted runtime under it in reach.
struct Built {
    manager: Arc<Manager<FakeRuntime>>,
    runtime: Arc<FakeRuntime>,
    records: Arc<crate::records::PullRecords>,
    pulls: Arc<PullPath>,
    guard: Arc<ImageGuard>,
    /// The node's image policy, none until a test puts one in force.
    policy: Arc<crate::policy::PolicyGate>,
    /// Where the pull records are; kept as long as the manager.
    root_dir: tempfile::TempDir,
}

impl std::ops::Deref for Built {
    type Target = Manager<FakeRuntime>;

    fn deref(&self) -> &Self::Target {
        &self.manager
    }
}

impl Built {
    fn runtime(&self) -> &FakeRuntime {
        &self.runtime
    }
}

fn manager(runtime: FakeRuntime) -> Built {
    manager_with_node_credentials(runtime, NodeCredentials::none())
}

fn manager_with_node_credentials(runtime: FakeRuntime, node_credentials: NodeCredentials) -> Built {
    manager_with(runtime, node_credentials, ManagerConfig::default(), tempfile::tempdir().unwrap())
}

fn manager_with(
    runtime: FakeRuntime,
    node_credentials: NodeCredentials,
    config: ManagerConfig,
    root_dir: tempfile::TempDir,
) -> Built {
    // The parts as the composition root wires them, each counting into a registry of its own.
    let runtime = Arc::new(runtime);
    let records = Arc::new(crate::records::PullRecords::open(root_dir.path(), Arc::default()).expect("records open"));
    let (guard, events) = (Arc::new(ImageGuard::default()), Arc::new(Events::default()));
    let pull_metrics = Arc::new(crate::pull::metrics::PullMetrics::default());
    let limits = Arc::new(crate::pull::ratelimit::RegistryLimits::new(
        &config.rate_limits,
        pull_metrics.clone(),
        events.clone(),
    ));
    let path_config = crate::pull::path::PathConfig { scheduler: config.scheduler, progress: config.progress };
    let presence = Arc::new(PresenceCache::new(Arc::default(), config.presence_max_staleness));
    let policy = Arc::new(crate::policy::PolicyGate::default());
    let shared = Shared {
        records: records.clone(),
        guard: guard.clone(),
        events: events.clone(),
        presence: presence.clone(),
        policy: policy.clone(),
        signatures: Arc::new(crate::signatures::Signatures::new(Default::default(), Arc::default())),
    };
    let pulls = Arc::new(PullPath::over(runtime.clone(), limits, path_config, shared, pull_metrics));
    let manager = Arc::new(Manager::new(ManagerParts {
        runtime: runtime.clone(),
        pulls: pulls.clone(),
        backoff: BackoffStore::new(config.backoff),
        presence,
        node_credentials: Arc::new(node_credentials),
        records: records.clone(),
        guard: guard.clone(),
        events,
        verification: config.verification,
        policy: policy.clone(),
        metrics: Arc::new(EnsureMetrics::register(&mut prometheus_client::registry::Registry::default())),
    }));
    Built { manager, runtime, records, pulls, guard, policy, root_dir }
}

fn request(image: &str, policy: Option<PullPolicy>) -> EnsureRequest {
    EnsureRequest {
        image: image.into(),
        pull_policy: policy,
        pod: PodRef {
            namespace: "default".into(),
            name: "web".into(),
            uid: "uid-1".into(),
            annotations: HashMap::from([("team".into(), "payments".into())]),
        },
        container_name: "app".into(),
        runtime_handler: "runc".into(),
        sandbox_config: Some(PodSandboxConfig { hostname: "web-0".into(), ..Default::default() }),
        pull_secrets: Vec::new(),
        service_account: None,
        peer: None,
        class: crate::pull::PullClass::Pod,
        keep_in: None,
    }
}

#[tokio::test]
async fn present_image_with_if_not_present_is_used_without_pulling() {
    let manager = manager(FakeRuntime::default().with_image("busybox:1.36", "sha256:abc", 1234));
    let outcome = manager.ensure_image_exists(request("busybox:1.36", None)).await.expect("present");
    assert_eq!(outcome.image_ref, "sha256:abc");
    assert_eq!(
        outcome.message,
        r#"Container image "busybox:1.36" already present on machine and can be accessed by the pod"#
    );
    assert_eq!(outcome.pull, None);
    assert_eq!(outcome.image_size, 1234);
    assert!(manager.runtime().state().pulls.is_empty());
}

#[tokio::test]
async fn absent_image_is_pulled_with_the_default_tag_annotations_handler_and_sandbox() {
    let runtime = FakeRuntime::default().pulling_to(Ok("sha256:new"));
    let manager = manager(runtime);
    let outcome = manager.ensure_image_exists(request("busybox", None)).await.expect("pulled");
    assert_eq!(outcome.image_ref, "sha256:new");
    assert!(outcome.pull.is_some());
    assert_eq!(outcome.image_size, 777, "the size is looked up after the pull");
    assert!(outcome.message.starts_with(r#"Successfully pulled image "busybox" in "#), "{}", outcome.message);
    assert!(outcome.message.ends_with("Image size: 777 bytes."), "{}", outcome.message);

    let state = manager.runtime().state();
    let pulls = &state.pulls;
    assert_eq!(pulls.len(), 1);
    let pull = &pulls[0];
    assert_eq!(pull.image.image, "busybox:latest", "no docker.io prefix, only the tag");
    assert_eq!(pull.image.runtime_handler, "runc");
    assert_eq!(pull.image.annotations.get("team").map(String::as_str), Some("payments"));
    assert_eq!(pull.sandbox_config.as_ref().map(|c| c.hostname.as_str()), Some("web-0"));
}

#[tokio::test]
async fn always_pulls_even_when_present() {
    let runtime = FakeRuntime::default().with_image("busybox:1.36", "sha256:old", 1).pulling_to(Ok("sha256:fresh"));
    let manager = manager(runtime);
    let outcome = manager.ensure_image_exists(request("busybox:1.36", Some(PullPolicy::Always))).await.expect("pulled");
    assert_eq!(outcome.image_ref, "sha256:fresh");
    assert_eq!(manager.runtime().state().pulls.len(), 1);
}

#[tokio::test]
async fn unspecified_policy_on_latest_pulls_even_when_present() {
    let runtime = FakeRuntime::default().with_image("busybox:latest", "sha256:old", 1).pulling_to(Ok("sha256:fresh"));
    let manager = manager(runtime);
    manager.ensure_image_exists(request("busybox", None)).await.expect("pulled");
    assert_eq!(manager.runtime().state().pulls.len(), 1);
}

#[tokio::test]
async fn never_with_an_absent_image_fails_with_the_kubelet_message() {
    let manager = manager(FakeRuntime::default());
    let error =
        manager.ensure_image_exists(request("busybox:1.36", Some(PullPolicy::Never))).await.expect_err("absent");
    assert_eq!(error.reason(), "ErrImageNeverPull");
    assert_eq!(error.to_string(), r#"Container image "busybox:1.36" is not present with pull policy of Never"#);
    assert!(manager.runtime().state().pulls.is_empty());
}

#[tokio::test]
async fn never_with_a_present_image_uses_it() {
    let manager = manager(FakeRuntime::default().with_image("busybox:latest", "sha256:abc", 5));
    let outcome = manager.ensure_image_exists(request("busybox", Some(PullPolicy::Never))).await.expect("present");
    assert_eq!(outcome.image_ref, "sha256:abc");
}

#[tokio::test]
async fn invalid_names_fail_before_the_runtime_is_asked() {
    let manager = manager(FakeRuntime::default());
    for image in ["", "Busybox", "busybox:-tag", &"a".repeat(64)] {
        let error = manager.ensure_image_exists(request(image, None)).await.expect_err(image);
        assert_eq!(error.reason(), "InvalidImageName", "{image:?}");
        assert!(error.to_string().starts_with("Failed to apply default image tag"), "{error}");
    }
    assert!(manager.runtime().state().status_calls.is_empty());
}

#[tokio::test]
async fn a_failing_image_status_is_an_inspect_error() {
    let runtime = FakeRuntime::default().failing_status(tonic::Status::unavailable("socket gone"));
    let manager = manager(runtime);
    let error = manager.ensure_image_exists(request("busybox", None)).await.expect_err("inspect fails");
    assert_eq!(error.reason(), "ImageInspectError");
    assert_eq!(
        error.to_string(),
        r#"Failed to inspect image "busybox": rpc error: code = Unavailable desc = socket gone"#
    );
}

#[tokio::test]
async fn an_empty_image_ref_from_the_runtime_is_a_pull_error() {
    let manager = manager(FakeRuntime::default().pulling_to(Ok("")));
    let error = manager.ensure_image_exists(request("busybox", None)).await.expect_err("empty ref");
    assert_eq!(error.reason(), "ErrImagePull");
    assert_eq!(error.to_string(), r#"imageRef of image "busybox:latest" is not set"#);
}

#[tokio::test]
async fn pull_failures_are_classified_by_the_runtime_message_prefix() {
    let cases = [
        (
            "RegistryUnavailable: connection refused",
            "RegistryUnavailable",
            "image pull failed for busybox because the registry is unavailable: connection refused",
        ),
        (
            "SignatureValidationFailed: not signed by a trusted key",
            "SignatureValidationFailed",
            "image pull failed for busybox because the signature validation failed: not signed by a trusted key",
        ),
        (
            "failed to resolve reference: not found",
            "ErrImagePull",
            // The kubelet's CRI client passes an UNKNOWN status on as its bare message.
            "failed to resolve reference: not found",
        ),
    ];
    for (runtime_message, reason, message) in cases {
        let runtime = FakeRuntime::default().pulling_to(Err(tonic::Status::unknown(runtime_message)));
        let manager = manager(runtime);
        let error = manager.ensure_image_exists(request_for_pod("busybox", "pod-a")).await.expect_err(runtime_message);
        assert_eq!(error.reason(), reason, "{runtime_message}");
        assert_eq!(error.to_string(), message);
        // The pod backing off is told why, as kubelets from 1.32 tell it.
        let refused = manager.ensure_image_exists(request_for_pod("busybox", "pod-a")).await.expect_err("backing off");
        assert_eq!(refused.reason(), "ImagePullBackOff");
        assert_eq!(refused.to_string(), format!(r#"Back-off pulling image "busybox": {reason}: {message}"#));
    }
}

fn request_for_pod(image: &str, uid: &str) -> EnsureRequest {
    let mut request = request(image, Some(PullPolicy::IfNotPresent));
    request.pod.uid = uid.into();
    request
}

#[tokio::test(start_paused = true)]
async fn a_failed_pull_backs_off_that_pod_and_image_without_asking_the_runtime() {
    let runtime = FakeRuntime::default().pulling_to(Err(tonic::Status::not_found("manifest unknown")));
    let manager = manager(runtime);
    let first = manager.ensure_image_exists(request_for_pod("app:v1", "pod-a")).await.expect_err("pull fails");
    assert_eq!(first.reason(), "ErrImagePull");

    tokio::time::advance(Duration::from_secs(3)).await;
    let refused = manager.ensure_image_exists(request_for_pod("app:v1", "pod-a")).await.expect_err("backing off");
    assert_eq!(refused.reason(), "ImagePullBackOff");
    assert_eq!(
        refused.to_string(),
        r#"Back-off pulling image "app:v1": ErrImagePull: rpc error: code = NotFound desc = manifest unknown"#
    );
    assert!(matches!(refused, EnsureError::BackOff { retry_after, .. } if retry_after == Duration::from_secs(7)));
    assert_eq!(manager.runtime().state().pulls.len(), 1, "the refusal did not reach the runtime");

    // Another pod is not held back by pod-a's failure.
    manager.ensure_image_exists(request_for_pod("app:v1", "pod-b")).await.expect_err("tries, fails");
    assert_eq!(manager.runtime().state().pulls.len(), 2);

    // Nor is pod-a's pull of the image for another runtime handler (KEP-4216: another image).
    let mut kata = request_for_pod("app:v1", "pod-a");
    kata.runtime_handler = "kata".into();
    manager.ensure_image_exists(kata.clone()).await.expect_err("tries, fails");
    assert_eq!(manager.runtime().state().pulls.len(), 3);
    assert_eq!(manager.runtime().state().pulls[2].image.runtime_handler, "kata");
    let refused = manager.ensure_image_exists(kata).await.expect_err("kata's pull backs off in turn");
    assert_eq!(refused.reason(), "ImagePullBackOff");
    assert_eq!(manager.runtime().state().pulls.len(), 3);
}

#[tokio::test(start_paused = true)]
async fn after_the_backoff_window_the_pull_is_tried_again_and_the_next_window_doubles() {
    let runtime = FakeRuntime::default().pulling_to(Err(tonic::Status::not_found("manifest unknown")));
    let manager = manager(runtime);
    let _ = manager.ensure_image_exists(request_for_pod("app:v1", "pod-a")).await;
    tokio::time::advance(Duration::from_secs(10)).await;
    let retried = manager.ensure_image_exists(request_for_pod("app:v1", "pod-a")).await.expect_err("fails again");
    assert_eq!(retried.reason(), "ErrImagePull", "the window was over, so the runtime was asked");
    tokio::time::advance(Duration::from_secs(19)).await;
    let refused = manager.ensure_image_exists(request_for_pod("app:v1", "pod-a")).await.expect_err("20s window");
    assert_eq!(refused.reason(), "ImagePullBackOff");
    assert_eq!(manager.runtime().state().pulls.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn backoffs_are_listed_by_name_and_cleared_pair_by_pair_or_all_at_once() {
    let runtime = FakeRuntime::default().pulling_to(Err(tonic::Status::not_found("manifest unknown")));
    let manager = manager(runtime);
    manager.ensure_image_exists(request_for_pod("app:v1", "pod-a")).await.expect_err("pull fails");
    tokio::time::advance(Duration::from_secs(3)).await;
    manager.ensure_image_exists(request_for_pod("app:v1", "pod-b")).await.expect_err("pull fails");
    let listed = manager.backoffs();
    let entries: Vec<(&str, &str, &str, &str, u64, u64)> = listed
        .backing_off
        .iter()
        .map(|entry| {
            let name = &entry.name;
            let (left, delay) = (entry.remaining.as_secs(), entry.delay.as_secs());
            (
                name.namespace.as_str(),
                name.uid.as_str(),
                name.image.as_str(),
                name.runtime_handler.as_str(),
                left,
                delay,
            )
        })
        .collect();
    assert_eq!(
        entries,
        [("default", "pod-a", "app:v1", "runc", 7, 10), ("default", "pod-b", "app:v1", "runc", 10, 10)],
        "soonest retry first"
    );
    assert_eq!(listed.backing_off[0].last_error.to_string(), "rpc error: code = NotFound desc = manifest unknown");
    assert_eq!(listed.total, 2);

    let pair = |uid: &str, image: &str| ClearBackoff::Pair {
        pod_uid: uid.into(),
        image: image.into(),
        runtime_handler: "runc".into(),
    };
    assert_eq!(manager.clear_backoff(pair("pod-a", "docker.io/library/app:v1")), 0, "the image as the pod wrote it");
    assert_eq!(manager.clear_backoff(pair("pod-a", "app:v1")), 1);
    let retried = manager.ensure_image_exists(request_for_pod("app:v1", "pod-a")).await.expect_err("fails again");
    assert_eq!(retried.reason(), "ErrImagePull", "tried at once");
    assert_eq!(manager.runtime().state().pulls.len(), 3);
    assert_eq!(manager.clear_backoff(ClearBackoff::All), 2);
    assert_eq!((manager.backoffs().total, manager.metrics.backoffs_cleared()), (0, 3));
    assert_eq!(manager.clear_backoff(ClearBackoff::All), 0);

    // Told as events, kept though no one watched.
    let kept = manager.events.recent(&crate::events::Filter::default().prepare(), 0);
    let cleared: Vec<(&str, Option<&str>, &str)> = kept
        .iter()
        .filter(|event| event.reason == crate::events::reason::BACKOFF_CLEARED)
        .map(|event| (event.kind.as_str(), event.pod.as_ref().map(|pod| pod.name.as_str()), event.message.as_str()))
        .collect();
    assert_eq!(
        cleared,
        [
            ("Normal", Some("web"), r#"Back-off pulling image "app:v1" cleared: the next pull is tried at once"#),
            ("Normal", None, "Every image pull back-off cleared (2 pod and image pairs)"),
        ]
    );
}

#[tokio::test]
async fn outcomes_are_kept_for_list_events_though_no_one_watches_but_not_every_start_of_a_present_image() {
    let manager = manager(FakeRuntime::default().with_image("busybox:1.36", "sha256:abc", 1234));
    assert!(!manager.events.watched());
    manager.ensure_image_exists(request("busybox:1.36", None)).await.expect("present");
    manager.ensure_image_exists(request("absent:1", Some(PullPolicy::Never))).await.expect_err("never");
    let everything = crate::events::Filter::default().prepare();
    let reasons = |manager: &Manager<FakeRuntime>| -> Vec<&'static str> {
        manager.events.recent(&everything, 0).iter().map(|event| event.reason).collect()
    };
    assert_eq!(reasons(&manager), ["ErrImageNeverPull"]);

    // A watcher is told that the image is present; the history still is not.
    let mut watching = manager.events.subscribe(crate::events::Filter::default());
    manager.ensure_image_exists(request("busybox:1.36", None)).await.expect("present");
    let told = watching.try_next();
    assert!(matches!(&told, Some(crate::events::Next::Event(event)) if event.reason == "Pulled"), "{told:?}");
    assert_eq!(reasons(&manager), ["ErrImageNeverPull"]);
}

/// A `kubernetes.io/dockerconfigjson` secret `name` holding one login for `registry`.
fn secret(name: &str, registry: &str, user: &str) -> PullSecret {
    let document = serde_json::json!({ "auths": { registry: { "username": user, "password": format!("{user}-pw") } } });
    PullSecret {
        coordinates: crate::credentials::SecretCoordinates {
            uid: format!("uid-{name}"),
            namespace: "default".into(),
            name: name.into(),
        },
        kind: crate::credentials::secrets::DOCKER_CONFIG_JSON.into(),
        content: document.to_string().into(),
    }
}

/// The image the private requests name.
const PRIVATE_IMAGE: &str = "registry.local/team/app:v1";

fn private_request(secrets: Vec<PullSecret>) -> EnsureRequest {
    EnsureRequest { pull_secrets: secrets, ..request(PRIVATE_IMAGE, Some(PullPolicy::IfNotPresent)) }
}

#[tokio::test]
async fn without_credentials_one_anonymous_pull_is_made() {
    let manager = manager(private_for("alice"));
    let other_registry = secret("elsewhere", "other.registry", "alice");
    let error = manager.ensure_image_exists(private_request(vec![other_registry])).await.expect_err("anonymous");
    assert_eq!(manager.runtime().pulled_as(), [None]);
    assert_eq!(error.to_string(), "pull as anonymous: 401 Unauthorized");
}

#[tokio::test]
async fn a_matching_pull_secret_is_used() {
    let manager = manager(private_for("alice"));
    let outcome = manager.ensure_image_exists(private_request(vec![secret("pull", "registry.local", "alice")])).await;
    assert_eq!(outcome.expect("pulled").image_ref, "sha256:private");
    assert_eq!(manager.runtime().pulled_as(), [Some("alice".to_owned())]);
}

#[tokio::test]
async fn credentials_are_tried_in_turn_until_one_pulls() {
    let manager = manager(private_for("bob"));
    let secrets = vec![
        secret("wrong", "registry.local", "alice"),
        secret("right", "registry.local", "bob"),
        secret("unused", "registry.local", "carol"),
    ];
    let outcome = manager.ensure_image_exists(private_request(secrets)).await.expect("the second pulls");
    assert!(outcome.pull.is_some());
    assert_eq!(manager.runtime().pulled_as(), [Some("alice".to_owned()), Some("bob".to_owned())]);
}

#[tokio::test]
async fn the_most_specific_key_is_tried_first_whatever_the_secret_order() {
    let manager = manager(private_for("team"));
    let secrets =
        vec![secret("registry-wide", "registry.local", "wide"), secret("team", "registry.local/team", "team")];
    manager.ensure_image_exists(private_request(secrets)).await.expect("pulled");
    assert_eq!(manager.runtime().pulled_as(), [Some("team".to_owned())]);
}

#[tokio::test]
async fn when_every_credential_fails_each_error_is_listed_and_nothing_is_tried_anonymously() {
    let manager = manager(private_for("nobody-here"));
    let secrets = vec![secret("a", "registry.local", "alice"), secret("b", "registry.local", "bob")];
    let error = manager.ensure_image_exists(private_request(secrets)).await.expect_err("both fail");
    assert_eq!(error.reason(), "ErrImagePull");
    assert_eq!(error.to_string(), "[pull as alice: 401 Unauthorized, pull as bob: 401 Unauthorized]");
    assert_eq!(manager.runtime().pulled_as(), [Some("alice".to_owned()), Some("bob".to_owned())]);
}

#[tokio::test]
async fn identical_failures_read_as_one_as_in_the_kubelets_aggregate() {
    let runtime = FakeRuntime::default().pulling_to(Err(tonic::Status::unknown("401 Unauthorized")));
    let manager = manager(runtime);
    let secrets = vec![secret("a", "registry.local", "alice"), secret("b", "registry.local", "bob")];
    let error = manager.ensure_image_exists(private_request(secrets)).await.expect_err("both fail");
    assert_eq!(error.to_string(), "401 Unauthorized");
    assert_eq!(manager.runtime().state().pulls.len(), 2);
}

#[tokio::test]
async fn one_login_found_in_two_secrets_is_tried_once() {
    let manager = manager(private_for("nobody-here"));
    let secrets = vec![secret("a", "registry.local", "alice"), secret("a-again", "registry.local/team", "alice")];
    manager.ensure_image_exists(private_request(secrets)).await.expect_err("fails");
    assert_eq!(manager.runtime().pulled_as(), [Some("alice".to_owned())]);
}

#[tokio::test]
async fn the_nodes_docker_config_comes_after_the_pods_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    let node = serde_json::json!({"auths": {"registry.local": {"auth": "bm9kZTpub2RlLXB3"}}});
    std::fs::write(&config, node.to_string()).unwrap();
    let node_credentials = NodeCredentials::new(
        crate::credentials::node::NodeDockerConfig::explicit(config).expect("readable"),
        crate::credentials::plugin::Plugins::none(),
    );
    let manager = manager_with_node_credentials(private_for("node"), node_credentials);
    let outcome = manager.ensure_image_exists(private_request(vec![secret("pod", "registry.local", "pod")])).await;
    assert_eq!(outcome.expect("the node's login pulls").image_ref, "sha256:private");
    assert_eq!(manager.runtime().pulled_as(), [Some("pod".to_owned()), Some("node".to_owned())]);
    let state = manager.runtime().state();
    let pulls = &state.pulls;
    assert_eq!(secrecy::ExposeSecret::expose_secret(&pulls[1].auth.as_ref().unwrap().password), "node-pw");
}

/// Node credentials from one plugin for registry.local that requires a service account and a
/// token for `registry.local`; it logs in as `sa-user` with a password naming the token it got.
fn node_with_token_plugin(dir: &std::path::Path) -> NodeCredentials {
    use crate::credentials::plugin::config::{CacheType, ProviderConfig, TokenAttributes};
    let executable = dir.join("token-plugin");
    let script = format!(
        "#!/bin/sh\ncat > {request}\necho run >> {runs}\nprintf '%s' '{{\"kind\":\"CredentialProviderResponse\",\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",\"cacheKeyType\":\"Registry\",\"auth\":{{\"registry.local\":{{\"username\":\"sa-user\",\"password\":\"from-plugin\"}}}}}}'\n",
        request = dir.join("request").display(),
        runs = dir.join("runs").display(),
    );
    std::fs::write(&executable, script).unwrap();
    std::fs::set_permissions(&executable, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let config = ProviderConfig {
        name: "token-plugin".into(),
        executable,
        match_images: vec!["registry.local".into()],
        default_cache_duration: std::time::Duration::from_secs(600),
        api_version: "credentialprovider.kubelet.k8s.io/v1".into(),
        args: Vec::new(),
        env: Vec::new(),
        token_attributes: Some(TokenAttributes {
            audience: "registry.local".into(),
            cache_type: CacheType::ServiceAccount,
            require_service_account: true,
            required_annotation_keys: Vec::new(),
            optional_annotation_keys: Vec::new(),
        }),
    };
    NodeCredentials::new(
        crate::credentials::node::NodeDockerConfig::none(),
        crate::credentials::plugin::Plugins::new(vec![config]),
    )
}

/// Pod `pod`'s request for the private image, with the service account `name` (uid `uid`) and
/// its `token` for `registry.local`.
fn with_service_account(pod: &str, name: &str, uid: &str, token: &str) -> EnsureRequest {
    let account = crate::credentials::ServiceAccount {
        namespace: "default".into(),
        name: name.into(),
        uid: uid.into(),
        annotations: Default::default(),
        tokens: vec![crate::credentials::account::AudienceToken {
            audience: "registry.local".into(),
            token: token.into(),
        }],
    };
    EnsureRequest { service_account: Some(account), ..pod_request(pod, Vec::new()) }
}

#[tokio::test]
async fn a_token_plugin_is_asked_with_the_pods_service_account_and_its_login_pulls() {
    let dir = tempfile::tempdir().unwrap();
    let manager = manager_with_node_credentials(private_for("sa-user"), node_with_token_plugin(dir.path()));
    let error = manager.ensure_image_exists(private_request(Vec::new())).await.expect_err("no account: no login");
    assert_eq!(error.reason(), "ErrImagePull");
    assert_eq!(manager.runtime().pulled_as(), [None], "anonymous: the plugin was not run");
    assert!(!dir.path().join("runs").exists());
    // Another pod: the first is backing off.
    let with_account = with_service_account("b", "builder", "sa-uid", "sa-token-1");
    let outcome = manager.ensure_image_exists(with_account).await.expect("the plugin's login pulls");
    assert_eq!(outcome.image_ref, "sha256:private");
    assert_eq!(manager.runtime().pulled_as(), [None, Some("sa-user".to_owned())]);
    let request: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("request")).unwrap()).unwrap();
    assert_eq!(request["serviceAccountToken"], "sa-token-1");
    assert_eq!(request["image"], "registry.local/team/app");
}

#[tokio::test]
async fn a_secret_that_does_not_parse_is_refused_without_pulling_or_backing_off() {
    let manager = manager(private_for("alice"));
    let mut broken = secret("broken", "registry.local", "alice");
    broken.content = r#"{"auths": {"registry.local": {"password": "hunter2", }}}"#.into();
    for _ in 0..2 {
        let error = manager.ensure_image_exists(private_request(vec![broken.clone()])).await.expect_err("refused");
        assert!(matches!(error, EnsureError::InvalidPullSecret { .. }), "{error:?}");
        assert_eq!(error.reason(), "ErrImagePull");
        assert_eq!(
            error.to_string(),
            "pull secret default/broken: its .dockerconfigjson is not valid JSON (syntax error at line 1 column 54)"
        );
    }
    assert!(manager.runtime().state().pulls.is_empty());
}

#[tokio::test]
async fn pull_secrets_are_not_read_when_the_present_image_is_used() {
    let manager = manager(FakeRuntime::default().with_image(PRIVATE_IMAGE, "sha256:abc", 1));
    let mut broken = secret("broken", "registry.local", "alice");
    broken.content = "not json".into();
    let outcome = manager.ensure_image_exists(private_request(vec![broken])).await.expect("used as present");
    assert_eq!(outcome.image_ref, "sha256:abc");
}

#[tokio::test]
async fn pods_with_one_login_share_a_pull_and_pods_with_different_logins_never_do() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let runtime = FakeRuntime::default().gating_pulls(gate.clone());
    let manager = manager(runtime.pulling_to(Ok("sha256:private")));
    let manager_arc = manager.manager.clone();
    let mut requests = Vec::new();
    for (pod, user) in [("a", "alice"), ("b", "alice"), ("c", "bob"), ("d", "bob"), ("e", "alice")] {
        let mut request = private_request(vec![secret(pod, "registry.local", user)]);
        request.pod.uid = format!("pod-{pod}");
        let manager = manager_arc.clone();
        requests.push(tokio::spawn(async move { manager.ensure_image_exists(request).await }));
    }
    // A request counts as in flight in the same step as it joins or starts its pull.
    for _ in 0..1000 {
        if manager.records.pulls_in_flight("registry.local/team/app:v1") == 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(manager.records.pulls_in_flight("registry.local/team/app:v1"), 5);
    gate.add_permits(10);
    let outcomes = futures_util::future::join_all(requests).await;
    assert!(outcomes.into_iter().all(|outcome| outcome.expect("task").is_ok()));
    let mut pulled_as = manager.runtime().pulled_as();
    pulled_as.sort();
    assert_eq!(pulled_as, [Some("alice".to_owned()), Some("bob".to_owned())], "one pull per login");
}

fn verifying(policy: VerificationPolicy) -> ManagerConfig {
    ManagerConfig {
        verification: VerificationConfig { policy, allowlist: Allowlist::default() },
        ..ManagerConfig::default()
    }
}

fn pod_request(pod: &str, secrets: Vec<PullSecret>) -> EnsureRequest {
    let mut request = private_request(secrets);
    request.pod.uid = format!("uid-{pod}");
    request.pod.name = pod.into();
    request
}

/// A manager under `policy` whose registry serves alice only, after pod A pulled the private
/// image with alice's secret.
async fn pulled_by_pod_a(policy: VerificationPolicy) -> Built {
    let manager =
        manager_with(private_for("alice"), NodeCredentials::none(), verifying(policy), tempfile::tempdir().unwrap());
    let pulled = manager.ensure_image_exists(pod_request("a", vec![secret("alices", "registry.local", "alice")])).await;
    assert!(pulled.expect("pod A pulls").pull.is_some());
    manager
}

#[tokio::test]
async fn a_pod_without_the_credentials_must_pull_a_private_image_it_finds_present() {
    let manager = pulled_by_pod_a(VerificationPolicy::AlwaysVerify).await;
    let error = manager.ensure_image_exists(pod_request("b", Vec::new())).await.expect_err("B cannot pull");
    assert_eq!(error.reason(), "ErrImagePull");
    assert_eq!(manager.runtime().pulled_as(), [Some("alice".to_owned()), None], "B's pull was its own, anonymous");
}

#[tokio::test]
async fn a_pod_whose_secret_holds_a_recorded_credential_uses_the_present_image_and_is_remembered() {
    let manager = pulled_by_pod_a(VerificationPolicy::AlwaysVerify).await;
    let outcome =
        manager.ensure_image_exists(pod_request("c", vec![secret("cs-copy", "registry.local", "alice")])).await;
    let outcome = outcome.expect("C may use it");
    assert!(outcome.pull.is_none());
    assert_eq!(
        outcome.message,
        r#"Container image "registry.local/team/app:v1" already present on machine and can be accessed by the pod"#
    );
    assert_eq!(manager.runtime().pulled_as(), [Some("alice".to_owned())], "no second pull");
    let record = manager.records.record("sha256:private").await.unwrap().expect("recorded");
    let names: Vec<&str> = record.credential_mapping["registry.local/team/app"]
        .kubernetes_secrets
        .iter()
        .map(|secret| secret.name.as_str())
        .collect();
    assert_eq!(names, ["alices", "cs-copy"]);
}

#[tokio::test]
async fn under_never_a_failed_verification_reads_as_an_absent_image() {
    let manager = pulled_by_pod_a(VerificationPolicy::AlwaysVerify).await;
    let mut request = pod_request("b", Vec::new());
    request.pull_policy = Some(PullPolicy::Never);
    let error = manager.ensure_image_exists(request).await.expect_err("refused");
    assert_eq!(error.reason(), "ErrImageNeverPull");
    assert_eq!(
        error.to_string(),
        r#"Container image "registry.local/team/app:v1" is not present with pull policy of Never"#
    );
    assert_eq!(manager.runtime().state().pulls.len(), 1, "nothing pulled");
}

#[tokio::test]
async fn never_verify_lets_any_pod_use_a_present_image() {
    let manager = pulled_by_pod_a(VerificationPolicy::NeverVerify).await;
    let outcome = manager.ensure_image_exists(pod_request("b", Vec::new())).await.expect("B may use it");
    assert!(outcome.pull.is_none());
}

/// The kubelet (1.36) normalises a pod's image before matching it with the allowlist; a short
/// entry is read the same way.
#[tokio::test]
async fn a_pods_short_image_present_on_the_node_is_exempt_under_a_short_or_a_full_allowlist_entry() {
    use VerificationPolicy::NeverVerifyAllowlistedImages as Allowlisted;
    let digest = "sha256:38a8906435c4dd5f4258899d46621bfd8eea3ad6ff494ee3c2f17ef0321625bd";
    let by_digest = format!("library/alpine@{digest}");
    // As the runtime is asked for each: the pod's words, the default tag applied.
    let images =
        [("alpine:3.19", "alpine:3.19"), (&by_digest, &by_digest), ("docker.io/alpine", "docker.io/alpine:latest")];
    for entry in ["alpine", "docker.io/library/alpine"] {
        let allowlist = Allowlist::new(Allowlisted, &[entry.to_owned()]).expect("a valid entry");
        let config = ManagerConfig {
            verification: VerificationConfig { policy: Allowlisted, allowlist },
            ..ManagerConfig::default()
        };
        let mut runtime = FakeRuntime::default().pulling_to(Ok("sha256:busybox"));
        for (_, asked) in images {
            runtime = runtime.with_image(asked, "sha256:alpine", 1);
        }
        let runtime = runtime.with_image("busybox:1", "sha256:busybox", 1);
        let manager = manager_with(runtime, NodeCredentials::none(), config, tempfile::tempdir().unwrap());
        for (image, _) in images {
            let outcome = manager.ensure_image_exists(request(image, Some(PullPolicy::IfNotPresent))).await;
            let outcome = outcome.unwrap_or_else(|error| panic!("{entry:?}, {image:?}: {error}"));
            assert!(outcome.pull.is_none(), "{entry:?} exempts {image:?}: used as present");
            assert_eq!(outcome.image_ref, "sha256:alpine");
        }
        assert!(manager.runtime().state().pulls.is_empty(), "{entry:?}: nothing pulled");
        // Not on the allowlist and never pulled with credentials: the pod pulls it.
        let outcome = manager.ensure_image_exists(request("busybox:1", Some(PullPolicy::IfNotPresent))).await;
        assert!(outcome.expect("pulled").pull.is_some(), "{entry:?}: busybox is verified");
    }
}

#[tokio::test]
async fn an_image_cri_imaged_did_not_pull_is_verified_only_under_always_verify() {
    for (policy, verified) in
        [(VerificationPolicy::NeverVerifyPreloadedImages, false), (VerificationPolicy::AlwaysVerify, true)]
    {
        let runtime = private_for("alice").with_image(PRIVATE_IMAGE, "sha256:preloaded", 1);
        let manager = manager_with(runtime, NodeCredentials::none(), verifying(policy), tempfile::tempdir().unwrap());
        let answer = manager.ensure_image_exists(pod_request("b", Vec::new())).await;
        assert_eq!(answer.is_err(), verified, "{policy:?}: {answer:?}");
    }
}

#[tokio::test]
async fn a_recorded_secret_with_a_rotated_credential_is_trusted_and_its_hash_updated() {
    let manager = pulled_by_pod_a(VerificationPolicy::AlwaysVerify).await;
    let before = manager.records.record("sha256:private").await.unwrap().expect("recorded");
    let rotated = secret("alices", "registry.local", "alice-rotated");
    let outcome = manager.ensure_image_exists(pod_request("a2", vec![rotated])).await.expect("trusted");
    assert!(outcome.pull.is_none());
    let after = manager.records.record("sha256:private").await.unwrap().expect("recorded");
    let hash = |record: &crate::records::format::PulledRecord| {
        record.credential_mapping["registry.local/team/app"].kubernetes_secrets[0].credential_hash.clone()
    };
    assert_ne!(hash(&before), hash(&after));
}

#[tokio::test]
async fn a_restarted_manager_keeps_its_decisions_from_the_records_on_disk() {
    let first = pulled_by_pod_a(VerificationPolicy::AlwaysVerify).await;
    let Built { root_dir, .. } = first;
    let runtime = private_for("alice").with_image(PRIVATE_IMAGE, "sha256:private", 1);
    let restarted =
        manager_with(runtime, NodeCredentials::none(), verifying(VerificationPolicy::AlwaysVerify), root_dir);
    restarted.ensure_image_exists(pod_request("b", Vec::new())).await.expect_err("B must still pull");
    let outcome = restarted.ensure_image_exists(pod_request("c", vec![secret("cs", "registry.local", "alice")])).await;
    assert!(outcome.expect("C may use it").pull.is_none());
    assert_eq!(restarted.runtime().pulled_as(), [None], "only B's own pull");
}

#[tokio::test]
async fn an_anonymous_pull_makes_the_image_every_pods() {
    let runtime = FakeRuntime::default().pulling_to(Ok("sha256:public"));
    let manager = manager_with(
        runtime,
        NodeCredentials::none(),
        verifying(VerificationPolicy::AlwaysVerify),
        tempfile::tempdir().unwrap(),
    );
    manager.ensure_image_exists(pod_request("a", Vec::new())).await.expect("pulled");
    let outcome = manager.ensure_image_exists(pod_request("b", Vec::new())).await.expect("used");
    assert!(outcome.pull.is_none());
    let record = manager.records.record("sha256:public").await.unwrap().expect("recorded");
    assert!(record.credential_mapping["registry.local/team/app"].node_pods_accessible);
    assert!(manager.root_dir.path().join("image_manager/pulled").exists());
}

#[tokio::test]
async fn an_image_the_kubelet_pulled_through_the_cri_with_credentials_is_verified_for_every_pod() {
    let manager = manager(private_for("alice"));
    let login = Arc::new(RegistryAuth::login("alice".into(), "alice-pw".into()));
    let image = ImageSpec { image: "registry.local/team/app:v1".into(), ..Default::default() };
    manager.pulls.pull_image(PullSpec { image, auth: Some(login), ..Default::default() }, None).await.expect("pulled");
    let error = manager.ensure_image_exists(pod_request("b", Vec::new())).await.expect_err("B must pull, and cannot");
    assert_eq!(error.reason(), "ErrImagePull");
    let record = manager.records.record("sha256:private").await.unwrap().expect("recorded");
    assert!(record.credential_mapping.is_empty(), "a record naming no one: every pod is verified");
}

#[tokio::test]
async fn a_present_image_removed_by_image_gc_during_its_presence_check_is_pulled_again_or_refused_under_never() {
    for (policy, pulled) in [(PullPolicy::IfNotPresent, true), (PullPolicy::Never, false)] {
        let hold = Hold::default();
        let runtime = FakeRuntime::default()
            .with_image("busybox:1.36", "sha256:old", 1)
            .pulling_to(Ok("sha256:old"))
            .holding_next_status(hold.clone());
        let built = Arc::new(manager(runtime));
        let ensuring = tokio::spawn({
            let built = built.clone();
            async move { built.ensure_image_exists(request("busybox:1.36", Some(policy))).await }
        });
        hold.entered.notified().await;
        // The collector removes the image while the presence check is under way (it saw it).
        drop(built.guard.claim("sha256:old", &[], built.guard.now()).expect("not handed out, not pulling"));
        hold.release.notify_one();
        let answer = ensuring.await.expect("joins");
        match pulled {
            true => assert!(answer.expect("pulled again").pull.is_some(), "the removed image is not handed out"),
            false => assert!(matches!(answer, Err(EnsureError::NeverPull { .. })), "absent under Never: {answer:?}"),
        }
        let counted = |present, pull| built.metrics.requests(Some(policy), Some(present), Some(pull));
        assert_eq!(counted(true, false), 1, "{policy:?}: counted as decided the first time");
        assert_eq!(counted(false, true) + counted(false, false), 0, "{policy:?}: and only then");
    }
}

#[tokio::test]
async fn an_image_handed_out_cannot_be_claimed_by_a_pass_that_began_before() {
    let built = manager(FakeRuntime::default().with_image("busybox:1.36", "sha256:old", 1));
    let pass_began = built.guard.now();
    let outcome = built.ensure_image_exists(request("busybox:1.36", Some(PullPolicy::IfNotPresent))).await;
    assert_eq!(outcome.expect("present").image_ref, "sha256:old");
    assert!(built.guard.claim("sha256:old", &[], pass_began).is_none());
}

/// Waits (at most 2 s) until the manager has no pull under way or queued.
async fn until_no_pull_in_flight(manager: &Built) {
    for _ in 0..2000 {
        if manager.pulls_in_flight().is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("still in flight: {:?}", manager.pulls_in_flight());
}

#[tokio::test]
async fn a_pull_whose_only_caller_left_is_cancelled_on_both_paths() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let runtime = FakeRuntime::default().gating_pulls(gate.clone());
    let manager = manager(runtime.pulling_to(Ok("sha256:big")));

    let ensure = manager.ensure_image_exists(request("registry.local/big:v1", None));
    assert!(tokio::time::timeout(Duration::from_millis(100), ensure).await.is_err(), "the caller left mid-pull");
    until_no_pull_in_flight(&manager).await;
    assert_eq!(manager.records.pulls_in_flight("registry.local/big:v1"), 0, "its intent ended");

    let cri = manager.pulls.pull_image(
        PullSpec { image: ImageSpec { image: "big:v2".into(), ..Default::default() }, ..Default::default() },
        None,
    );
    assert!(tokio::time::timeout(Duration::from_millis(100), cri).await.is_err(), "the caller left mid-pull");
    until_no_pull_in_flight(&manager).await;

    // Had either pull gone on, a permit would now let it finish and the image appear.
    gate.add_permits(2);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(manager.runtime().state().pulls.len(), 0, "both upstream pulls were dropped at the gate");
    assert!(manager.runtime().state().images.is_empty(), "no image was left behind");
}

#[tokio::test]
async fn a_present_image_pulled_for_a_service_account_is_for_that_account_only() {
    let dir = tempfile::tempdir().unwrap();
    let config = verifying(VerificationPolicy::AlwaysVerify);
    let manager =
        manager_with(private_for("sa-user"), node_with_token_plugin(dir.path()), config, tempfile::tempdir().unwrap());
    let pulled = manager.ensure_image_exists(with_service_account("a", "builder", "sa-uid", "token-a")).await;
    assert!(pulled.expect("pod A pulls with the plugin's login").pull.is_some());
    let record = manager.records.record("sha256:private").await.unwrap().expect("recorded");
    let recorded = &record.credential_mapping["registry.local/team/app"];
    let builder = crate::records::format::ServiceAccountRecord {
        uid: "sa-uid".into(),
        namespace: "default".into(),
        name: "builder".into(),
    };
    assert_eq!(recorded.kubernetes_service_accounts, [builder]);
    assert!(!recorded.node_pods_accessible && recorded.kubernetes_secrets.is_empty());

    let same_account = manager.ensure_image_exists(with_service_account("c", "builder", "sa-uid", "token-c")).await;
    assert!(same_account.expect("the same account may use it").pull.is_none());
    assert_eq!(manager.runtime().pulled_as().len(), 1, "no second pull");

    let mut never = pod_request("n", Vec::new());
    never.pull_policy = Some(PullPolicy::Never);
    let error = manager.ensure_image_exists(never).await.expect_err("no account: not this image");
    assert_eq!(error.reason(), "ErrImageNeverPull");

    for (pod, name, uid) in [("b", "other", "other-uid"), ("d", "builder", "recreated-uid")] {
        let outcome = manager.ensure_image_exists(with_service_account(pod, name, uid, "token")).await;
        assert!(outcome.expect("pulls with its own token").pull.is_some(), "{name} {uid} must pull");
    }
    assert_eq!(manager.runtime().pulled_as().len(), 3);
}

#[tokio::test]
async fn every_request_is_counted_once_with_what_it_found_out_as_kubelets_from_1_35_count_them() {
    use PullPolicy::{Always, IfNotPresent, Never};
    let present = || FakeRuntime::default().with_image("busybox:1.36", "sha256:b", 1).pulling_to(Ok("sha256:b"));
    let absent = || FakeRuntime::default().pulling_to(Ok("sha256:b"));
    let broken = || FakeRuntime::default().failing_status(tonic::Status::unavailable("runtime down"));
    type Labels = (Option<PullPolicy>, Option<bool>, Option<bool>);
    let cases: [(&str, FakeRuntime, &str, Option<PullPolicy>, Labels); 8] = [
        ("present", present(), "busybox:1.36", Some(IfNotPresent), (Some(IfNotPresent), Some(true), Some(false))),
        ("absent", absent(), "busybox:1.36", Some(IfNotPresent), (Some(IfNotPresent), Some(false), Some(true))),
        ("always: not looked at", present(), "busybox:1.36", Some(Always), (Some(Always), None, Some(true))),
        ("never, absent: refused undecided", absent(), "busybox:1.36", Some(Never), (Some(Never), Some(false), None)),
        ("inspect failed", broken(), "busybox:1.36", Some(IfNotPresent), (Some(IfNotPresent), None, None)),
        ("invalid name", absent(), "Not An Image", Some(Never), (Some(Never), None, None)),
        ("invalid name, no policy", absent(), "Not An Image", None, (None, None, None)),
        ("defaulted policy", absent(), "busybox", None, (Some(Always), None, Some(true))),
    ];
    for (case, runtime, image, policy, (counted_policy, counted_present, counted_pull)) in cases {
        let built = manager(runtime);
        let _ = built.ensure_image_exists(request(image, policy)).await;
        assert_eq!(built.metrics.requests(counted_policy, counted_present, counted_pull), 1, "{case}");
        let every = [None, Some(false), Some(true)];
        let total: u64 = [None, Some(Always), Some(IfNotPresent), Some(Never)]
            .into_iter()
            .flat_map(|policy| every.into_iter().flat_map(move |present| every.map(|pull| (policy, present, pull))))
            .map(|(policy, present, pull)| built.metrics.requests(policy, present, pull))
            .sum();
        assert_eq!(total, 1, "{case}: counted once");
    }
}

#[tokio::test]
async fn a_request_whose_caller_leaves_mid_pull_is_counted_all_the_same() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let built = manager(FakeRuntime::default().gating_pulls(gate).pulling_to(Ok("sha256:big")));
    let ensure = built.ensure_image_exists(request("registry.local/big:v1", Some(PullPolicy::IfNotPresent)));
    assert!(tokio::time::timeout(Duration::from_millis(100), ensure).await.is_err(), "the caller left mid-pull");
    assert_eq!(built.metrics.requests(Some(PullPolicy::IfNotPresent), Some(false), Some(true)), 1);
}

mod policy;
