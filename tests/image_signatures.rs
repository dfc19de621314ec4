//! Image signatures at the node (issue 49), on a real containerd and a loopback registry, through
//! the cri-imaged binary, with cosign as the oracle: images are signed by cosign itself (keys made
//! by the test), and for every case cri-imaged's decision is cosign's (`cosign verify` on the same
//! key and image). A namespace whose policy requires a signature gets an unsigned, wrongly signed,
//! tampered or mis-bound image by no way in (EnsureImageExists, CRI PullImage), with the kubelet's
//! reason; a signed image is pulled and then answered from what was verified; a herd of pods on a
//! signed absent image reads its signatures once; a signature of 100 MiB is refused unread; a
//! pre-pull of an unsigned image fails with the policy's reason.

mod support;

use std::{net::SocketAddr, path::Path};

use cri_imaged::api::image_manager_client::ImageManagerClient;
use serde_json::{Value, json};
use support::{
    call,
    clients::{Answer, Call, Client},
    cosign::{cosign, cosign_accepts, key_pair, sign},
    process::{DaemonProcess, metric, metric_with_label, metrics_listen},
    registry_push::{fetch, push_raw, sha256_digest},
    stack::LocalStack,
    unix_channel,
};

const IF_NOT_PRESENT: i32 = cri_imaged::api::PullPolicy::IfNotPresent as i32;

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

/// The signature manifest cosign wrote for `digest` in `repository`, and its first payload.
fn signature_of(registry: SocketAddr, repository: &str, digest: &str) -> (Value, Vec<u8>) {
    let tag = format!("sha256-{}.sig", digest.trim_start_matches("sha256:"));
    let (status, body) = fetch(registry, &format!("/v2/{repository}/manifests/{tag}"), OCI_MANIFEST).expect("GET");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let manifest: Value = serde_json::from_slice(&body).expect("a manifest");
    let layer = manifest["layers"][0]["digest"].as_str().expect("a layer").to_owned();
    let (status, payload) = fetch(registry, &format!("/v2/{repository}/blobs/{layer}"), "*/*").expect("GET blob");
    assert_eq!(status, 200);
    (manifest, payload)
}

/// Pushes `manifest` with `payload` as its only layer (and the config it names) as the signature
/// tag of `digest` in `repository`.
fn put_signature(registry: SocketAddr, repository: &str, digest: &str, mut manifest: Value, payload: &[u8]) {
    manifest["layers"][0]["digest"] = json!(sha256_digest(payload));
    manifest["layers"][0]["size"] = json!(payload.len());
    let config = br#"{"architecture":"","os":"","config":{},"rootfs":{"type":"layers","diff_ids":[]}}"#;
    manifest["config"]["digest"] = json!(sha256_digest(config));
    manifest["config"]["size"] = json!(config.len());
    let tag = format!("sha256-{}.sig", digest.trim_start_matches("sha256:"));
    let body = serde_json::to_vec(&manifest).expect("json");
    push_raw(registry, repository, &tag, &[config, payload], &body, OCI_MANIFEST).expect("push signature");
}

fn ensure(image: &str, namespace: &str, uid: &str) -> Call {
    let pod = json!({ "namespace": namespace, "name": "web", "uid": uid });
    Call::new(
        "imagemanager.v1.ImageManager/EnsureImageExists",
        json!({ "image": image, "pull_policy": "IF_NOT_PRESENT", "pod": pod }),
    )
}

fn cri_pull(image: &str, namespace: &str) -> Call {
    let sandbox = json!({ "metadata": { "name": "web", "uid": "u-1", "namespace": namespace } });
    Call::new("runtime.v1.ImageService/PullImage", json!({ "image": { "image": image }, "sandbox_config": sandbox }))
}

fn status(image: &str) -> Call {
    Call::new("runtime.v1.ImageService/ImageStatus", json!({ "image": { "image": image } }))
}

async fn run(client: Client, socket: &Path, calls: Vec<Call>) -> Vec<Answer> {
    let socket = socket.to_owned();
    tokio::task::spawn_blocking(move || client.run(&socket, &calls)).await.expect("client task")
}

