//! WatchEvents over the daemon's socket against a scripted CRI runtime: each outcome's events in
//! the kubelet's reasons, filters, a watcher that reads slowly, and the stream ending on stop.

mod support;

use std::{sync::Arc, time::Duration};

use cri_imaged::api::{Event, PullPolicy, WatchEventsRequest, image_manager_client::ImageManagerClient};
use cri_imaged::ensure::ManagerConfig;
use hyper_util::rt::TokioIo;
use support::{FakeStack, call, ensure, grpc_request, h2_connection, raw_unary, response_status};
use tokio::net::UnixStream;
use tonic::transport::{Endpoint, Uri};
use tonic::{Code, Status, Streaming};

const IF_NOT_PRESENT: i32 = PullPolicy::IfNotPresent as i32;
const NEVER: i32 = PullPolicy::Never as i32;

async fn watch(stack: &FakeStack, filter: WatchEventsRequest) -> Streaming<Event> {
    let mut client = stack.daemon.client();
    client.watch_events(filter).await.expect("watching").into_inner()
}

async fn next(events: &mut Streaming<Event>) -> Event {
    tokio::time::timeout(Duration::from_secs(10), events.message())
        .await
        .expect("an event within 10 s")
        .expect("the stream is fine")
        .expect("the stream goes on")
}

