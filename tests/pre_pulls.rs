//! Pre-pulls on real containerd, through a throttled loopback registry, driven by clients node
//! agents run (Python grpcio, Node.js grpc-js): asked for, listed, cancelled; behind pods' pulls
//! (a pod's pull takes the slot of a running pre-pull); resumed after the daemon is killed;
//! declared with `--pre-pull` and pulled again when removed behind our back; pinned for a while.

mod support;

use std::{net::SocketAddr, path::Path, time::Duration};

use serde_json::{Value, json};
use support::{
    clients::{Answer, Client},
    process::{self, DaemonProcess},
    stack::{LocalStack, StackOptions},
    throttle::ThrottleProxy,
};

const SUBMIT: &str = "imagemanager.v1.ImageManager/SubmitPrePull";
const LIST: &str = "imagemanager.v1.ImageManager/ListPrePulls";
const GET: &str = "imagemanager.v1.ImageManager/GetPrePull";
const CANCEL: &str = "imagemanager.v1.ImageManager/CancelPrePull";
const ENSURE: &str = "imagemanager.v1.ImageManager/EnsureImageExists";
const STATUS: &str = "imagemanager.v1.ImageManager/GetStatus";

const MIB: u64 = 1 << 20;

fn first_client() -> Option<Client> {
    Client::available().into_iter().next()
}

fn state(client: Client, socket: &Path, id: &str) -> Value {
    client.ok(socket, GET, json!({ "id": id }))
}

async fn until_state(client: Client, socket: &Path, id: &str, wanted: &str, limit: Duration) -> Value {
    let mut last = Value::Null;
    support::eventually(&format!("pre-pull {id} {wanted}"), limit, || {
        last = state(client, socket, id);
        last["state"] == wanted
    })
    .await;
    last
}

