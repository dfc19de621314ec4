//! `PullImageResponse.image_ref` is the image's id, as the CRI requires since Kubernetes 1.36
//! (kubernetes#137217): the kubelet writes its pull records under the ref PullImage returns and
//! finds them by `Image.id` from ImageStatus and ListImages. On a real containerd, through the
//! cri-imaged binary, with a loopback registry: every way cri-imaged answers a CRI PullImage (a
//! fresh pull by tag and by digest, an image already present, a pull that joins an
//! EnsureImageExists or a pre-pull of the same image under way) gives the id ImageStatus and
//! ListImages give through cri-imaged, and the ref containerd itself gives to the same PullImage.
//! The CRI calls are made by Python grpcio and Node.js grpc-js, and some by grpcurl.

mod support;

use std::{net::SocketAddr, path::Path, time::Duration};

use cri_imaged::api::{GetStatusRequest, PullPolicy, image_manager_client::ImageManagerClient};
use serde_json::{Value, json};
use support::{
    call,
    clients::{Answer, Call, Client},
    ensure,
    process::{DaemonProcess, grpcurl, require_tool},
    stack::LocalStack,
    throttle::ThrottleProxy,
    unix_channel,
};

const PROTO_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/proto");
const MIB: u64 = 1 << 20;

fn image_call(method: &str, request: Value) -> Call {
    Call::new(&format!("runtime.v1.ImageService/{method}"), request)
}

fn pull(image: &str) -> Call {
    image_call("PullImage", json!({ "image": { "image": image } }))
}

fn status(image: &str) -> Call {
    image_call("ImageStatus", json!({ "image": { "image": image } }))
}

fn list() -> Call {
    image_call("ListImages", json!({}))
}

fn remove(image: &str) -> Call {
    image_call("RemoveImage", json!({ "image": { "image": image } }))
}

/// The response of an answer that must be one.
fn ok<'a>(what: &str, answer: &'a Answer) -> &'a Value {
    match answer {
        Answer::Ok(response) => response,
        Answer::Error { code, message } => panic!("{what}: {code}: {message}"),
    }
}

/// A PullImage response's `image_ref`, which must look like containerd's image id.
fn image_ref(what: &str, answer: &Answer) -> String {
    let response = ok(what, answer);
    let found = response["image_ref"].as_str().unwrap_or_default().to_owned();
    assert!(found.starts_with("sha256:") && found.len() == 71, "{what}: an image id: {response}");
    found
}

/// An ImageStatus response's `image.id`.
fn status_id(what: &str, answer: &Answer) -> String {
    let response = ok(what, answer);
    response["image"]["id"].as_str().unwrap_or_else(|| panic!("{what}: the image is present: {response}")).to_owned()
}

/// The `id` of the one image ListImages names `image` (by a tag or by a digest).
fn listed_id(what: &str, answer: &Answer, image: &str) -> String {
    let response = ok(what, answer);
    let names = |entry: &Value, field: &str| {
        entry[field].as_array().into_iter().flatten().any(|name| name.as_str() == Some(image))
    };
    let entries: Vec<&Value> = response["images"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|entry| names(entry, "repo_tags") || names(entry, "repo_digests"))
        .collect();
    assert_eq!(entries.len(), 1, "{what}: one image named {image}: {response}");
    entries[0]["id"].as_str().expect("an id").to_owned()
}

async fn run(client: Client, socket: &Path, calls: Vec<Call>) -> Vec<Answer> {
    let socket = socket.to_owned();
    tokio::task::spawn_blocking(move || client.run(&socket, &calls)).await.expect("client task")
}

/// Through cri-imaged, ImageStatus and ListImages give `expected` as the id of `image`, and
/// containerd answers the same PullImage with it too.
async fn ids_agree(client: Client, daemon: &Path, containerd: &Path, image: &str, expected: &str) {
    let through = run(client, daemon, vec![status(image), list()]).await;
    assert_eq!(status_id(&format!("{client:?} ImageStatus {image}"), &through[0]), expected);
    assert_eq!(listed_id(&format!("{client:?} ListImages"), &through[1], image), expected);
    let direct = run(client, containerd, vec![pull(image)]).await;
    assert_eq!(image_ref(&format!("{client:?} PullImage {image} straight to containerd"), &direct[0]), expected);
}

