//! A differential CRI image conformance suite, on a real containerd and a loopback registry: the
//! behaviours of critest's "Image Manager" specs and more, each made twice in one run by the same
//! client with the same calls — straight to containerd, then through cri-imaged — and the answers
//! compared field by field. The clients are ones we did not write: Python grpcio and Node.js
//! grpc-js (through the runners in `tests/clients/`) for every case, grpcurl for the key calls.
//!
//! What may differ, and is set aside by name before comparing ([`comparable`]):
//! - the order of ListImages' images: containerd lists from a Go map, in any order, even between
//!   two calls to itself; they are compared sorted by id;
//! - the message of a call that ends at its deadline or is cancelled: whichever timer fires first
//!   (the client's, containerd's, cri-imaged's) writes it, and grpc-js names its own timings
//!   ("Deadline exceeded after 1.002s"); its code is compared;
//! - the message of a pull from a registry that refused the connection: through cri-imaged it is
//!   containerd's with `RegistryUnavailable: ` before it, as cri-imaged names a network-level failure, so that the
//!   kubelet gives the pod its `RegistryUnavailable` reason; the code is containerd's (UNKNOWN).
//!   The prefix is taken off the answer through cri-imaged, and only there ([`as_containerd`]),
//!   and the suite checks it was there.
//!
//! ImageFsInfo is compared whole, its timestamp included, once containerd has measured a snapshot
//! (before that, it stamps each answer with the time it makes it), and asked again (both ways)
//! when a pair differs: containerd re-measures its snapshots every 10 s, and a pair may straddle
//! that.

mod support;

use std::{path::Path, time::Duration};

use serde_json::{Value, json};
use support::{
    clients::{Answer, Call, Client},
    process::{DaemonProcess, grpcurl, metric, metric_with_label, metrics_listen, require_tool},
    stack::LocalStack,
    throttle::ThrottleProxy,
};

const PROTO_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/proto");

fn image_call(method: &str, request: Value) -> Call {
    Call::new(&format!("runtime.v1.ImageService/{method}"), request)
}

fn pull(image: &str) -> Call {
    image_call("PullImage", json!({ "image": { "image": image } }))
}

fn status(image: &str, verbose: bool) -> Call {
    image_call("ImageStatus", json!({ "image": { "image": image }, "verbose": verbose }))
}

fn list(filter: Option<&str>) -> Call {
    match filter {
        Some(image) => image_call("ListImages", json!({ "filter": { "image": { "image": image } } })),
        None => image_call("ListImages", json!({})),
    }
}

fn remove(image: &str) -> Call {
    image_call("RemoveImage", json!({ "image": { "image": image } }))
}

/// A named group of calls; each starts and ends with its images absent, so that the two runs see
/// the same containerd at every step.
struct Case {
    name: &'static str,
    calls: Vec<Call>,
}

/// The images the cases pull, pushed to the stack's registry.
struct Images {
    tagged: String,
    tagged_id: String,
    /// `tagged` by its manifest digest: `REGISTRY/conformance/tagged@sha256:…`.
    by_digest: String,
    /// A repository pushed as `:latest`, named without a tag.
    untagged: String,
    missing: String,
    /// On a loopback port nothing listens on: the connection is refused.
    refused: String,
    numeric_user: String,
    named_user: String,
    /// `User` with a group: `1003:1004` and `www-data:1004`.
    numeric_user_group: String,
    named_user_group: String,
    /// One image under three tags.
    many_tags: [String; 3],
    other: String,
}

impl Images {
    fn seed(stack: &LocalStack) -> Self {
        let name = |repository: &str| stack.image(&format!("conformance/{repository}"));
        let digest = stack.seed("conformance/tagged:v1", "tagged");
        stack.seed("conformance/untagged:latest", "untagged");
        stack.seed_with_user("conformance/numeric-user:v1", "numeric user", "1002");
        stack.seed_with_user("conformance/named-user:v1", "named user", "www-data");
        stack.seed_with_user("conformance/numeric-user-group:v1", "numeric user and group", "1003:1004");
        stack.seed_with_user("conformance/named-user-group:v1", "named user and group", "www-data:1004");
        for tag in ["a", "b", "c"] {
            stack.seed(&format!("conformance/many-tags:{tag}"), "one image, three tags");
        }
        stack.seed("conformance/other:v1", "another image");
        let tagged = format!("{}:v1", name("tagged"));
        // Learnt once, straight from containerd, then removed again.
        let tagged_id = stack.pull(&tagged);
        stack.remove_image(&tagged);
        Self {
            tagged_id,
            by_digest: format!("{}@{digest}", name("tagged")),
            tagged,
            untagged: name("untagged"),
            missing: format!("{}:v1", name("never-pushed")),
            refused: "127.0.0.1:1/conformance/refused:v1".to_owned(),
            numeric_user: format!("{}:v1", name("numeric-user")),
            named_user: format!("{}:v1", name("named-user")),
            numeric_user_group: format!("{}:v1", name("numeric-user-group")),
            named_user_group: format!("{}:v1", name("named-user-group")),
            many_tags: ["a", "b", "c"].map(|tag| format!("{}:{tag}", name("many-tags"))),
            other: format!("{}:v1", name("other")),
        }
    }

