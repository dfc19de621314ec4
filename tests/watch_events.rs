//! WatchEvents over the daemon's socket against a scripted CRI runtime: each outcome's events in
//! the kubelet's reasons, filters, a watcher that reads slowly, and the stream ending on stop.

mod support;

use std::time::Duration;

use cri_imaged::api::{Event, PullPolicy, WatchEventsRequest, image_manager_client::ImageManagerClient};
use cri_imaged::ensure::ManagerConfig;
use hyper_util::rt::TokioIo;
use support::{FakeStack, call, ensure};
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
    assert_eq!(summary(&done), ("Normal", "Pulled", pulled.message.as_str()));
    assert_eq!(done.image_ref, pulled.image_ref);
    assert_eq!(done.image_size_bytes, pulled.image_size_bytes);
    assert!(done.pull_duration.is_some() && done.pull_duration_with_waiting.is_some());

    // Present: Pulled, with the kubelet's "already present" message and no pull figures.
    let present = call(&mut client, ensure("busybox:1.36", IF_NOT_PRESENT)).await.expect("present");
    let used = next(&mut events).await;
    assert_eq!(summary(&used), ("Normal", "Pulled", present.message.as_str()));
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
    assert_eq!((backing_off.r#type.as_str(), backing_off.reason.as_str()), ("Normal", "BackOff"));
    assert!(backing_off.message.starts_with(r#"Back-off pulling image "broken:1""#), "{backing_off:?}");

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
    let mut client = stack.daemon.client();
    call(&mut client, ensure("busybox:1.36", IF_NOT_PRESENT)).await.expect("pulled");
    let mut other_pod = ensure("nginx:1.25", IF_NOT_PRESENT);
    other_pod.pod.as_mut().expect("a pod").uid = "other-uid".into();
    call(&mut client, other_pod).await.expect("pulled");
    for events in [&mut by_pod, &mut by_image] {
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
async fn a_watcher_that_does_not_read_is_told_what_it_lost_and_never_slows_a_request() {
    let stack = FakeStack::start(ManagerConfig::default()).await;
    stack.runtime.service.add_image("busybox:1.36", "sha256:b", 1);
    let mut idle = watch_with_small_windows(&stack).await;
    // Far more events than the watcher's ring and every buffer on the way hold, from 8 callers
    // at once, while the watcher reads nothing.
    let requests = cri_imaged::events::SUBSCRIBER_BUFFER * 5;
    let started = tokio::time::Instant::now();
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
    assert!(started.elapsed() < Duration::from_secs(60), "requests went on while nobody read");
    // HTTP/2 flow control lets some events through before the buffer fills; then one says how
    // many were lost, and the newest follow.
    let mut lost = 0;
    let mut read = 0;
    while lost == 0 {
        let event = next(&mut idle).await;
        read += 1;
        if event.reason == "Lagged" {
            lost = event.dropped;
            assert_eq!(event.r#type, "Warning");
            assert_eq!(event.message, format!("{lost} events dropped: this watcher read more slowly than events came"));
        }
        assert!(read <= requests, "no Lagged event among {read} events");
    }
    let mut after = 0;
    while tokio::time::timeout(Duration::from_millis(500), idle.message())
        .await
        .is_ok_and(|event| event.is_ok_and(|event| event.is_some()))
    {
        after += 1;
    }
    assert_eq!(read - 1 + usize::try_from(lost).expect("small") + after, requests, "each event read or counted lost");
}

#[tokio::test]
async fn a_watch_ends_when_the_daemon_stops() {
    let stack = FakeStack::start(ManagerConfig::default()).await;
    let mut events = watch(&stack, WatchEventsRequest::default()).await;
    let FakeStack { daemon, runtime: _runtime, dir: _dir } = stack;
    let stopped = tokio::time::timeout(Duration::from_secs(5), daemon.stop()).await;
    assert!(stopped.is_ok(), "the open watch does not hold the drain up");
    let ended = tokio::time::timeout(Duration::from_secs(5), events.message()).await.expect("ends at once");
    match ended {
        Err(status) => assert_eq!(status.code(), Code::Unavailable, "{status:?}"),
        Ok(None) => {}
        Ok(Some(event)) => panic!("no event was due: {event:?}"),
    }
}