// Multi-threaded: the clients block a thread while the daemon's answers are awaited on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_pull_by_tag_or_digest_and_a_pull_of_a_present_image_answer_the_image_id_as_containerd_does() {
    let Some(stack) = LocalStack::start() else { return };
    stack.seed("ref/tagged:v1", "tagged");
    let digest = stack.seed("ref/pinned:v1", "pinned");
    let (tagged, by_digest) = (stack.image("ref/tagged:v1"), format!("{}@{digest}", stack.image("ref/pinned")));
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &[]).await;
    let containerd = stack.containerd_socket.clone();

    for client in Client::available() {
        for image in [&tagged, &by_digest] {
            let what = |step: &str| format!("{client:?} {image}: {step}");
            // containerd's own answer to a fresh pull, learnt first; the image is removed again.
            let direct = run(client, &containerd, vec![status(image), pull(image), status(image), remove(image)]).await;
            assert_eq!(direct[0], Answer::Ok(json!({})), "{}", what("absent before containerd's pull"));
            let containerds = image_ref(&what("straight to containerd"), &direct[1]);
            assert_eq!(status_id(&what("containerd's ImageStatus"), &direct[2]), containerds);

            let pulls_before = stack.runtime_pulls(image);
            let calls = vec![status(image), pull(image), status(image), list(), pull(image), status(image), list()];
            let through = run(client, &daemon.socket, calls).await;
            assert_eq!(through[0], Answer::Ok(json!({})), "{}", what("absent before the pull through cri-imaged"));
            let fresh = image_ref(&what("a fresh pull through cri-imaged"), &through[1]);
            assert_eq!(fresh, containerds, "{}", what("the fresh pull's ref is containerd's"));
            assert_eq!(status_id(&what("ImageStatus after the fresh pull"), &through[2]), fresh);
            assert_eq!(listed_id(&what("ListImages after the fresh pull"), &through[3], image), fresh);
            let again = image_ref(&what("the present image pulled again"), &through[4]);
            assert_eq!(again, fresh, "{}", what("the present image's ref"));
            assert_eq!(status_id(&what("ImageStatus after the second pull"), &through[5]), again);
            assert_eq!(listed_id(&what("ListImages after the second pull"), &through[6], image), again);
            // Not answered from anywhere but containerd: both pulls reached it.
            assert_eq!(stack.runtime_pulls(image), pulls_before + 2, "{}", what("each pull reached containerd"));
            ids_agree(client, &daemon.socket, &containerd, image, &fresh).await;
            // Absent again, for the next client's fresh pull.
            ok(&what("removed"), &run(client, &daemon.socket, vec![remove(image)]).await[0]);
            println!("{client:?} {image}: {fresh} fresh, present, straight to containerd, listed");
        }
    }

    // grpcurl: a fresh pull by tag through cri-imaged, the id it reads back, containerd's ref.
    let Some(grpcurl_bin) = require_tool("grpcurl") else { return };
    let grpcurl_call = |socket: &Path, method: &str, request: Value| {
        let (bin, socket) = (grpcurl_bin.clone(), socket.to_owned());
        let method = format!("runtime.v1.ImageService/{method}");
        let descriptors = if socket == containerd {
            vec!["-import-path", PROTO_DIR, "-proto", "runtime/v1/api.proto"]
        } else {
            vec![]
        };
        tokio::task::spawn_blocking(move || {
            let request = request.to_string();
            let flags: Vec<&str> = descriptors.into_iter().chain(["-d", request.as_str()]).collect();
            let (succeeded, stdout, stderr) = grpcurl(&bin, &socket, &flags, &[&method]);
            assert!(succeeded, "grpcurl {method}: {stderr}");
            serde_json::from_str::<Value>(&stdout).unwrap_or_else(|error| panic!("grpcurl {method}: {error}: {stdout}"))
        })
    };
    let spec = json!({ "image": { "image": tagged } });
    let absent = grpcurl_call(&daemon.socket, "ImageStatus", spec.clone()).await.expect("grpcurl");
    assert_eq!(absent, json!({}), "absent before grpcurl's pull");
    let pulled = grpcurl_call(&daemon.socket, "PullImage", spec.clone()).await.expect("grpcurl");
    let pulled = pulled["imageRef"].as_str().expect("an imageRef").to_owned();
    assert!(pulled.starts_with("sha256:"), "grpcurl: an image id: {pulled}");
    let found = grpcurl_call(&daemon.socket, "ImageStatus", spec.clone()).await.expect("grpcurl");
    assert_eq!(found["image"]["id"], json!(pulled), "grpcurl: ImageStatus through cri-imaged");
    let listed = grpcurl_call(&daemon.socket, "ListImages", json!({})).await.expect("grpcurl");
    let entry = listed["images"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|entry| entry["repoTags"].as_array().is_some_and(|tags| tags.contains(&json!(tagged))));
    assert_eq!(
        entry.map(|entry| &entry["id"]),
        Some(&json!(pulled)),
        "grpcurl: ListImages through cri-imaged: {listed}"
    );
    let direct = grpcurl_call(&containerd, "PullImage", spec).await.expect("grpcurl");
    assert_eq!(direct["imageRef"], json!(pulled), "grpcurl: containerd's ref");
    println!("grpcurl {tagged}: {pulled} fresh, listed, straight to containerd");
}

/// A node whose registry is behind a link the test can hold still, and the daemon on it.
struct SlowNode {
    stack: LocalStack,
    proxy: ThrottleProxy,
    daemon: DaemonProcess,
    _dir: tempfile::TempDir,
}

