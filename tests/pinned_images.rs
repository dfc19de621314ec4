//! The images we pin reported pinned: a kubelet from 1.28 keeps through its image GC only what
//! the image service reports `pinned`, and containerd before 2.0 reports nothing pinned, so such a
//! kubelet deletes the pause image on containerd 1.6 unless the answers it reads through us say
//! otherwise. The same calls straight to containerd and through the daemon, with grpcio and
//! grpc-js: the answers differ only in `pinned` of the pinned images.

mod support;

use std::{path::Path, time::Duration};

use serde_json::{Value, json};
use support::{clients::Client, process::DaemonProcess, stack::LocalStack};

const LIST_IMAGES: &str = "runtime.v1.ImageService/ListImages";
const IMAGE_STATUS: &str = "runtime.v1.ImageService/ImageStatus";

/// `answer`'s images (ListImages) or image (ImageStatus), each marked pinned when one of its
/// tags is in `pinned`.
fn with_pinned(mut answer: Value, pinned: &[&str]) -> Value {
    let mark = |image: &mut Value| {
        let tags = image["repo_tags"].as_array().cloned().unwrap_or_default();
        if tags.iter().any(|tag| pinned.contains(&tag.as_str().unwrap_or_default())) {
            image["pinned"] = json!(true);
        }
    };
    match answer.get_mut("images").and_then(Value::as_array_mut) {
        Some(images) => images.iter_mut().for_each(mark),
        None => mark(&mut answer["image"]),
    }
    answer
}

/// A ListImages answer in the order of its ids: containerd lists in no order of its own.
fn sorted(mut answer: Value) -> Value {
    if let Some(images) = answer.get_mut("images").and_then(Value::as_array_mut) {
        images.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    }
    answer
}

fn is_pinned(answer: &Value, tag: &str) -> bool {
    let images = answer["images"].as_array().cloned().unwrap_or_else(|| vec![answer["image"].clone()]);
    images.iter().any(|image| {
        image["repo_tags"].as_array().is_some_and(|tags| tags.contains(&json!(tag))) && image["pinned"] == json!(true)
    })
}

#[tokio::test]
async fn the_sandbox_image_and_pinned_images_are_reported_pinned_and_nothing_else_differs() {
    let Some(stack) = LocalStack::start() else { return };
    let sandbox = stack.sandbox_image();
    let (kept, plain) = (stack.image("pinned/kept:1"), stack.image("pinned/plain:1"));
    stack.seed("pinned/kept:1", "kept");
    stack.seed("pinned/plain:1", "plain");
    for image in [&sandbox, &kept, &plain] {
        stack.pull(image);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon =
        DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &["--pinned-image", &kept])
            .await;
    let clients = Client::available();
    let list = |client: Client, socket: &Path| sorted(client.ok(socket, LIST_IMAGES, json!({})));
    // The sandbox image is learned from containerd's CRI config as the daemon starts (on 2.x
    // containerd pins it itself).
    let first = clients[0];
    support::eventually("the sandbox image reported pinned", Duration::from_secs(10), || {
        is_pinned(&list(first, &daemon.socket), &sandbox)
    })
    .await;

    for &client in &clients {
        let direct = list(client, &stack.containerd_socket);
        assert!(!is_pinned(&direct, &kept) && !is_pinned(&direct, &plain), "containerd pins neither: {direct}");
        // Asked twice: the second from memory.
        for _ in 0..2 {
            assert_eq!(list(client, &daemon.socket), with_pinned(direct.clone(), &[&sandbox, &kept]), "{client:?}");
        }
        for image in [&sandbox, &kept, &plain] {
            for verbose in [false, true] {
                let request = json!({ "image": { "image": image }, "verbose": verbose });
                let direct = client.ok(&stack.containerd_socket, IMAGE_STATUS, request.clone());
                let through = client.ok(&daemon.socket, IMAGE_STATUS, request);
                assert_eq!(through, with_pinned(direct, &[&sandbox, &kept]), "{client:?} {image} verbose {verbose}");
            }
        }
        assert!(!is_pinned(&client.ok(&daemon.socket, LIST_IMAGES, json!({})), &plain), "only what is pinned");
    }
    assert_eq!(clients.len(), 2, "grpcio and grpc-js both ran");
}
