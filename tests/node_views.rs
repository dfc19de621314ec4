//! What the daemon keeps about the node, read and changed by clients node agents and operators
//! run (Python grpcio, Node.js grpc-js) against the real binary on a real containerd: the events
//! kept though nobody watched (ListEvents), the pods' back-offs (ListBackoffs) and clearing them
//! (ClearBackoff).

mod support;

use cri_imaged::api::{EnsureImageExistsRequest, PodRef, PullPolicy, image_manager_client::ImageManagerClient};
use serde_json::{Value, json};
use support::{
    call,
    clients::{Answer, Client},
    process::{DaemonProcess, metric, metrics_listen},
    reason,
    stack::LocalStack,
    unix_channel,
};

const LIST_EVENTS: &str = "imagemanager.v1.ImageManager/ListEvents";
const LIST_BACKOFFS: &str = "imagemanager.v1.ImageManager/ListBackoffs";
const CLEAR_BACKOFF: &str = "imagemanager.v1.ImageManager/ClearBackoff";

fn for_pod(image: &str, uid: &str) -> EnsureImageExistsRequest {
    EnsureImageExistsRequest {
        image: image.into(),
        pull_policy: PullPolicy::IfNotPresent as i32,
        pod: Some(PodRef {
            namespace: "team".into(),
            name: format!("pod-{uid}"),
            uid: uid.into(),
            ..Default::default()
        }),
        container_name: "app".into(),
        ..Default::default()
    }
}

/// Each event's reason and image, oldest first.
fn told(listed: &Value) -> Vec<(String, String)> {
    let events = listed["events"].as_array().cloned().unwrap_or_default();
    let text = |event: &Value, key: &str| event[key].as_str().unwrap_or_default().to_owned();
    events.iter().map(|event| (text(event, "reason"), text(event, "image"))).collect()
}

/// Seconds of a Duration as protobuf's JSON mapping prints it (`"9.5s"`).
fn seconds(duration: &Value) -> f64 {
    let text = duration.as_str().unwrap_or_else(|| panic!("a duration: {duration}"));
    text.trim_end_matches('s').parse().unwrap_or_else(|error| panic!("{text}: {error}"))
}

#[tokio::test]
async fn events_are_kept_though_nobody_watched_and_a_pods_backoff_is_listed_then_cleared() {
    let Some(stack) = LocalStack::start() else { return };
    let clients = Client::available();
    // Each client does its share; with one installed (outside CI), it does both.
    let (Some(&python), Some(&node)) = (clients.first(), clients.last()) else { return };
    stack.seed("views/app:latest", "app");
    // The pod writes the image without a tag; a filter may write it with one.
    let (app, missing) = (stack.image("views/app"), stack.image("views/missing:1"));
    let dir = tempfile::tempdir().expect("tempdir");
    // Its image GC is off (as `DaemonProcess` starts it): no pass tells events of its own.
    let (metrics_port, metrics_addr) = metrics_listen();
    let flags = ["--metrics-listen", &metrics_addr];
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &flags).await;
    let socket = daemon.socket.clone();
    let mut client = ImageManagerClient::new(unix_channel(&socket));
    call(&mut client, for_pod(&app, "u1")).await.expect("pulled");
    let failed = call(&mut client, for_pod(&missing, "u2")).await.expect_err("no such image");
    assert_eq!(reason(&failed), "ErrImagePull");
    let refused = call(&mut client, for_pod(&missing, "u2")).await.expect_err("backing off");
    assert_eq!(reason(&refused), "ImagePullBackOff");

    // The pair backing off, by name.
    let listed = python.ok(&socket, LIST_BACKOFFS, json!({}));
    assert_eq!(listed["total"], "1", "{listed}");
    let entry = &listed["entries"][0];
    assert_eq!(entry["pod"], json!({ "namespace": "team", "name": "pod-u2", "uid": "u2" }), "{listed}");
    assert_eq!(entry["image"], json!(missing), "as the pod wrote it: {listed}");
    assert_eq!(seconds(&entry["delay"]), 10.0, "{listed}");
    assert!((0.0..=10.0).contains(&seconds(&entry["retry_after"])), "{listed}");
    assert!(entry["last_error"].as_str().is_some_and(|error| error.contains("not found")), "{listed}");
    assert_eq!(listed["entries"].as_array().map(Vec::len), Some(1), "u1's pull did not fail: {listed}");

    // What to clear must be said one way.
    for (request, why) in [
        (json!({}), "the request gave neither"),
        (json!({ "pod_uid": "u2", "image": missing, "all": true }), "not both"),
        (json!({ "pod_uid": "u2" }), "image is required with pod_uid"),
    ] {
        match python.call(&socket, CLEAR_BACKOFF, request.clone()) {
            Answer::Error { code, message } => {
                assert_eq!(code, "INVALID_ARGUMENT", "{request}: {message}");
                assert!(message.contains(why), "{request}: {message}");
            }
            Answer::Ok(answer) => panic!("{request} answered {answer}"),
        }
    }
    // Another spelling of the image is another pair; the pod's own clears it.
    let other = json!({ "pod_uid": "u2", "image": format!("{missing}@sha256:{}", "0".repeat(64)) });
    assert_eq!(node.ok(&socket, CLEAR_BACKOFF, other), json!({}), "nothing cleared");
    let cleared = node.ok(&socket, CLEAR_BACKOFF, json!({ "pod_uid": "u2", "image": missing }));
    assert_eq!(cleared, json!({ "cleared": "1" }));
    assert_eq!(node.ok(&socket, LIST_BACKOFFS, json!({})), json!({}), "none left, none held");
    let retried = call(&mut client, for_pod(&missing, "u2")).await.expect_err("tried at once, fails");
    assert_eq!(reason(&retried), "ErrImagePull");
    assert_eq!(node.ok(&socket, CLEAR_BACKOFF, json!({ "all": true })), json!({ "cleared": "1" }));
    assert_eq!(metric(metrics_port, "cri_imaged_backoff_cleared_total"), 2.0, "two pairs forgotten");

    // Every event, oldest first, though no one watched: progress is not kept.
    let all = python.ok(&socket, LIST_EVENTS, json!({}));
    let reasons: Vec<String> = told(&all).into_iter().map(|(reason, _)| reason).collect();
    let expected =
        ["Pulling", "Pulled", "Pulling", "Failed", "BackOff", "BackoffCleared", "Pulling", "Failed", "BackoffCleared"];
    assert_eq!(reasons, expected, "{all}");
    let clear_all = all["events"].as_array().and_then(|events| events.last()).expect("events");
    assert_eq!(clear_all["message"], "Every image pull back-off cleared (1 pod and image pairs)", "{clear_all}");
    // A filter by another spelling of the image; a pod's newest three.
    let tagged = json!({ "filter": { "image": format!("{app}:latest") } });
    let about_app = node.ok(&socket, LIST_EVENTS, tagged);
    assert_eq!(told(&about_app), [("Pulling".into(), app.clone()), ("Pulled".into(), app.clone())], "{about_app}");
    let newest = python.ok(&socket, LIST_EVENTS, json!({ "filter": { "pod_uid": "u2" }, "limit": 3 }));
    let newest: Vec<String> = told(&newest).into_iter().map(|(reason, _)| reason).collect();
    assert_eq!(newest, ["BackoffCleared", "Pulling", "Failed"]);
}