impl SlowNode {
    async fn start() -> Option<Self> {
        let stack = LocalStack::start()?;
        let registry: SocketAddr = stack.registry.parse().expect("the registry's address");
        let proxy = ThrottleProxy::start(registry, 2 * MIB).await;
        stack.route_through(proxy.addr.port());
        let dir = tempfile::tempdir().expect("tempdir");
        let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &[]).await;
        Some(Self { stack, proxy, daemon, _dir: dir })
    }

    /// `name` pushed (8 MiB: four seconds on this link), as pulled through the link.
    fn seed(&self, name: &str) -> String {
        self.stack.seed_sized(name, 8 * MIB);
        self.proxy.image(name)
    }

    /// Once the pull of `image` is downloading (a quarter MiB over the link since `before` bytes),
    /// holds the link still: the pull stays under way, past its registry's answer (so no registry
    /// timeout ends it), for as long as the test looks.
    async fn hold_once_downloading(&self, image: &str, before: u64) {
        let downloading = || self.proxy.bytes_forwarded() > before + MIB / 4;
        support::eventually("the pull downloading", Duration::from_secs(30), downloading).await;
        self.proxy.stall();
        self.until_callers(image, 1).await;
    }

    /// Waits until the pull of `image` under way has `callers` callers (GetStatus).
    async fn until_callers(&self, image: &str, callers: u32) {
        let mut client = ImageManagerClient::new(unix_channel(&self.daemon.socket));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let status = client.get_status(GetStatusRequest::default()).await.expect("GetStatus").into_inner();
            if status.pulls.iter().any(|pull| pull.image == image && pull.callers == callers) {
                return;
            }
            let log = self.daemon.log_text();
            assert!(tokio::time::Instant::now() < deadline, "{callers} callers of {image}: {status:?}\n{log}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A CRI PullImage of `image` by `client`, made once the pull under way is held; answered once
    /// it has joined that pull and the link runs again. Its ref, after one pull reached containerd.
    async fn join_with_cri_pull(&self, client: Client, image: &str) -> String {
        let pulls_before = self.stack.runtime_pulls(image);
        let (socket, call) = (self.daemon.socket.clone(), pull(image));
        let joining = tokio::task::spawn_blocking(move || client.run(&socket, &[call]));
        self.until_callers(image, 2).await;
        self.proxy.resume();
        let answer = joining.await.expect("the CRI pull's task");
        let joined = image_ref(&format!("{client:?} PullImage {image} joining"), &answer[0]);
        assert_eq!(self.stack.runtime_pulls(image), pulls_before, "{client:?}: no pull of its own reached containerd");
        joined
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cri_pull_that_joins_an_ensure_image_exists_pull_under_way_answers_the_image_id() {
    let Some(node) = SlowNode::start().await else { return };
    let containerd = node.stack.containerd_socket.clone();
    for (n, client) in Client::available().into_iter().enumerate() {
        let image = node.seed(&format!("ref/joined-{n}:v1"));
        let before = node.proxy.bytes_forwarded();
        let mut manager = ImageManagerClient::new(unix_channel(&node.daemon.socket));
        let request = ensure(&image, PullPolicy::IfNotPresent as i32);
        let ensured = tokio::spawn(async move { call(&mut manager, request).await });
        node.hold_once_downloading(&image, before).await;
        let joined = node.join_with_cri_pull(client, &image).await;
        let ensured = ensured.await.expect("the EnsureImageExists task").expect("EnsureImageExists");
        assert!(ensured.pulled, "{ensured:?}");
        assert_eq!(node.stack.runtime_pulls(&image), 1, "{client:?}: one pull reached containerd, shared");
        assert_eq!(joined, ensured.image_ref, "{client:?}: the CRI pull's ref is the shared pull's");
        ids_agree(client, &node.daemon.socket, &containerd, &image, &joined).await;
        println!("{client:?} {image}: {joined} joining EnsureImageExists");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cri_pull_that_joins_a_pre_pull_under_way_answers_the_image_id() {
    let Some(node) = SlowNode::start().await else { return };
    let containerd = node.stack.containerd_socket.clone();
    let socket = node.daemon.socket.clone();
    for (n, client) in Client::available().into_iter().enumerate() {
        let image = node.seed(&format!("ref/pre-pulled-{n}:v1"));
        let before = node.proxy.bytes_forwarded();
        let submit = Call::new("imagemanager.v1.ImageManager/SubmitPrePull", json!({ "images": [image] }));
        let submitted = run(client, &socket, vec![submit]).await;
        let id = ok("SubmitPrePull", &submitted[0])["pre_pulls"][0]["id"].as_str().expect("an id").to_owned();
        node.hold_once_downloading(&image, before).await;
        let joined = node.join_with_cri_pull(client, &image).await;
        let get = Call::new("imagemanager.v1.ImageManager/GetPrePull", json!({ "id": id }));
        let mut pre_pull = Value::Null;
        for _ in 0..100 {
            pre_pull = ok("GetPrePull", &run(client, &socket, vec![get.clone()]).await[0]).clone();
            if pre_pull["state"] == "done" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(pre_pull["state"], json!("done"), "{client:?}: {pre_pull}");
        assert_eq!(node.stack.runtime_pulls(&image), 1, "{client:?}: one pull reached containerd, shared");
        assert_eq!(pre_pull["image_ref"], json!(joined), "{client:?}: the CRI pull's ref is the pre-pull's");
        ids_agree(client, &socket, &containerd, &image, &joined).await;
        println!("{client:?} {image}: {joined} joining a pre-pull");
    }
}
