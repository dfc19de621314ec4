//! The node's image policy at EnsureImageExists (and so at pre-pulls, which go through it).

use std::collections::BTreeMap;

use super::*;
use crate::policy::{InForce, Mode, Policies, parse};

/// Rejects everything but `registry.local` (the default), and a namespace `ci` that takes anything.
fn in_force(mode: Mode) -> InForce {
    let default = parse(
        br#"{"default": [{"type": "reject"}],
             "transports": {"docker": {"registry.local": [{"type": "insecureAcceptAnything"}]}}}"#,
    )
    .expect("a policy");
    let open = parse(br#"{"default": [{"type": "insecureAcceptAnything"}]}"#).expect("a policy");
    InForce {
        policies: Policies { default: Some(default), namespaces: BTreeMap::from([("ci".into(), open)]) },
        mode,
        audit_namespaces: Default::default(),
        loaded: None,
    }
}

fn in_namespace(image: &str, namespace: &str) -> EnsureRequest {
    let mut request = request(image, None);
    request.pod.namespace = namespace.into();
    request.pod.uid = format!("uid-in-{namespace}");
    request
}

#[tokio::test]
async fn an_image_the_policy_rejects_is_refused_with_the_kubelets_reason_present_or_not_and_never_pulled() {
    let manager =
        manager(FakeRuntime::default().with_image("busybox:1.36", "sha256:abc", 1).pulling_to(Ok("sha256:x")));
    manager.policy.replace(in_force(Mode::Enforce));
    for image in ["busybox:1.36", "alpine:3"] {
        let error = manager.ensure_image_exists(request(image, None)).await.expect_err(image);
        assert_eq!(error.reason(), "SignatureValidationFailed", "{image}");
        let expected = format!(
            "image pull failed for {image} because the signature validation failed: Running image docker://docker.io/library/{image} is rejected by policy (the node's policy, its default)"
        );
        assert_eq!(error.to_string(), expected);
    }
    assert!(manager.runtime().state().pulls.is_empty(), "nothing reached the runtime");
    // A failed pull's backoff, as for any: the kubelet's ImagePullBackOff next.
    let again = manager.ensure_image_exists(request("alpine:3", None)).await.expect_err("backed off");
    assert_eq!(again.reason(), "ImagePullBackOff");
    // Another registry, or the namespace with a file of its own, goes in.
    manager.ensure_image_exists(request("registry.local/app:v1", None)).await.expect("the policy accepts it");
    manager.ensure_image_exists(in_namespace("alpine:3", "ci")).await.expect("ci's own policy accepts it");
    assert_eq!(manager.runtime().state().pulls.len(), 2);
}

#[tokio::test]
async fn audit_mode_lets_a_refused_image_in_and_says_so() {
    let manager = manager(FakeRuntime::default().pulling_to(Ok("sha256:x")));
    manager.policy.replace(in_force(Mode::Audit));
    manager.ensure_image_exists(request("alpine:3", None)).await.expect("audit lets it in");
    assert_eq!(manager.runtime().state().pulls.len(), 1);
    let kept = manager.events.recent(&crate::events::Filter::default().prepare(), 0);
    let audit =
        kept.iter().find(|event| event.reason == crate::events::reason::POLICY_AUDIT).expect("a PolicyAudit event");
    assert!(audit.message.contains("docker.io/library/alpine:3 is rejected by policy"), "{}", audit.message);
}

#[tokio::test]
async fn a_namespace_audited_is_let_in_while_the_node_enforces_for_the_others() {
    let manager = manager(FakeRuntime::default().pulling_to(Ok("sha256:x")));
    let mut audited = in_force(Mode::Enforce);
    audited.audit_namespaces.insert("staging".into());
    manager.policy.replace(audited);
    manager.ensure_image_exists(in_namespace("alpine:3", "staging")).await.expect("staging is audited");
    let refused = manager.ensure_image_exists(in_namespace("alpine:3", "prod")).await.expect_err("prod enforces");
    assert_eq!(refused.reason(), "SignatureValidationFailed");
    // With no namespace, the node's mode.
    let refused = manager.ensure_image_exists(request("busybox:1.36", None)).await.expect_err("the node enforces");
    assert_eq!(refused.reason(), "SignatureValidationFailed");
    assert_eq!(manager.runtime().state().pulls.len(), 1, "only staging's pull reached the runtime");
}

fn check(image: &str, namespace: &str) -> crate::ensure::check::CheckRequest {
    crate::ensure::check::CheckRequest { image: image.into(), namespace: namespace.into(), ..Default::default() }
}

#[tokio::test]
async fn a_policy_check_explains_the_decision_and_changes_nothing() {
    use crate::{ensure::check::CheckResult, policy::PolicySource};
    let manager = manager(FakeRuntime::default().pulling_to(Ok("sha256:x")));
    manager.policy.replace(in_force(Mode::Enforce));
    let refused = manager.check_policy(check("alpine:3", "")).await.expect("checked");
    assert_eq!(refused.result(), CheckResult::Refused);
    assert_eq!((refused.verdict.policy.clone(), refused.verdict.scope.clone()), (PolicySource::Default, None));
    assert_eq!(refused.requirements, ["reject"]);
    assert_eq!(
        refused.refusal().as_deref(),
        Some(
            "Running image docker://docker.io/library/alpine:3 is rejected by policy (the node's policy, its default)"
        )
    );
    let scoped = manager.check_policy(check("registry.local/app:v1", "")).await.expect("checked");
    assert_eq!((scoped.result(), scoped.verdict.scope.as_deref()), (CheckResult::Allowed, Some("registry.local")));
    let own = manager.check_policy(check("alpine:3", "ci")).await.expect("checked");
    assert_eq!((own.result(), own.verdict.policy), (CheckResult::Allowed, PolicySource::Namespace("ci".into())));
    // Nothing pulled, counted, evented or backed off: a pod's pull afterwards is judged afresh.
    assert!(manager.runtime().state().pulls.is_empty());
    assert!(manager.events.recent(&crate::events::Filter::default().prepare(), 0).is_empty());
    let error = manager.ensure_image_exists(request("alpine:3", None)).await.expect_err("refused");
    assert_eq!(error.reason(), "SignatureValidationFailed");
}

#[tokio::test]
async fn a_policy_check_in_audit_mode_says_the_refusal_would_be_let_in_and_a_bad_image_is_invalid() {
    use crate::ensure::check::CheckResult;
    let manager = manager(FakeRuntime::default());
    manager.policy.replace(in_force(Mode::Audit));
    let audited = manager.check_policy(check("alpine:3", "")).await.expect("checked");
    assert_eq!(audited.result(), CheckResult::Audited);
    let error = manager.check_policy(check("Not An Image", "")).await.expect_err("invalid");
    assert_eq!(error.reason(), "InvalidImageName");
}