    fn cases(&self) -> Vec<Case> {
        let Self { tagged, tagged_id, by_digest, untagged, missing, refused, many_tags, other, .. } = self;
        let users = [&self.numeric_user, &self.named_user, &self.numeric_user_group, &self.named_user_group];
        let latest = format!("{untagged}:latest");
        vec![
            Case {
                name: "pull by tag, status plain and verbose, list filtered by it, remove by tag",
                calls: vec![
                    pull(tagged),
                    status(tagged, false),
                    status(tagged, true),
                    list(Some(tagged)),
                    remove(tagged),
                    status(tagged, false),
                ],
            },
            Case {
                name: "pull by digest, status by digest, remove by digest",
                calls: vec![
                    pull(by_digest),
                    status(by_digest, false),
                    status(tagged, false),
                    list(Some(by_digest)),
                    remove(by_digest),
                    status(by_digest, false),
                ],
            },
            Case {
                name: "pull without a tag (latest)",
                calls: vec![
                    pull(untagged),
                    status(untagged, false),
                    status(&latest, false),
                    remove(untagged),
                    status(&latest, false),
                ],
            },
            Case {
                name: "pull of an image the registry does not have, and of names that are not references",
                calls: vec![
                    pull(missing),
                    status(missing, false),
                    status(missing, true),
                    pull("Not A/Valid:Name"),
                    pull(""),
                ],
            },
            Case { name: REFUSED_CASE, calls: vec![pull(refused), status(refused, false)] },
            Case {
                name: "list with and without a filter, status by id, remove by id",
                calls: vec![
                    pull(tagged),
                    pull(other),
                    list(None),
                    list(Some(other)),
                    list(Some(tagged_id)),
                    list(Some(missing)),
                    status(tagged_id, false),
                    remove(tagged_id),
                    status(tagged, false),
                    remove(other),
                    remove(other),
                    list(Some(other)),
                ],
            },
            Case {
                name: "remove by digest after a pull by tag",
                calls: vec![pull(tagged), remove(by_digest), status(tagged, false), status(by_digest, false)],
            },
            Case {
                name: "images with a numeric user and with a user name, each with and without a group",
                calls: users
                    .iter()
                    .flat_map(|image| [pull(image), status(image, false), status(image, true), remove(image)])
                    .collect(),
            },
            Case {
                name: "many tags on one image",
                calls: vec![
                    pull(&many_tags[0]),
                    pull(&many_tags[1]),
                    pull(&many_tags[2]),
                    status(&many_tags[1], false),
                    list(Some(&many_tags[2])),
                    remove(&many_tags[0]),
                    status(&many_tags[1], false),
                    remove(&many_tags[1]),
                    remove(&many_tags[2]),
                    status(&many_tags[2], false),
                ],
            },
        ]
    }
}

/// The case of a pull from a registry that refuses connections.
const REFUSED_CASE: &str = "pull from a registry that refuses connections";

/// What cri-imaged names `RegistryUnavailable` (as CRI-O does), before containerd's message.
const REGISTRY_UNAVAILABLE: &str = "RegistryUnavailable: ";

/// An answer through cri-imaged as containerd gives it: a pull's refused connection without the
/// name cri-imaged puts before containerd's message (see the module docs), the code kept.
fn as_containerd(call: &Call, through: &Answer) -> Answer {
    match through {
        Answer::Error { code, message } if call.method.ends_with("/PullImage") && code == "UNKNOWN" => {
            let bare = message.strip_prefix(REGISTRY_UNAVAILABLE).filter(|bare| bare.contains("connection refused"));
            Answer::Error { code: code.clone(), message: bare.unwrap_or(message).to_owned() }
        }
        answer => answer.clone(),
    }
}

