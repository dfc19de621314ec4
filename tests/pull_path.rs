//! The pull path over the daemon's socket against a scripted CRI runtime whose pulls the test
//! controls: single-flight for a herd, callers going away, deadlines, the parallel-pull cap,
//! and backoff.

mod support;

use std::{num::NonZeroUsize, sync::Arc, time::Duration};

use cri_imaged::cri::{ImageSpec, PullImageRequest, image_service_client::ImageServiceClient};
use cri_imaged::{api::PullPolicy, ensure::ManagerConfig, pull::scheduler::SchedulerConfig};
use support::{FakeStack, call, ensure, raw_grpc_call, reason};
use tokio::sync::Notify;
use tonic::Code;
use tonic_types::StatusExt;

const IF_NOT_PRESENT: i32 = PullPolicy::IfNotPresent as i32;

async fn stack(config: ManagerConfig) -> FakeStack {
    FakeStack::start(config).await
}

fn gate(stack: &FakeStack) -> Arc<Notify> {
    let gate = Arc::new(Notify::new());
    stack.runtime.service.script.lock().unwrap().pull_gate = Some(gate.clone());
    gate
}

/// Waits (bounded) until the fake runtime has received `count` pulls.
async fn until_pulls_reach(stack: &FakeStack, count: usize) {
    for _ in 0..500 {
        if stack.runtime.service.pulls().len() >= count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the runtime never saw {count} pulls");
}

fn pod_request(image: &str, pod: usize) -> cri_imaged::api::EnsureImageExistsRequest {
    let mut request = ensure(image, IF_NOT_PRESENT);
    request.pod.as_mut().expect("pod").uid = format!("pod-{pod}");
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_requests_for_one_absent_image_make_one_upstream_pull() {
    let stack = stack(ManagerConfig::default()).await;
    let gate = gate(&stack);
    let calls: Vec<_> = (0..1000)
        .map(|pod| {
            let mut client = stack.daemon.client();
            tokio::spawn(async move { call(&mut client, pod_request("herd/app:v1", pod)).await })
        })
        .collect();
    until_pulls_reach(&stack, 1).await;
    // Give every request time to reach the daemon and join the pull before it finishes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    gate.notify_waiters();

    let mut refs = std::collections::HashSet::new();
    for call in calls {
        let response = call.await.expect("task").expect("every caller succeeds");
        assert!(response.pulled);
        refs.insert(response.image_ref);
    }
    assert_eq!(refs.len(), 1, "every caller got the same image ref");
    assert_eq!(stack.runtime.service.pulls().len(), 1, "exactly one upstream PullImage");
}

#[tokio::test]
async fn the_first_caller_disconnecting_mid_pull_does_not_fail_the_others() {
    let stack = stack(ManagerConfig::default()).await;
    let gate = gate(&stack);
    let mut first_client = stack.daemon.client();
    let first = tokio::spawn(async move { call(&mut first_client, pod_request("app:v1", 1)).await });
    until_pulls_reach(&stack, 1).await;
    let mut second_client = stack.daemon.client();
    let second = tokio::spawn(async move { call(&mut second_client, pod_request("app:v1", 2)).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    first.abort(); // drops the first request mid-pull: its stream is reset
    let _ = first.await;
    gate.notify_waiters();
    let response = second.await.expect("task").expect("the second caller still succeeds");
    assert!(response.pulled);
    assert_eq!(stack.runtime.service.pulls().len(), 1);
}

#[tokio::test]
async fn a_caller_deadline_ends_its_wait_with_deadline_exceeded_while_the_pull_goes_on() {
    let stack = stack(ManagerConfig::default()).await;
    let gate = gate(&stack);
    let mut patient_client = stack.daemon.client();
    let patient = tokio::spawn(async move { call(&mut patient_client, pod_request("slow:v1", 1)).await });
    until_pulls_reach(&stack, 1).await;

    let message = prost::Message::encode_to_vec(&pod_request("slow:v1", 2));
    let path = "/imagemanager.v1.ImageManager/EnsureImageExists";
    let (code, message) = raw_grpc_call(&stack.daemon.socket, path, &message, "200m").await;
    assert_eq!(Code::from(code), Code::DeadlineExceeded, "the server itself answers: {message}");
    assert!(message.contains("200ms"), "{message}");

    gate.notify_waiters();
    assert!(patient.await.expect("task").expect("the pull finished for the patient caller").pulled);
    assert_eq!(stack.runtime.service.pulls().len(), 1);
}

#[tokio::test]
async fn a_cap_of_two_parallel_pulls_holds_over_the_wire() {
    let max_parallel = NonZeroUsize::new(2);
    let config = ManagerConfig {
        scheduler: SchedulerConfig { max_parallel, pull_timeout: None, ..Default::default() },
        ..Default::default()
    };
    let stack = stack(config).await;
    stack.runtime.service.script.lock().unwrap().pull_delay = Duration::from_millis(100);
    let calls: Vec<_> = (0..6)
        .map(|i| {
            let mut client = stack.daemon.client();
            tokio::spawn(async move { call(&mut client, pod_request(&format!("image-{i}:v1"), i)).await })
        })
        .collect();
    for call in calls {
        call.await.expect("task").expect("pull succeeds");
    }
    let script = stack.runtime.service.script.lock().unwrap();
    assert_eq!(script.pulls.len(), 6);
    assert_eq!(script.most_pulls_at_once, 2);
}

#[tokio::test]
async fn a_pull_timeout_is_deadline_exceeded_with_err_image_pull() {
    let scheduler = SchedulerConfig {
        max_parallel: NonZeroUsize::new(1),
        pull_timeout: Some(Duration::from_millis(200)),
        ..Default::default()
    };
    let stack = stack(ManagerConfig { scheduler, ..Default::default() }).await;
    let _gate = gate(&stack); // never opened: the pull hangs
    let status = call(&mut stack.daemon.client(), pod_request("hangs:v1", 1)).await.expect_err("timed out");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(reason(&status), "ErrImagePull");
    assert!(status.message().contains("--image-pull-timeout"), "{}", status.message());
}

#[tokio::test]
async fn a_failed_pull_is_backed_off_with_retry_info_and_no_upstream_call() {
    let stack = stack(ManagerConfig::default()).await;
    stack.runtime.service.fail_pull("missing:v1", tonic::Status::not_found("manifest unknown"));
    let mut client = stack.daemon.client();
    let failed = call(&mut client, pod_request("missing:v1", 7)).await.expect_err("pull fails");
    assert_eq!(reason(&failed), "ErrImagePull");

    let refused = call(&mut client, pod_request("missing:v1", 7)).await.expect_err("backing off");
    assert_eq!(refused.code(), Code::Unavailable);
    assert_eq!(reason(&refused), "ImagePullBackOff");
    assert!(
        refused
            .message()
            .starts_with(r#"Back-off pulling image "missing:v1": ErrImagePull: rpc error: code = NotFound"#)
    );
    let retry = refused.get_error_details().retry_info().and_then(|info| info.retry_delay).expect("RetryInfo");
    assert!(retry > Duration::from_secs(9) && retry <= Duration::from_secs(10), "{retry:?}");
    assert_eq!(stack.runtime.service.pulls().len(), 1, "the refusal never reached the runtime");
}

#[tokio::test]
async fn a_pull_over_the_registry_limit_fails_with_resource_exhausted_and_backs_off() {
    let mut config = ManagerConfig::default();
    config.rate_limits.each_host = cri_imaged::pull::ratelimit::RateLimit::try_new(0.001, 1).expect("valid");
    let stack = stack(config).await;
    let mut client = stack.daemon.client();
    call(&mut client, pod_request("first:v1", 1)).await.expect("the burst admits one pull");

    let refused = call(&mut client, pod_request("second:v1", 2)).await.expect_err("over the limit");
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert_eq!(reason(&refused), "ErrImagePull");
    assert_eq!(refused.message(), "pull QPS exceeded");
    let backed_off = call(&mut client, pod_request("second:v1", 2)).await.expect_err("backing off");
    assert_eq!(reason(&backed_off), "ImagePullBackOff", "a throttled pull counts as a failed one");
    assert_eq!(stack.runtime.service.pulls().len(), 1);
}

/// A CRI PullImage (which waits for a registry token) joins an EnsureImageExists pull (which fails
/// at once over the limit) while it is queued: the shared pull waits for a token, and both get
/// the image from one upstream pull.
#[tokio::test]
async fn a_mixed_herd_shares_one_pull_that_waits_for_the_registry_limit() {
    let mut config = ManagerConfig::default();
    config.rate_limits.each_host = cri_imaged::pull::ratelimit::RateLimit::try_new(1.0, 1).expect("valid");
    // One slot (the kubelet's serial puller), so that the herd's pull queues behind the first.
    config.scheduler.max_parallel = NonZeroUsize::new(1);
    let stack = stack(config).await;
    let gate = Arc::new(Notify::new());
    stack.runtime.service.script.lock().unwrap().pull_gate = Some(gate.clone());
    let mut client = stack.daemon.client();
    // The only token (the next comes a second later) and the only slot go to the first pull.
    let first = tokio::spawn(async move { call(&mut client, pod_request("first:v1", 1)).await });
    for _ in 0..500 {
        if !stack.runtime.service.pulls().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut client = stack.daemon.client();
    let ensure = tokio::spawn(async move { call(&mut client, pod_request("herd:v1", 2)).await });
    // The EnsureImageExists caller starts the herd's pull (queued behind the first); then the CRI
    // caller joins it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut cri = ImageServiceClient::new(support::unix_channel(&stack.daemon.socket));
    let spec = Some(ImageSpec { image: "herd:v1".into(), ..Default::default() });
    let cri_pull =
        tokio::spawn(async move { cri.pull_image(PullImageRequest { image: spec, ..Default::default() }).await });
    tokio::time::sleep(Duration::from_millis(300)).await;

    stack.runtime.service.script.lock().unwrap().pull_gate = None;
    gate.notify_waiters();
    first.await.expect("task").expect("the first pull");
    ensure.await.expect("task").expect("the EnsureImageExists caller gets the image");
    cri_pull.await.expect("task").expect("the CRI caller gets the image");
    let herd_pulls =
        stack.runtime.service.pulls().iter().filter(|pull| pull.image.as_ref().unwrap().image == "herd:v1").count();
    assert_eq!(herd_pulls, 1, "one upstream pull for the herd");
}
