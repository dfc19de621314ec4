//! GetStatus over the daemon's socket against a scripted CRI runtime: pulls under way with their
//! callers, a pod's back-off, the presence cache, image GC's last pass, the runtime's health.

mod support;

use std::{sync::Arc, time::Duration};

use cri_imaged::api::{GarbageCollectRequest, GetStatusRequest, GetStatusResponse, PullPolicy};
use cri_imaged::ensure::ManagerConfig;
use support::{FakeStack, call, ensure, reason};
use tokio::sync::Notify;
use tonic::{Code, Status};

const IF_NOT_PRESENT: i32 = PullPolicy::IfNotPresent as i32;

async fn status(stack: &FakeStack, request: GetStatusRequest) -> GetStatusResponse {
    let mut client = stack.daemon.client();
    client.get_status(request).await.expect("GetStatus answers").into_inner()
}

#[tokio::test]
async fn a_pull_under_way_is_listed_with_its_callers_until_it_ends() {
    let stack = FakeStack::start(ManagerConfig::default()).await;
    let gate = Arc::new(Notify::new());
    stack.runtime.service.script.lock().unwrap().pull_gate = Some(gate.clone());
    let callers: Vec<_> = (0..3)
        .map(|_| {
            let mut client = stack.daemon.client();
            tokio::spawn(async move { call(&mut client, ensure("busybox:1.36", IF_NOT_PRESENT)).await })
        })
        .collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let pull = loop {
        let now = status(&stack, GetStatusRequest::default()).await;
        if let Some(pull) = now.pulls.first().filter(|pull| pull.callers == 3) {
            break pull.clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "three callers never shared the pull: {now:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(pull.image, "busybox:1.36");
    assert!(pull.asked.is_some() && pull.started.is_some(), "{pull:?}");
    // The fake may not be waiting on the gate yet: open it until the callers have their answer.
    let opening = tokio::spawn(async move {
        loop {
            gate.notify_waiters();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    for caller in callers {
        let answered = tokio::time::timeout(Duration::from_secs(10), caller).await.expect("answered within 10 s");
        answered.expect("joins").expect("pulled");
    }
    opening.abort();
    let after = status(&stack, GetStatusRequest::default()).await;
    assert!(after.pulls.is_empty(), "{after:?}");
    assert!(after.runtime_reachable, "{after:?}");
    assert_eq!(after.version, env!("CARGO_PKG_VERSION"));
    assert!(!after.presence_cache_watching, "the fake runtime has no event service");
}

#[tokio::test]
async fn a_pods_back_off_is_told_for_its_image() {
    let stack = FakeStack::start(ManagerConfig::default()).await;
    stack.runtime.service.fail_pull("broken:1", Status::not_found("manifest unknown"));
    let mut client = stack.daemon.client();
    call(&mut client, ensure("broken:1", IF_NOT_PRESENT)).await.expect_err("fails");
    let pod = GetStatusRequest { pod_uid: "0b7c6d5e-uid".into(), image: "broken:1".into(), ..Default::default() };
    let now = status(&stack, pod).await;
    assert_eq!(now.backoff_entries, 1);
    let backoff = now.backoff.expect("asked for");
    assert!(backoff.backing_off);
    assert_eq!(backoff.last_error, "rpc error: code = NotFound desc = manifest unknown");
    let retry_after = backoff.retry_after.expect("time left");
    assert!(retry_after.seconds <= 10 && (retry_after.seconds, retry_after.nanos) > (0, 0), "{retry_after:?}");
    let other = GetStatusRequest { pod_uid: "another-uid".into(), image: "broken:1".into(), ..Default::default() };
    assert!(!status(&stack, other).await.backoff.expect("asked for").backing_off, "back-off is per pod");
    assert_eq!(status(&stack, GetStatusRequest::default()).await.backoff, None, "not asked for");
}

#[tokio::test]
async fn image_gcs_last_pass_and_an_unreachable_runtime_are_told() {
    let stack = FakeStack::start(ManagerConfig::default()).await;
    assert_eq!(status(&stack, GetStatusRequest::default()).await.last_gc_pass, None, "no pass yet");
    // The fake serves no RuntimeService: the pass cannot list containers.
    let mut client = stack.daemon.client();
    let refused = client.garbage_collect(GarbageCollectRequest { dry_run: true, delete_unused: false }).await;
    let refused = refused.expect_err("no ListContainers");
    assert_eq!((refused.code(), reason(&refused).as_str()), (Code::Unimplemented, "ImageGCFailed"));
    let pass = status(&stack, GetStatusRequest::default()).await.last_gc_pass.expect("a pass was made");
    assert!(pass.dry_run && pass.finished.is_some(), "{pass:?}");
    assert!(pass.failure.starts_with("failed to list containers: rpc error: code = Unimplemented"), "{pass:?}");

    stack.runtime.service.freeze();
    let frozen = status(&stack, GetStatusRequest::default()).await;
    assert!(!frozen.runtime_reachable);
    assert!(!frozen.runtime_error.is_empty(), "{frozen:?}");
    stack.runtime.service.thaw();
}

#[tokio::test]
async fn each_registry_bucket_shows_its_limit_and_tokens_left() {
    use cri_imaged::pull::ratelimit::{RateLimit, RateLimitConfig, RateLimitMode};
    let limit = |qps, burst| RateLimit::try_new(qps, burst).expect("valid").expect("limited");
    let rate_limits = RateLimitConfig {
        each_host: Some(limit(5.0, 10)),
        per_host: vec![("registry.local:5000".into(), limit(0.01, 3))],
        mode: RateLimitMode::Wait,
        ..Default::default()
    };
    let stack = FakeStack::start(ManagerConfig { rate_limits, ..ManagerConfig::default() }).await;
    let mut client = stack.daemon.client();
    for image in ["registry.local:5000/app:v1", "registry.local:5000/app:v2"] {
        call(&mut client, ensure(image, IF_NOT_PRESENT)).await.expect("pulled");
    }
    let now = status(&stack, GetStatusRequest::default()).await;
    assert_eq!(now.rate_limit_mode, "wait");
    let buckets: Vec<(&str, f64, u32)> = now.rate_limits.iter().map(|b| (b.host.as_str(), b.qps, b.burst)).collect();
    assert_eq!(buckets, [("", 5.0, 10), ("registry.local:5000", 0.01, 3)], "the default bucket first");
    assert_eq!(now.rate_limits[0].tokens, 10.0, "no pull from another registry");
    let left = now.rate_limits[1].tokens;
    assert!((1.0..1.1).contains(&left), "two of three taken, refilling at 0.01 a second: {left}");
}