// Multi-threaded: the clients block a thread while the throttling proxies run on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_pull_goes_before_a_running_pre_pull_whose_download_stops_and_finishes_after_and_bad_requests_say_why() {
    let Some(stack) = LocalStack::start() else { return };
    let Some(client) = first_client() else { return };
    stack.seed_sized("prepull/big:1", 24 * MIB);
    stack.seed("prepull/small:1", "small");
    let registry: SocketAddr = stack.registry.parse().expect("the registry's address");
    // Two ways to the one registry, each held still by the test while it looks, so that no
    // timing decides the outcome on a loaded machine: the pre-pull's, slow; the pod's.
    let pre_pull_link = ThrottleProxy::start(registry, 2 * MIB).await;
    let pod_link = ThrottleProxy::start(registry, 64 * MIB).await;
    stack.route_through(pre_pull_link.addr.port());
    stack.route_through(pod_link.addr.port());
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("cri-imaged.sock");
    // One pull at a time (the kubelet's default): the pod's pull finds no slot to spare.
    let daemon = DaemonProcess::start(&socket, &stack.containerd_socket, &["--serialize-image-pulls"]).await;
    let (big, small) = (pre_pull_link.image("prepull/big:1"), pod_link.image("prepull/small:1"));

    let submitted = client.ok(&socket, SUBMIT, json!({ "images": [big], "priority": 5 }));
    let pre_pull = submitted["pre_pulls"][0].clone();
    let id = pre_pull["id"].as_str().expect("an id").to_owned();
    assert_eq!(id.len(), 16, "{pre_pull}");
    assert_eq!(pre_pull["image"], json!(big));
    let again = client.ok(&socket, SUBMIT, json!({ "images": [big] }));
    assert_eq!(again["pre_pulls"][0]["id"], json!(id), "the same image is the same pre-pull");
    support::eventually("the pre-pull downloading", Duration::from_secs(30), || {
        let now = state(client, &socket, &id);
        now["state"] == "pulling" && now["progress"]["bytes_done"].as_str().is_some_and(|done| done != "0")
    })
    .await;
    // Held mid-download (12 s from the end at this rate): it keeps its slot.
    pre_pull_link.stall();
    // GetStatus says whose pull it is and that the runtime is pulling it.
    let status = client.ok(&socket, STATUS, json!({}));
    let pull = &status["pulls"][0];
    assert_eq!((&pull["image"], &pull["pre_pull"], &pull["state"]), (&json!(big), &json!(true), &json!("pulling")));

    // A pod's pull takes the slot (its own registry held still, so it keeps it): the pre-pull is
    // cancelled, and the runtime's download of it ends, so that its link, open again, carries
    // nothing.
    pod_link.stall();
    let pod = json!({ "image": small, "pull_policy": "IF_NOT_PRESENT", "pod": { "namespace": "default", "name": "web", "uid": "uid-web" } });
    let pod_socket = socket.clone();
    let answer = tokio::task::spawn_blocking(move || client.ok(&pod_socket, ENSURE, pod));
    daemon.wait_for_log("the pre-pull preempted", |log| log.contains("a pre-pull gave its slot to a pod's pull")).await;
    let before = pre_pull_link.bytes_forwarded();
    pre_pull_link.resume();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let meanwhile = pre_pull_link.bytes_forwarded() - before;
    let preempted = state(client, &socket, &id);
    let status = client.ok(&socket, STATUS, json!({}));
    eprintln!("preempted pre-pull: {before} bytes fetched before, {meanwhile} in the 2 s after; {preempted}; {status}");
    let log = daemon.log_text();
    assert!(meanwhile < MIB, "the pre-pull's download went on after it gave its slot: {meanwhile} bytes in 2 s\n{log}");
    assert_ne!(preempted["state"], json!("done"), "{preempted}\n{log}");
    let waiting = status["pulls"].as_array().and_then(|pulls| pulls.iter().find(|pull| pull["image"] == json!(big)));
    assert_eq!(waiting.map(|pull| &pull["state"]), Some(&json!("slot")), "queued for a slot again: {status}");
    pod_link.resume();
    let answer = answer.await.expect("the pod's call");
    assert_eq!(answer["pulled"], json!(true), "{answer}");
    let done = until_state(client, &socket, &id, "done", Duration::from_secs(60)).await;
    assert!(done["image_ref"].as_str().is_some_and(|image_ref| image_ref.starts_with("sha256:")), "{done}");
    assert!(stack.present(&big), "the pre-pull finished after the pod's pull");

    // Listed, and in GetStatus.
    let listed = client.ok(&socket, LIST, json!({}));
    assert_eq!(listed["pre_pulls"][0]["id"], json!(id));
    let status = client.ok(&socket, STATUS, json!({}));
    assert_eq!(status["pre_pulls"][0]["state"], json!("done"), "{status}");

    // Bad requests, each with its reason.
    for client in Client::available() {
        let refused = |method: &str, request: Value| match client.call(&socket, method, request.clone()) {
            Answer::Error { code, message } => (code, message),
            Answer::Ok(answer) => panic!("{client:?} {method} {request} answered {answer}"),
        };
        let (code, message) = refused(SUBMIT, json!({ "images": ["Not An Image"] }));
        assert_eq!(code, "INVALID_ARGUMENT");
        assert!(message.contains("Not An Image"), "{message}");
        let (code, message) = refused(SUBMIT, json!({ "images": [] }));
        assert_eq!((code.as_str(), message.as_str()), ("INVALID_ARGUMENT", "images: none given"));
        // Each library's JSON for a Duration: protobuf's mapping, or proto-loader's object.
        let negative = if client == Client::GrpcJs { json!({ "seconds": -5 }) } else { json!("-5s") };
        let (code, message) = refused(SUBMIT, json!({ "images": ["a:1"], "pin_for": negative }));
        assert_eq!(code, "INVALID_ARGUMENT", "{message}");
        assert!(message.starts_with("pin_for:"), "{message}");
        // Every field bounded at the API, the field and its bound named.
        let long_handler = "h".repeat(64);
        let (code, message) = refused(SUBMIT, json!({ "images": ["a:1"], "runtime_handler": long_handler }));
        assert_eq!(code, "INVALID_ARGUMENT", "{message}");
        assert!(message.starts_with("runtime_handler: 64 bytes, more than 63"), "{message}");
        let (code, message) = refused(SUBMIT, json!({ "images": ["a:1"], "runtime_handler": "Not_A_Label" }));
        assert_eq!(code, "INVALID_ARGUMENT", "{message}");
        assert!(message.contains("is not a DNS label"), "{message}");
        let (code, message) = refused(SUBMIT, json!({ "images": [format!("a:1{}", "0".repeat(2000))] }));
        assert_eq!(code, "INVALID_ARGUMENT", "{message}");
        let (code, message) = refused(GET, json!({ "id": "0123456789abcdef" }));
        assert_eq!((code.as_str(), message.as_str()), ("NOT_FOUND", r#"no pre-pull "0123456789abcdef""#));
        assert_eq!(refused(CANCEL, json!({ "id": "nope" })).0, "NOT_FOUND");
    }
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pre_pull_cut_short_by_a_kill_goes_on_from_what_it_fetched_and_a_cancel_stops_one() {
    let Some(stack) = LocalStack::start() else { return };
    let Some(client) = first_client() else { return };
    const SIZE: u64 = 32 * MIB;
    stack.seed_sized("prepull/resumed:1", SIZE);
    stack.seed_sized("prepull/cancelled:1", 16 * MIB);
    let registry: SocketAddr = stack.registry.parse().expect("the registry's address");
    let proxy = ThrottleProxy::start(registry, 4 * MIB).await;
    stack.route_through(proxy.addr.port());
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("cri-imaged.sock");
    let mut daemon = DaemonProcess::start(&socket, &stack.containerd_socket, &[]).await;
    let image = proxy.image("prepull/resumed:1");
    let id = client.ok(&socket, SUBMIT, json!({ "images": [image] }))["pre_pulls"][0]["id"]
        .as_str()
        .expect("an id")
        .to_owned();
    support::eventually("half of the image fetched", Duration::from_secs(30), || proxy.bytes_forwarded() >= SIZE / 2)
        .await;
    daemon.kill_hard();
    let first = proxy.bytes_forwarded();

    let (port, listen) = process::metrics_listen();
    let daemon = DaemonProcess::start(&socket, &stack.containerd_socket, &["--metrics-listen", &listen]).await;
    let resumed = state(client, &socket, &id);
    assert_eq!(resumed["resumed"], json!(1), "{resumed}");
    // The resumed pull's progress is seen (its manifest named by its lease), from where it was.
    support::eventually("the resumed pull's progress", Duration::from_secs(30), || {
        let progress = state(client, &socket, &id)["progress"].clone();
        progress["bytes_done"].as_str().is_some_and(|done| done.parse::<u64>().is_ok_and(|done| done >= SIZE / 2))
    })
    .await;
    until_state(client, &socket, &id, "done", Duration::from_secs(60)).await;
    let second = proxy.bytes_forwarded() - first;
    assert!(second <= SIZE * 6 / 10, "fetched again: {second} of {SIZE} bytes (first {first})");
    let kept = process::metric(port, "cri_imaged_pre_pull_resumed_bytes_total");
    assert!(kept >= (SIZE / 3) as f64, "counted as kept: {kept}");
    eprintln!("resumed pre-pull: {first} bytes before the kill, {second} after, of {SIZE}; {kept} counted kept");

    // The link held still but for a moment once the pull is under way, so that the cancel finds
    // it downloading however slow the clients are on a loaded machine.
    let cancelled = proxy.image("prepull/cancelled:1");
    proxy.stall();
    let id = client.ok(&socket, SUBMIT, json!({ "images": [cancelled] }))["pre_pulls"][0]["id"]
        .as_str()
        .expect("an id")
        .to_owned();
    until_state(client, &socket, &id, "pulling", Duration::from_secs(10)).await;
    let before = proxy.bytes_forwarded();
    proxy.resume();
    support::eventually("some of it fetched", Duration::from_secs(30), || proxy.bytes_forwarded() > before + MIB / 4)
        .await;
    proxy.stall();
    let answer = client.ok(&socket, CANCEL, json!({ "id": id }));
    assert_eq!(answer["state"], json!("cancelled"));
    let forwarded = proxy.bytes_forwarded();
    proxy.resume();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(proxy.bytes_forwarded() - forwarded < MIB, "the pull stopped with the cancel");
    assert!(!stack.present(&cancelled), "nothing of the cancelled image was kept");
    drop(daemon);
}

#[tokio::test]
async fn a_declared_pre_pull_is_pulled_at_start_and_again_when_removed_and_a_pinned_one_survives_image_gc() {
    let Some(stack) = LocalStack::start() else { return };
    let Some(client) = first_client() else { return };
    stack.seed("prepull/declared:1", "declared");
    stack.seed("prepull/pinned:1", "pinned");
    let (declared, pinned) = (stack.image("prepull/declared:1"), stack.image("prepull/pinned:1"));
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("cri-imaged.sock");
    // No hand-out window: what image GC keeps below, only the pin keeps.
    let flags = [
        "--pre-pull",
        &declared,
        "--pre-pull-recheck-period",
        "1s",
        "--minimum-image-ttl-duration",
        "0s",
        "--image-gc-hand-out-window",
        "0s",
    ];
    let daemon = DaemonProcess::start(&socket, &stack.containerd_socket, &flags).await;
    support::eventually("the declared image pulled", Duration::from_secs(30), || stack.present(&declared)).await;
    let listed = client.ok(&socket, LIST, json!({}));
    assert_eq!(listed["pre_pulls"][0]["declared"], json!(true), "{listed}");
    let id = listed["pre_pulls"][0]["id"].as_str().expect("an id").to_owned();
    let (code, _) = match client.call(&socket, CANCEL, json!({ "id": id })) {
        Answer::Error { code, message } => (code, message),
        Answer::Ok(answer) => panic!("a declared pre-pull was cancelled: {answer}"),
    };
    assert_eq!(code, "FAILED_PRECONDITION");

    stack.remove_image(&declared);
    support::eventually("the declared image pulled again", Duration::from_secs(30), || stack.present(&declared)).await;

    let submitted = client.ok(&socket, SUBMIT, json!({ "images": [pinned], "pin_for": "3600s" }));
    let id = submitted["pre_pulls"][0]["id"].as_str().expect("an id").to_owned();
    let done = until_state(client, &socket, &id, "done", Duration::from_secs(30)).await;
    assert!(done["pinned_until"].is_string(), "{done}");
    let collected = client.ok(&socket, "imagemanager.v1.ImageManager/GarbageCollect", json!({ "delete_unused": true }));
    let removed: Vec<&str> = collected["images"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|image| image["removed"] == json!(true))
        .flat_map(|image| image["names"].as_array().into_iter().flatten().filter_map(Value::as_str))
        .collect();
    assert!(removed.iter().any(|name| name.contains("prepull/declared")), "unpinned images go: {collected}");
    assert!(!removed.iter().any(|name| name.contains("prepull/pinned")), "the pinned pre-pull was kept: {collected}");
    assert!(stack.present(&pinned));
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pre_pull_that_would_fill_the_image_filesystem_is_held_while_pods_pulls_go_the_collector_making_room_first() {
    // A 400 MiB image filesystem; a pulled image takes about twice its size (blob and layer).
    let Some(stack) = LocalStack::start_with(StackOptions::default().image_fs_mib(400)) else { return };
    let Some(client) = first_client() else { return };
    const FILLER: u64 = 16 * MIB;
    let usage = |stack: &LocalStack| {
        let (capacity, available) = stack.image_fs_usage();
        100 - available * 100 / capacity
    };
    // Unused images, pulled straight, until the disk is past the high threshold (85 %).
    let mut fillers = 0;
    while usage(&stack) < 88 {
        fillers += 1;
        let name = format!("prepull/filler-{fillers}:1");
        stack.seed_sized(&name, FILLER);
        stack.pull(&stack.image(&name));
        assert!(fillers < 20, "the disk does not fill: {}%", usage(&stack));
    }
    // Image GC counts an image's size once and frees about twice that: after the first pass the
    // disk is well under the low threshold, so the image held back is big.
    stack.seed_sized("prepull/big:1", 48 * MIB);
    stack.seed("prepull/small:1", "small");
    let registry: SocketAddr = stack.registry.parse().expect("the registry's address");
    let proxy = ThrottleProxy::start(registry, 4 * MIB).await;
    stack.route_through(proxy.addr.port());
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("cri-imaged.sock");
    let flags =
        ["--image-gc-high-threshold", "85", "--minimum-image-ttl-duration", "0s", "--pre-pull-recheck-period", "1h"];
    let daemon = DaemonProcess::start(&socket, &stack.containerd_socket, &flags).await;
    let last_pass = || client.ok(&socket, STATUS, json!({}))["last_gc_pass"].clone();
    // The first periodic pass, at start, takes the disk down to the low threshold (80 %).
    support::eventually("the first pass", Duration::from_secs(30), || last_pass().is_object()).await;
    let first_pass = last_pass();
    let collected = usage(&stack);
    assert!((61..=80).contains(&collected), "collected down to the low threshold: {collected}% ({first_pass})");

    // 2 × 48 MiB more would take the disk over the high threshold: the pre-pull is held.
    let big = proxy.image("prepull/big:1");
    let id = client.ok(&socket, SUBMIT, json!({ "images": [big] }))["pre_pulls"][0]["id"]
        .as_str()
        .expect("an id")
        .to_owned();
    let held = until_state(client, &socket, &id, "held", Duration::from_secs(30)).await;
    assert_eq!(held["reason"], json!("DiskPressure"), "{held}");
    let message = held["message"].as_str().expect("a message");
    assert!(message.starts_with("DiskPressure: pre-pull of") && message.contains("high threshold (85%)"), "{message}");

    // A pod's pull of the same image is never held.
    let pod = |image: &str, uid: &str| json!({ "image": image, "pull_policy": "IF_NOT_PRESENT", "pod": { "namespace": "default", "name": uid, "uid": uid } });
    let answer = client.ok(&socket, ENSURE, pod(&big, "uid-big"));
    assert_eq!(answer["pulled"], json!(true), "{answer}");
    assert!(usage(&stack) >= 85, "the pod's pull took the disk over the high threshold: {}%", usage(&stack));
    assert_eq!(last_pass(), first_pass, "no pass was needed before it");

    // Over the high threshold, the next pod's pull has the collector make room first.
    let answer = client.ok(&socket, ENSURE, pod(&proxy.image("prepull/small:1"), "uid-small"));
    assert_eq!(answer["pulled"], json!(true), "{answer}");
    let pass = last_pass();
    assert_ne!(pass, first_pass, "a pass before the pull");
    assert!(pass["images_removed"].as_u64().is_some_and(|removed| removed > 0), "{pass}");
    assert!(usage(&stack) < 85, "{}%", usage(&stack));
    drop(daemon);
}
