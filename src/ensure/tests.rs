use std::sync::Mutex;

use super::*;
use crate::runtime::PresentImage;

/// A runtime whose answers the test scripts, and which records what it was asked.
#[derive(Default)]
struct ScriptedRuntime {
    present: Mutex<Option<PresentImage>>,
    status_error: Mutex<Option<tonic::Status>>,
    pull_result: Mutex<Option<Result<String, tonic::Status>>>,
    pulls: Mutex<Vec<PullSpec>>,
    status_calls: Mutex<Vec<ImageSpec>>,
}

impl ScriptedRuntime {
    fn with_present(id: &str, size: u64) -> Self {
        let runtime = Self::default();
        *runtime.present.lock().unwrap() = Some(PresentImage { id: id.into(), size });
        runtime
    }

    fn pulling_to(self, result: Result<&str, tonic::Status>) -> Self {
        *self.pull_result.lock().unwrap() = Some(result.map(str::to_owned));
        self
    }
}

impl ImageRuntime for ScriptedRuntime {
    async fn image_status(&self, image: ImageSpec) -> Result<Option<PresentImage>, RuntimeError> {
        self.status_calls.lock().unwrap().push(image);
        if let Some(status) = self.status_error.lock().unwrap().clone() {
            return Err(status.into());
        }
        Ok(self.present.lock().unwrap().clone())
    }

    async fn pull_image(&self, spec: PullSpec) -> Result<String, RuntimeError> {
        let name = spec.image.image.clone();
        self.pulls.lock().unwrap().push(spec);
        let result = self.pull_result.lock().unwrap().clone().expect("the test scripted no pull");
        let image_ref = result?;
        if image_ref.is_empty() {
            return Err(RuntimeError::EmptyImageRef(name));
        }
        // A pulled image is present from now on.
        *self.present.lock().unwrap() = Some(PresentImage { id: image_ref.clone(), size: 777 });
        Ok(image_ref)
    }

    async fn probe(&self) -> Result<(), RuntimeError> {
        Ok(())
    }
}

/// The manager as the daemon builds it, with the scripted runtime under it in reach.
struct Built {
    manager: Arc<ImageManager<ScriptedRuntime>>,
    runtime: Arc<ScriptedRuntime>,
}

impl std::ops::Deref for Built {
    type Target = ImageManager<ScriptedRuntime>;

    fn deref(&self) -> &Self::Target {
        &self.manager
    }
}

impl Built {
    fn runtime(&self) -> &ScriptedRuntime {
        &self.runtime
    }
}

fn manager(runtime: ScriptedRuntime) -> Built {
    let node_credentials = Arc::new(crate::credentials::NodeCredentials::none());
    let parts = crate::daemon::Parts::build(Arc::new(runtime), ManagerConfig::default(), node_credentials);
    Built { manager: parts.manager, runtime: parts.runtime }
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
    }
}