/// An answer with what may differ set aside (see the module docs).
fn comparable(call: &Call, answer: &Answer) -> Answer {
    match answer {
        Answer::Ok(response) if call.method.ends_with("/ListImages") => {
            let mut response = response.clone();
            if let Some(images) = response.get_mut("images").and_then(Value::as_array_mut) {
                images.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
            }
            Answer::Ok(response)
        }
        Answer::Error { code, .. } if call.timeout_ms.is_some() || call.cancel_after_ms.is_some() => {
            Answer::Error { code: code.clone(), message: "(the client's own)".into() }
        }
        answer => answer.clone(),
    }
}

/// Every call whose answers differ, described; empty when the two runs agree.
fn differences(labels: &[String], calls: &[Call], direct: &[Answer], through: &[Answer]) -> Vec<String> {
    let mut found = Vec::new();
    for (((label, call), direct), through) in labels.iter().zip(calls).zip(direct).zip(through) {
        let (direct, through) = (comparable(call, direct), comparable(call, &as_containerd(call, through)));
        if direct != through {
            found.push(format!("{label}:\n  direct:  {direct:?}\n  through: {through:?}"));
        }
    }
    found
}

async fn run_blocking(client: Client, socket: &Path, calls: Vec<Call>) -> Vec<Answer> {
    let socket = socket.to_owned();
    tokio::task::spawn_blocking(move || client.run(&socket, &calls)).await.expect("client task")
}

/// The cases' calls, each ImageStatus and ListImages asked twice in a row (through cri-imaged,
/// the second may be remembered), with their labels.
fn suite(images: &Images) -> (Vec<String>, Vec<Call>) {
    let (mut labels, mut calls) = (Vec::new(), Vec::new());
    for case in images.cases() {
        for (step, call) in case.calls.iter().enumerate() {
            let label = format!("{} (step {}: {} {})", case.name, step + 1, call.method, call.request);
            let read = call.method.ends_with("/ImageStatus") || call.method.ends_with("/ListImages");
            calls.push(call.clone());
            if read {
                labels.push(format!("{label}, asked first"));
                calls.push(call.clone());
            }
            labels.push(label);
        }
    }
    (labels, calls)
}

/// The suite by grpcio and grpc-js, straight to containerd and through a cri-imaged started with
/// `flags`; returns the CRI answers cri-imaged gave from memory.
async fn differential(flags: &[&str]) -> Option<f64> {
    let stack = LocalStack::start()?;
    let clients = Client::available();
    let images = Images::seed(&stack);
    let dir = tempfile::tempdir().expect("tempdir");
    let (port, listen) = metrics_listen();
    let mut all = vec!["--metrics-listen", listen.as_str()];
    all.extend_from_slice(flags);
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &all).await;
    let watching = || metric(port, "cri_imaged_presence_cache_watching") == 1.0;
    support::eventually("cri-imaged watches containerd's image events", Duration::from_secs(10), watching).await;

    let (labels, calls) = suite(&images);
    assert!(calls.len() >= 70, "the suite makes {} calls", calls.len());
    for &client in &clients {
        let direct = run_blocking(client, &stack.containerd_socket, calls.clone()).await;
        let through = run_blocking(client, &daemon.socket, calls.clone()).await;
        let found = differences(&labels, &calls, &direct, &through);
        assert!(
            found.is_empty(),
            "{client:?} {flags:?}: {} differences:\n{}\n{}",
            found.len(),
            found.join("\n"),
            daemon.log_text()
        );
        // Not vacuous: the cases did pull, fail and find what they should.
        let codes: Vec<&str> = direct.iter().map(Answer::code).collect();
        assert_eq!(codes.iter().filter(|code| **code == "OK").count(), calls.len() - 4, "{client:?}: {codes:?}");
        let refused = labels.iter().position(|label| label.starts_with(REFUSED_CASE)).expect("the refused pull");
        let named = match &through[refused] {
            Answer::Error { code, message } => code == "UNKNOWN" && message.starts_with(REGISTRY_UNAVAILABLE),
            Answer::Ok(_) => false,
        };
        assert!(named, "{client:?}: {:?}, straight: {:?}", through[refused], direct[refused]);
        for (step, field, value) in
            [(2, "uid", "1002"), (6, "username", "www-data"), (10, "uid", "1003"), (14, "username", "www-data")]
        {
            let user = answer_of(&labels, &direct, &format!("with and without a group (step {step}:"));
            let found = match field {
                "uid" => &user["image"]["uid"]["value"],
                _ => &user["image"]["username"],
            };
            assert_eq!(found, value, "{user}");
        }
        let tags = answer_of(&labels, &direct, "many tags on one image (step 4");
        assert_eq!(tags["image"]["repo_tags"].as_array().map(Vec::len), Some(3), "{tags}");
        println!(
            "{client:?} {flags:?}: {} calls, the same answers straight to containerd and through cri-imaged",
            calls.len()
        );
    }
    assert_eq!(clients.len(), 2, "grpcio and grpc-js both ran");
    let from_memory = ["ImageStatus", "ListImages"]
        .map(|call| metric_with_label(port, "cri_imaged_presence_cache_hits_total", &format!(r#"call="{call}""#)));
    Some(from_memory.iter().sum())
}

#[tokio::test]
async fn every_image_call_answers_through_cri_imaged_as_containerd_answers_it_with_grpcio_and_grpc_js() {
    let Some(remembered) = differential(&[]).await else { return };
    println!("{remembered} ImageStatus and ListImages answers from memory");
    assert!(remembered >= 20.0, "the second of each pair was mostly answered from memory: {remembered} answers");
}

#[tokio::test]
async fn in_strict_mode_every_image_call_answers_as_containerd_answers_it_and_none_from_memory() {
    let Some(remembered) = differential(&["--presence-cache-max-staleness", "0s"]).await else { return };
    assert_eq!(remembered, 0.0, "strict: every ImageStatus and ListImages asked containerd");
}

/// The response of the call whose label starts with the case name and step given.
fn answer_of<'a>(labels: &[String], answers: &'a [Answer], label: &str) -> &'a Value {
    let index = labels.iter().position(|l| l.contains(label)).unwrap_or_else(|| panic!("no call {label:?}"));
    match &answers[index] {
        Answer::Ok(response) => response,
        other => panic!("{label}: {other:?}"),
    }
}