#[tokio::test]
async fn cosign_and_cri_imaged_agree_on_every_signature_and_a_refused_image_never_reaches_containerd() {
    let Some(cosign) = cosign() else { return };
    let Some(stack) = LocalStack::start() else { return };
    let registry: SocketAddr = stack.registry.parse().expect("a loopback address");
    let dir = tempfile::tempdir().expect("tempdir");
    let (ours, theirs) = (key_pair(&cosign, &dir.path().join("ours")), key_pair(&cosign, &dir.path().join("theirs")));

    // Each case: a repository, what happened to its signature, and whether it should be let in.
    let digest = |name: &str| stack.seed(&format!("sig/{name}:v1"), name);
    let signed = digest("signed");
    sign(&cosign, &ours, &format!("{}@{signed}", stack.image("sig/signed")));
    digest("unsigned");
    let other_key = digest("otherkey");
    sign(&cosign, &theirs, &format!("{}@{other_key}", stack.image("sig/otherkey")));
    // The signed image's signature, copied as the signature of another digest.
    let moved = digest("moved");
    let (manifest, payload) = signature_of(registry, "sig/signed", &signed);
    put_signature(registry, "sig/moved", &moved, manifest, &payload);
    // A signature whose payload was changed after signing (one byte of white space).
    let tampered = digest("tampered");
    sign(&cosign, &ours, &format!("{}@{tampered}", stack.image("sig/tampered")));
    let (manifest, mut payload) = signature_of(registry, "sig/tampered", &tampered);
    payload.push(b' ');
    put_signature(registry, "sig/tampered", &tampered, manifest, &payload);
    // A signature layer of 100 MiB.
    let huge = digest("huge");
    let (manifest, _) = signature_of(registry, "sig/signed", &signed);
    put_signature(registry, "sig/huge", &huge, manifest, &vec![b'{'; 100 << 20]);

    // Each case, whether it goes in, and the reason a person reads when it does not.
    let cases = [
        ("signed", true, ""),
        ("unsigned", false, "no signature for sha256:"),
        ("otherkey", false, "not signed by the policy's ECDSA P-256 key"),
        ("moved", false, "signed for another image"),
        ("tampered", false, "not signed by the policy's ECDSA P-256 key"),
        ("huge", false, "a payload of 104857600 bytes, more than 65536"),
    ];
    for (name, expected, _) in cases {
        let image = stack.image(&format!("sig/{name}:v1"));
        assert_eq!(cosign_accepts(&cosign, &ours, &image), expected, "cosign's verdict on {name}");
    }

    let policy = json!({
        "default": [{ "type": "reject" }],
        "transports": { "docker": { format!("{}/sig", stack.registry): [{
            "type": "sigstoreSigned",
            "keyPath": ours.join("cosign.pub"),
            "signedIdentity": { "type": "matchRepository" },
        }] } }
    });
    let file = dir.path().join("policy.json");
    std::fs::write(&file, policy.to_string()).expect("policy");
    let (port, listen) = metrics_listen();
    let flags = ["--signature-policy", file.to_str().expect("utf-8"), "--metrics-listen", &listen];
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &flags).await;

    let clients = Client::available();
    for (i, &client) in clients.iter().enumerate() {
        for (name, expected, reason) in cases {
            let image = stack.image(&format!("sig/{name}:v1"));
            let answers = run(
                client,
                &daemon.socket,
                vec![ensure(&image, "prod", &format!("{name}-{i}")), cri_pull(&image, "prod")],
            )
            .await;
            if expected {
                assert!(answers.iter().all(|answer| answer.code() == "OK"), "{client:?} {name}: {answers:?}");
                continue;
            }
            let Answer::Error { code, message } = &answers[0] else { panic!("{client:?} let {name} in") };
            assert_eq!(code, "PERMISSION_DENIED", "{client:?} {name}: {message}");
            let prefix = format!("image pull failed for {image} because the signature validation failed: ");
            assert!(message.starts_with(&prefix), "{client:?} {name}: {message}");
            assert!(message.contains(reason), "{client:?} {name}: {message}");
            let Answer::Error { code, message } = &answers[1] else { panic!("{client:?} CRI let {name} in") };
            assert_eq!(code, "UNKNOWN");
            assert!(message.starts_with("SignatureValidationFailed: "), "{client:?} {name}: {message}");
            // Straight to containerd: never pulled.
            let direct = run(client, &stack.containerd_socket, vec![status(&image)]).await;
            assert_eq!(direct[0], Answer::Ok(json!({})), "{client:?}: containerd does not have {name}");
        }
    }
    assert_eq!(clients.len(), 2, "grpcio and grpc-js both ran");

    // The signed image present now: answered from what was verified, no signature read again.
    let fetched = metric(port, "cri_imaged_signature_manifests_fetched_total");
    let image = stack.image("sig/signed:v1");
    let answers = run(clients[0], &daemon.socket, vec![ensure(&image, "prod", "again")]).await;
    assert_eq!(answers[0].code(), "OK", "{answers:?}");
    assert_eq!(metric(port, "cri_imaged_signature_manifests_fetched_total"), fetched);
    assert!(metric(port, "cri_imaged_signature_cache_hits_total") >= 1.0);
    assert!(metric_with_label(port, "cri_imaged_signature_verifications_total", r#"result="verified""#) >= 1.0);
    assert!(metric_with_label(port, "cri_imaged_signature_verifications_total", r#"result="rejected""#) >= 5.0);

    // A herd on a signed absent image: its signatures are read once.
    let herd = digest("herd");
    sign(&cosign, &ours, &format!("{}@{herd}", stack.image("sig/herd")));
    let fetched = metric(port, "cri_imaged_signature_manifests_fetched_total");
    let image = stack.image("sig/herd:v1");
    let channel = unix_channel(&daemon.socket);
    let calls: Vec<_> = (0..200)
        .map(|pod| {
            let mut client = ImageManagerClient::new(channel.clone());
            let mut request = support::ensure(&image, IF_NOT_PRESENT);
            let pod_ref = request.pod.as_mut().expect("pod");
            (pod_ref.namespace, pod_ref.uid) = ("prod".into(), format!("herd-{pod}"));
            tokio::spawn(async move { call(&mut client, request).await })
        })
        .collect();
    for call in calls {
        call.await.expect("task").expect("every pod of the herd gets the signed image");
    }
    assert_eq!(metric(port, "cri_imaged_signature_manifests_fetched_total") - fetched, 1.0, "one read for the herd");

    // Pre-pulls (the default policy's): the signed one is pulled, the unsigned one fails with the
    // policy's reason and never reaches containerd.
    let signed_pre = digest("prepull-signed");
    digest("prepull-unsigned");
    sign(&cosign, &ours, &format!("{}@{signed_pre}", stack.image("sig/prepull-signed")));
    let images = [stack.image("sig/prepull-signed:v1"), stack.image("sig/prepull-unsigned:v1")];
    let submit = Call::new("imagemanager.v1.ImageManager/SubmitPrePull", json!({ "images": images }));
    let submitted = run(clients[0], &daemon.socket, vec![submit]).await;
    let Answer::Ok(submitted) = &submitted[0] else { panic!("{submitted:?}") };
    let ids: Vec<String> = submitted["pre_pulls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|pre_pull| pre_pull["id"].as_str().expect("an id").to_owned())
        .collect();
    let mut ended = Vec::new();
    for id in &ids {
        let get = Call::new("imagemanager.v1.ImageManager/GetPrePull", json!({ "id": id }));
        let mut pre_pull = Value::Null;
        for _ in 0..200 {
            let answers = run(clients[0], &daemon.socket, vec![get.clone()]).await;
            let Answer::Ok(answer) = &answers[0] else { panic!("{answers:?}") };
            pre_pull = answer.clone();
            if pre_pull["state"] == "done" || pre_pull["state"] == "failed" {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        ended.push(pre_pull);
    }
    assert_eq!(ended[0]["state"], json!("done"), "{}", ended[0]);
    assert_eq!(ended[1]["state"], json!("failed"), "{}", ended[1]);
    assert_eq!(ended[1]["reason"], json!("SignatureValidationFailed"), "{}", ended[1]);
    assert!(ended[1]["message"].as_str().is_some_and(|message| message.contains("no signature for sha256:")));
    let direct = run(clients[0], &stack.containerd_socket, vec![status(&images[1])]).await;
    assert_eq!(direct[0], Answer::Ok(json!({})), "containerd does not have the unsigned pre-pull");

    // The events say which key verified the image, and why the others were refused.
    let events =
        run(clients[0], &daemon.socket, vec![Call::new("imagemanager.v1.ImageManager/ListEvents", json!({}))]).await;
    let Answer::Ok(listed) = &events[0] else { panic!("{events:?}") };
    let reasons: Vec<&str> =
        listed["events"].as_array().into_iter().flatten().filter_map(|e| e["reason"].as_str()).collect();
    assert!(reasons.contains(&"SignatureVerified"), "{reasons:?}");
    assert!(reasons.contains(&"SignatureValidationFailed"), "{reasons:?}");
}