#[tokio::test]
async fn present_image_with_if_not_present_is_used_without_pulling() {
    let manager = manager(ScriptedRuntime::with_present("sha256:abc", 1234));
    let outcome = manager.ensure_image_exists(request("busybox:1.36", None)).await.expect("present");
    assert_eq!(outcome.image_ref, "sha256:abc");
    assert_eq!(outcome.message, r#"Container image "busybox:1.36" already present on machine"#);
    assert_eq!(outcome.pull, None);
    assert_eq!(outcome.image_size, 1234);
    assert!(manager.runtime().pulls.lock().unwrap().is_empty());
}

#[tokio::test]
async fn absent_image_is_pulled_with_the_default_tag_annotations_handler_and_sandbox() {
    let runtime = ScriptedRuntime::default().pulling_to(Ok("sha256:new"));
    let manager = manager(runtime);
    let outcome = manager.ensure_image_exists(request("busybox", None)).await.expect("pulled");
    assert_eq!(outcome.image_ref, "sha256:new");
    assert!(outcome.pull.is_some());
    assert_eq!(outcome.image_size, 777, "the size is looked up after the pull");
    assert!(outcome.message.starts_with(r#"Successfully pulled image "busybox" in "#), "{}", outcome.message);
    assert!(outcome.message.ends_with("Image size: 777 bytes."), "{}", outcome.message);

    let pulls = manager.runtime().pulls.lock().unwrap();
    assert_eq!(pulls.len(), 1);
    let pull = &pulls[0];
    assert_eq!(pull.image.image, "busybox:latest", "no docker.io prefix, only the tag");
    assert_eq!(pull.image.runtime_handler, "runc");
    assert_eq!(pull.image.annotations.get("team").map(String::as_str), Some("payments"));
    assert_eq!(pull.sandbox_config.as_ref().map(|c| c.hostname.as_str()), Some("web-0"));
}

#[tokio::test]
async fn always_pulls_even_when_present() {
    let runtime = ScriptedRuntime::with_present("sha256:old", 1).pulling_to(Ok("sha256:fresh"));
    let manager = manager(runtime);
    let outcome = manager.ensure_image_exists(request("busybox:1.36", Some(PullPolicy::Always))).await.expect("pulled");
    assert_eq!(outcome.image_ref, "sha256:fresh");
    assert_eq!(manager.runtime().pulls.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn unspecified_policy_on_latest_pulls_even_when_present() {
    let runtime = ScriptedRuntime::with_present("sha256:old", 1).pulling_to(Ok("sha256:fresh"));
    let manager = manager(runtime);
    manager.ensure_image_exists(request("busybox", None)).await.expect("pulled");
    assert_eq!(manager.runtime().pulls.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn never_with_an_absent_image_fails_with_the_kubelet_message() {
    let manager = manager(ScriptedRuntime::default());
    let error =
        manager.ensure_image_exists(request("busybox:1.36", Some(PullPolicy::Never))).await.expect_err("absent");
    assert_eq!(error.reason(), "ErrImageNeverPull");
    assert_eq!(error.to_string(), r#"Container image "busybox:1.36" is not present with pull policy of Never"#);
    assert!(manager.runtime().pulls.lock().unwrap().is_empty());
}

#[tokio::test]
async fn never_with_a_present_image_uses_it() {
    let manager = manager(ScriptedRuntime::with_present("sha256:abc", 5));
    let outcome = manager.ensure_image_exists(request("busybox", Some(PullPolicy::Never))).await.expect("present");
    assert_eq!(outcome.image_ref, "sha256:abc");
}

#[tokio::test]
async fn invalid_names_fail_before_the_runtime_is_asked() {
    let manager = manager(ScriptedRuntime::default());
    for image in ["", "Busybox", "busybox:-tag", &"a".repeat(64)] {
        let error = manager.ensure_image_exists(request(image, None)).await.expect_err(image);
        assert_eq!(error.reason(), "InvalidImageName", "{image:?}");
        assert!(error.to_string().starts_with("Failed to apply default image tag"), "{error}");
    }
    assert!(manager.runtime().status_calls.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_failing_image_status_is_an_inspect_error() {
    let runtime = ScriptedRuntime::default();
    *runtime.status_error.lock().unwrap() = Some(tonic::Status::unavailable("socket gone"));
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
    let manager = manager(ScriptedRuntime::default().pulling_to(Ok("")));
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
            "rpc error: code = Unknown desc = failed to resolve reference: not found",
        ),
    ];
    for (runtime_message, reason, message) in cases {
        let runtime = ScriptedRuntime::default().pulling_to(Err(tonic::Status::unknown(runtime_message)));
        let manager = manager(runtime);
        let error = manager.ensure_image_exists(request("busybox", None)).await.expect_err(runtime_message);
        assert_eq!(error.reason(), reason, "{runtime_message}");
        assert_eq!(error.to_string(), message);
    }
}

fn request_for_pod(image: &str, uid: &str) -> EnsureRequest {
    let mut request = request(image, Some(PullPolicy::IfNotPresent));
    request.pod.uid = uid.into();
    request
}

#[tokio::test(start_paused = true)]
async fn a_failed_pull_backs_off_that_pod_and_image_without_asking_the_runtime() {
    let runtime = ScriptedRuntime::default().pulling_to(Err(tonic::Status::not_found("manifest unknown")));
    let manager = manager(runtime);
    let first = manager.ensure_image_exists(request_for_pod("app:v1", "pod-a")).await.expect_err("pull fails");
    assert_eq!(first.reason(), "ErrImagePull");

    tokio::time::advance(Duration::from_secs(3)).await;
    let refused = manager.ensure_image_exists(request_for_pod("app:v1", "pod-a")).await.expect_err("backing off");
    assert_eq!(refused.reason(), "ImagePullBackOff");
    assert_eq!(
        refused.to_string(),
        r#"Back-off pulling image "app:v1": rpc error: code = NotFound desc = manifest unknown"#
    );
    assert!(matches!(refused, EnsureError::BackOff { retry_after, .. } if retry_after == Duration::from_secs(7)));
    assert_eq!(manager.runtime().pulls.lock().unwrap().len(), 1, "the refusal did not reach the runtime");

    // Another pod is not held back by pod-a's failure.
    manager.ensure_image_exists(request_for_pod("app:v1", "pod-b")).await.expect_err("tries, fails");
    assert_eq!(manager.runtime().pulls.lock().unwrap().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn after_the_backoff_window_the_pull_is_tried_again_and_the_next_window_doubles() {
    let runtime = ScriptedRuntime::default().pulling_to(Err(tonic::Status::not_found("manifest unknown")));
    let manager = manager(runtime);
    let _ = manager.ensure_image_exists(request_for_pod("app:v1", "pod-a")).await;
    tokio::time::advance(Duration::from_secs(10)).await;
    let retried = manager.ensure_image_exists(request_for_pod("app:v1", "pod-a")).await.expect_err("fails again");
    assert_eq!(retried.reason(), "ErrImagePull", "the window was over, so the runtime was asked");
    tokio::time::advance(Duration::from_secs(19)).await;
    let refused = manager.ensure_image_exists(request_for_pod("app:v1", "pod-a")).await.expect_err("20s window");
    assert_eq!(refused.reason(), "ImagePullBackOff");
    assert_eq!(manager.runtime().pulls.lock().unwrap().len(), 2);
}