#[tokio::test]
async fn image_fs_info_through_cri_imaged_is_containerds_with_grpcio_and_grpc_js() {
    let Some(stack) = LocalStack::start() else { return };
    stack.seed_sized("conformance/used:v1", 1 << 20);
    stack.pull(&stack.image("conformance/used:v1"));
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &[]).await;
    let calls = vec![image_call("ImageFsInfo", json!({}))];
    // containerd measures its snapshots every 10 s: wait for the pulled image to count.
    support::eventually("containerd counts the pulled image's snapshot", Duration::from_secs(15), || {
        stack.image_fs_info().used_bytes > 0
    })
    .await;
    for client in Client::available() {
        let mut pairs = Vec::new();
        for _ in 0..5 {
            let direct = run_blocking(client, &stack.containerd_socket, calls.clone()).await.remove(0);
            let through = run_blocking(client, &daemon.socket, calls.clone()).await.remove(0);
            let agreed = direct == through;
            pairs.push((direct, through));
            if agreed {
                break;
            }
        }
        let (direct, through) = pairs.last().expect("asked");
        assert_eq!(direct, through, "{client:?}: five pairs differed: {pairs:?}");
        let Answer::Ok(direct) = direct else { panic!("{client:?}: {direct:?}") };
        let filesystem = &direct["image_filesystems"][0];
        let mountpoint = filesystem["fs_id"]["mountpoint"].as_str().unwrap_or_default();
        assert!(mountpoint.starts_with(&stack.containerd_root.to_string_lossy().into_owned()), "{direct}");
        assert!(filesystem["used_bytes"]["value"].as_str().is_some(), "the pulled image is counted: {direct}");
    }
}