fn summary(event: &Event) -> (&str, &str, &str) {
    (event.r#type.as_str(), event.reason.as_str(), event.message.as_str())
}

#[tokio::test]
async fn each_outcome_is_told_in_the_kubelets_reasons_and_words() {
    let stack = FakeStack::start(ManagerConfig::default()).await;
    let mut events = watch(&stack, WatchEventsRequest::default()).await;
    let mut client = stack.daemon.client();

    // Absent: pulled.
    let pulled = call(&mut client, ensure("busybox:1.36", IF_NOT_PRESENT)).await.expect("pulled");
    let pulling = next(&mut events).await;
    assert_eq!(summary(&pulling), ("Normal", "Pulling", r#"Pulling image "busybox:1.36""#));
    let pod = pulling.pod.as_ref().expect("about the pod");
    assert_eq!((pod.namespace.as_str(), pod.name.as_str(), pod.uid.as_str()), ("default", "web", "0b7c6d5e-uid"));
    assert_eq!((pulling.container_name.as_str(), pulling.image.as_str()), ("app", "busybox:1.36"));
    let done = next(&mut events).await;
    assert_eq!((done.r#type.as_str(), done.reason.as_str()), ("Normal", "Pulled"));
    assert!(done.message.starts_with(r#"Successfully pulled image "busybox:1.36" in "#), "{done:?}");
    assert!(done.message.ends_with(&format!("Image size: {} bytes.", pulled.image_size_bytes)), "{done:?}");
    assert_eq!(done.image_ref, pulled.image_ref);
    assert_eq!(done.image_size_bytes, pulled.image_size_bytes);
    assert!(done.pull_duration.is_some() && done.pull_duration_with_waiting.is_some());

    // Present: Pulled, with the kubelet's "already present" message and no pull figures.
    call(&mut client, ensure("busybox:1.36", IF_NOT_PRESENT)).await.expect("present");
    let used = next(&mut events).await;
    let already = r#"Container image "busybox:1.36" already present on machine and can be accessed by the pod"#;
    assert_eq!(summary(&used), ("Normal", "Pulled", already));
    assert_eq!(used.image_ref, pulled.image_ref);
    assert_eq!(used.pull_duration, None);

    // Never, absent.
    call(&mut client, ensure("absent:1", NEVER)).await.expect_err("never");
    let refused = next(&mut events).await;
    assert_eq!(
        summary(&refused),
        ("Warning", "ErrImageNeverPull", r#"Container image "absent:1" is not present with pull policy of Never"#)
    );

    // A failed pull, then the pod's back-off.
    stack.runtime.service.fail_pull("broken:1", Status::not_found("manifest unknown"));
    call(&mut client, ensure("broken:1", IF_NOT_PRESENT)).await.expect_err("fails");
    assert_eq!(next(&mut events).await.reason, "Pulling");
    let failed = next(&mut events).await;
    assert_eq!(
        summary(&failed),
        ("Warning", "Failed", r#"Failed to pull image "broken:1": rpc error: code = NotFound desc = manifest unknown"#)
    );
    call(&mut client, ensure("broken:1", IF_NOT_PRESENT)).await.expect_err("backing off");
    let backing_off = next(&mut events).await;
    assert_eq!(summary(&backing_off), ("Normal", "BackOff", r#"Back-off pulling image "broken:1""#));

    // A name that does not parse, and a runtime that cannot say.
    call(&mut client, ensure("Not A Name", IF_NOT_PRESENT)).await.expect_err("invalid");
    let invalid = next(&mut events).await;
    assert_eq!((invalid.r#type.as_str(), invalid.reason.as_str()), ("Warning", "InspectFailed"));
    assert!(invalid.message.starts_with(r#"Failed to apply default image tag "Not A Name""#), "{invalid:?}");
    stack.runtime.service.script.lock().unwrap().status_error = Some(Status::internal("metadata store corrupt"));
    call(&mut client, ensure("other:1", IF_NOT_PRESENT)).await.expect_err("inspect fails");
    let inspect = next(&mut events).await;
    assert_eq!(
        summary(&inspect),
        (
            "Warning",
            "InspectFailed",
            r#"Failed to inspect image "other:1": rpc error: code = Internal desc = metadata store corrupt"#
        )
    );
}

#[tokio::test]
async fn a_watcher_sees_only_what_its_filter_asks_for() {
    let stack = FakeStack::start(ManagerConfig::default()).await;
    let mut by_pod = watch(&stack, WatchEventsRequest { pod_uid: "other-uid".into(), ..Default::default() }).await;
    let mut by_image = watch(&stack, WatchEventsRequest { image: "nginx:1.25".into(), ..Default::default() }).await;
    // Another spelling of the same reference.
    let full = WatchEventsRequest { image: "docker.io/library/nginx:1.25".into(), ..Default::default() };
    let mut by_full_name = watch(&stack, full).await;
    let mut client = stack.daemon.client();
    call(&mut client, ensure("busybox:1.36", IF_NOT_PRESENT)).await.expect("pulled");
    let mut other_pod = ensure("nginx:1.25", IF_NOT_PRESENT);
    other_pod.pod.as_mut().expect("a pod").uid = "other-uid".into();
    call(&mut client, other_pod).await.expect("pulled");
    for events in [&mut by_pod, &mut by_image, &mut by_full_name] {
        let (first, second) = (next(events).await, next(events).await);
        assert_eq!((first.reason.as_str(), first.image.as_str()), ("Pulling", "nginx:1.25"));
        assert_eq!((second.reason.as_str(), second.image.as_str()), ("Pulled", "nginx:1.25"));
    }
}

/// A watcher whose HTTP/2 windows are the protocol's default (64 KiB), not the 2 MiB a tonic
/// client grants: what it has not read stops flowing soon, as with a watcher in any language
/// that stops reading.
async fn watch_with_small_windows(stack: &FakeStack) -> Streaming<Event> {
    let socket = stack.daemon.socket.clone();
    let channel = Endpoint::from_static("http://localhost")
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(socket).await?)) }
        }));
    let mut client = ImageManagerClient::new(channel);
    client.watch_events(WatchEventsRequest::default()).await.expect("watching").into_inner()
}

#[tokio::test]
async fn a_watcher_that_does_not_read_is_told_what_it_lost_and_goes_on() {
    let stack = FakeStack::start(ManagerConfig::default()).await;
    stack.runtime.service.add_image("busybox:1.36", "sha256:b", 1);
    let mut idle = watch_with_small_windows(&stack).await;
    // Far more events than the watcher's ring and every buffer on the way hold, from 8 callers
    // at once, while the watcher reads nothing.
    let requests = cri_imaged::events::SUBSCRIBER_BUFFER * 5;
    let callers: Vec<_> = (0..8)
        .map(|_| {
            let mut client = stack.daemon.client();
            tokio::spawn(async move {
                for _ in 0..requests / 8 {
                    call(&mut client, ensure("busybox:1.36", IF_NOT_PRESENT)).await.expect("present");
                }
            })
        })
        .collect();
    for caller in callers {
        caller.await.expect("the caller ran");
    }
    // One more event marks the end: everything before it was read or counted lost.
    stack.runtime.service.add_image("marker:1", "sha256:m", 1);
    call(&mut stack.daemon.client(), ensure("marker:1", IF_NOT_PRESENT)).await.expect("present");
    let (mut read, mut lost, mut lags) = (0, 0, 0);
    loop {
        let event = next(&mut idle).await;
        if event.reason == "Lagged" {
            lags += 1;
            lost += event.dropped;
            assert_eq!(event.r#type, "Warning");
            assert_eq!(
                event.message,
                format!("{} events dropped: this watcher read more slowly than events came", event.dropped)
            );
        } else if event.image == "marker:1" {
            break;
        } else {
            read += 1;
        }
    }
    assert!(lags >= 1 && lost > 0, "the watcher was told it lost events");
    assert_eq!(read + usize::try_from(lost).expect("small"), requests, "each event read or counted lost");
}

#[tokio::test]
async fn a_watcher_that_stopped_reading_does_not_hold_the_daemon_s_exit_up() {
    let stack = FakeStack::start(ManagerConfig::default()).await;
    stack.runtime.service.add_image("busybox:1.36", "sha256:b", 1);
    let _idle = watch_with_small_windows(&stack).await;
    // More than its 64 KiB window of events: the stream's next frame waits for a window update
    // that never comes.
    let mut client = stack.daemon.client();
    for _ in 0..600 {
        call(&mut client, ensure("busybox:1.36", IF_NOT_PRESENT)).await.expect("present");
    }
    let FakeStack { daemon, runtime: _runtime, dir: _dir } = stack;
    // The in-process daemon's drain deadline is 5 s; answers are all in, so it exits well before.
    let stopped = tokio::time::timeout(Duration::from_secs(4), daemon.stop()).await;
    assert!(stopped.is_ok(), "the daemon waited for a watcher that does not read");
}

#[tokio::test]
async fn a_caller_that_gives_up_mid_pull_cancels_it_and_its_outcome_is_told() {
    let stack = FakeStack::start(ManagerConfig::default()).await;
    // A pull that never ends on its own.
    stack.runtime.service.script.lock().unwrap().pull_gate = Some(Arc::new(tokio::sync::Notify::new()));
    let mut events = watch(&stack, WatchEventsRequest::default()).await;
    let mut client = stack.daemon.client();
    let mut request = tonic::Request::new(ensure("busybox:1.36", IF_NOT_PRESENT));
    request.set_timeout(Duration::from_millis(300));
    // tonic's client gives up on its own timer (CANCELLED) or the daemon answers DEADLINE_EXCEEDED.
    let status = client.ensure_image_exists(request).await.expect_err("the caller's deadline");
    assert!(matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled), "{status:?}");
    assert_eq!(next(&mut events).await.reason, "Pulling");
    // The only caller gone, the pull is cancelled: no Pulling is left without its outcome.
    let done = next(&mut events).await;
    assert_eq!((done.reason.as_str(), done.image.as_str()), ("Failed", "busybox:1.36"), "{done:?}");
    assert!(done.message.ends_with("every caller went away; the pull was cancelled"), "{done:?}");
}

#[tokio::test]
async fn a_cri_pull_through_cri_imaged_is_told_for_the_pod_of_its_sandbox() {
    use cri_imaged::cri::{
        ImageSpec, PodSandboxConfig, PodSandboxMetadata, PullImageRequest, image_service_client::ImageServiceClient,
    };
    let stack = FakeStack::start(ManagerConfig::default()).await;
    let mut events = watch(&stack, WatchEventsRequest { namespace: "kube-system".into(), ..Default::default() }).await;
    let mut cri = ImageServiceClient::new(support::unix_channel(&stack.daemon.socket));
    let metadata =
        PodSandboxMetadata { name: "dns".into(), uid: "dns-uid".into(), namespace: "kube-system".into(), attempt: 0 };
    let request = PullImageRequest {
        image: Some(ImageSpec { image: "coredns:1.11".into(), ..Default::default() }),
        auth: None,
        sandbox_config: Some(PodSandboxConfig { metadata: Some(metadata), ..Default::default() }),
    };
    cri.pull_image(request).await.expect("pulled");
    let (pulling, pulled) = (next(&mut events).await, next(&mut events).await);
    assert_eq!((pulling.reason.as_str(), pulled.reason.as_str()), ("Pulling", "Pulled"));
    let pod = pulled.pod.expect("the sandbox's pod");
    assert_eq!((pod.namespace.as_str(), pod.name.as_str(), pod.uid.as_str()), ("kube-system", "dns", "dns-uid"));
}

#[tokio::test]
async fn a_watch_ends_when_the_daemon_stops() {
    let stack = FakeStack::start(ManagerConfig::default()).await;
    let mut events = watch(&stack, WatchEventsRequest::default()).await;
    let FakeStack { daemon, runtime: _runtime, dir: _dir } = stack;
    let stopped = tokio::time::timeout(Duration::from_secs(5), daemon.stop()).await;
    assert!(stopped.is_ok(), "the open watch does not hold the drain up");
    let ended = tokio::time::timeout(Duration::from_secs(5), events.message()).await.expect("ends at once");
    let status = ended.expect_err("ends with a status, not quietly");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(status.message(), "cri-imaged is shutting down; watch again when it is back");
}

const WATCH_EVENTS: &str = "/imagemanager.v1.ImageManager/WatchEvents";

#[tokio::test]
async fn a_watch_without_its_request_message_is_refused_with_the_reason() {
    let stack = FakeStack::start(ManagerConfig::default()).await;
    let mut client = h2_connection(&stack.daemon.socket).await.ready().await.expect("h2 ready");
    let (response, _) = client.send_request(grpc_request(WATCH_EVENTS, None), true).expect("send headers");
    let status = response_status(response).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(status.message(), "WatchEvents takes one WatchEventsRequest message; the call sent none");
}

#[tokio::test]
async fn a_watch_whose_request_is_not_a_watch_events_request_is_refused() {
    let stack = FakeStack::start(ManagerConfig::default()).await;
    // Field 1 says it is a string of 100 bytes; none follow.
    let status = raw_unary(h2_connection(&stack.daemon.socket).await, WATCH_EVENTS, &[0x0a, 100], "5S").await;
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert!(status.message().contains("failed to decode Protobuf message"), "{status:?}");
    // The daemon goes on serving.
    let mut events = watch(&stack, WatchEventsRequest::default()).await;
    stack.runtime.service.add_image("busybox:1.36", "sha256:b", 1);
    call(&mut stack.daemon.client(), ensure("busybox:1.36", IF_NOT_PRESENT)).await.expect("present");
    assert_eq!(next(&mut events).await.image, "busybox:1.36");
}