/// The pull of an image large enough to take seconds behind a throttled link, given up by its
/// only caller: containerd cancels it and no image is left; through cri-imaged, the same.
#[tokio::test]
async fn a_pull_its_only_caller_gives_up_leaves_no_image_behind_both_ways() {
    const IMAGE_BYTES: u64 = 8 << 20;
    const BYTES_PER_SECOND: u64 = 2 << 20;
    let Some(stack) = LocalStack::start() else { return };
    stack.seed_sized("conformance/big:v1", IMAGE_BYTES);
    let registry = stack.registry.parse().expect("the registry's address");
    let proxy = ThrottleProxy::start(registry, BYTES_PER_SECOND).await;
    stack.route_through(proxy.addr.port());
    let image = proxy.image("conformance/big:v1");
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &[]).await;

    for client in Client::available() {
        for (how, give_up) in
            [("its deadline passes", pull(&image).timeout_ms(1500)), ("it cancels", pull(&image).cancel_after_ms(1500))]
        {
            let mut answers = Vec::new();
            for socket in [&stack.containerd_socket, &daemon.socket] {
                let before = proxy.bytes_forwarded();
                let answer = run_blocking(client, socket, vec![give_up.clone()]).await.remove(0);
                // Stopped fetching: nothing crosses the link for a second (at 2 MiB/s, a pull
                // going on would send 2 MiB).
                let mut forwarded = proxy.bytes_forwarded();
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    let now = proxy.bytes_forwarded();
                    if now == forwarded || now - before >= IMAGE_BYTES {
                        break;
                    }
                    forwarded = now;
                }
                let forwarded = proxy.bytes_forwarded() - before;
                let after = run_blocking(client, &stack.containerd_socket, vec![status(&image, false)]).await.remove(0);
                assert!(forwarded > 0, "{client:?}, {how}: the pull had begun");
                assert!(forwarded < IMAGE_BYTES, "{client:?}, {how}: {forwarded} bytes: the pull went on");
                answers.push((deadline_race_settled(how, comparable(&give_up, &answer)), after));
            }
            let expected_code = if how == "it cancels" { "CANCELLED" } else { DEADLINE_ENDED };
            assert_eq!(answers[0].0.code(), expected_code, "{client:?}, {how}: {answers:?}");
            assert_eq!(answers[0].1, Answer::Ok(json!({})), "{client:?}, {how}: containerd left no image");
            assert_eq!(
                answers[0],
                answers[1],
                "{client:?}, {how}: direct, then through cri-imaged\n{}",
                daemon.log_text()
            );
        }
    }
}

/// A deadline is timed twice, by the client and by the server from the `grpc-timeout` header:
/// whichever fires first names the end, DEADLINE_EXCEEDED (the client's timer) or CANCELLED
/// (the server's, containerd's own answer). Under load either wins, straight to containerd as
/// through us, so the two are one outcome here; any other code is kept as it came.
const DEADLINE_ENDED: &str = "DEADLINE_EXCEEDED or CANCELLED";

fn deadline_race_settled(how: &str, answer: Answer) -> Answer {
    match answer {
        Answer::Error { code, message }
            if how == "its deadline passes" && (code == "DEADLINE_EXCEEDED" || code == "CANCELLED") =>
        {
            Answer::Error { code: DEADLINE_ENDED.into(), message }
        }
        answer => answer,
    }
}

/// grpcurl with its default flags: through cri-imaged it learns the API by reflection, straight
/// to containerd (which serves no reflection) from the same proto files; the key calls print
/// the same both ways.
#[tokio::test]
async fn grpcurl_makes_the_key_image_calls_through_cri_imaged_as_straight_to_containerd() {
    let Some(grpcurl_bin) = require_tool("grpcurl") else { return };
    let Some(stack) = LocalStack::start() else { return };
    let images = Images::seed(&stack);
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &[]).await;
    let spec = |image: &str| json!({ "image": { "image": image } }).to_string();
    let verbose = json!({ "image": { "image": images.tagged }, "verbose": true }).to_string();
    let filter = json!({ "filter": { "image": { "image": images.tagged } } }).to_string();
    let calls: Vec<(&str, String)> = vec![
        ("PullImage", spec(&images.tagged)),
        ("ImageStatus", verbose),
        ("ListImages", filter),
        ("RemoveImage", spec(&images.tagged)),
        ("ImageStatus", spec(&images.tagged)),
        ("PullImage", spec(&images.missing)),
    ];
    let mut runs = Vec::new();
    for (socket, descriptors) in [
        (&stack.containerd_socket, vec!["-import-path", PROTO_DIR, "-proto", "runtime/v1/api.proto"]),
        (&daemon.socket, vec![]),
    ] {
        let mut printed = Vec::new();
        for (method, request) in &calls {
            let (bin, socket, descriptors) = (grpcurl_bin.clone(), socket.clone(), descriptors.clone());
            let (method, request) = (format!("runtime.v1.ImageService/{method}"), request.clone());
            let run = tokio::task::spawn_blocking(move || {
                let flags: Vec<&str> = descriptors.iter().copied().chain(["-d", request.as_str()]).collect();
                grpcurl(&bin, &socket, &flags, &[&method])
            });
            printed.push(run.await.expect("grpcurl ran"));
        }
        runs.push(printed);
    }
    for ((method, request), (direct, through)) in calls.iter().zip(runs[0].iter().zip(&runs[1])) {
        assert_eq!(direct, through, "grpcurl {method} {request}: direct, then through cri-imaged");
    }
    let (ok, pulled, _) = &runs[0][0];
    assert!(*ok && pulled.contains(&format!(r#""imageRef": "{}""#, images.tagged_id)), "{pulled}");
    let (ok, _, missing) = &runs[0][5];
    assert!(!*ok && missing.contains("not found"), "{missing}");
}
