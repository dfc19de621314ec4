//! The node's image policy (containers-policy.json(5)) on a real containerd and a loopback
//! registry, through the cri-imaged binary, by grpcio and grpc-js: an image the policy rejects
//! never reaches containerd, whichever way it is asked for (EnsureImageExists, CRI PullImage with
//! and without a pod's sandbox config, a pre-pull), with the reason and words the kubelet shows;
//! a namespace's own file replaces the default for its pods; an image already present is refused
//! too; a reload (SIGHUP) changes the policy without a restart and a bad file at a reload keeps
//! the running one; audit mode lets the image in and says so; a bad file refuses the start.

mod support;

use std::{path::Path, time::Duration};

use serde_json::json;
use support::{
    clients::{Answer, Call, Client},
    process::{DaemonProcess, metric_with_label, metrics_listen},
    stack::LocalStack,
};

fn cri_pull(image: &str, namespace: Option<&str>) -> Call {
    let mut request = json!({ "image": { "image": image } });
    if let Some(namespace) = namespace {
        request["sandbox_config"] = json!({ "metadata": { "name": "web", "uid": "u-1", "namespace": namespace } });
    }
    Call::new("runtime.v1.ImageService/PullImage", request)
}

fn ensure(image: &str, namespace: &str, uid: &str) -> Call {
    let pod = json!({ "namespace": namespace, "name": "web", "uid": uid });
    Call::new(
        "imagemanager.v1.ImageManager/EnsureImageExists",
        json!({ "image": image, "pull_policy": "IF_NOT_PRESENT", "pod": pod }),
    )
}

fn status(image: &str) -> Call {
    Call::new("runtime.v1.ImageService/ImageStatus", json!({ "image": { "image": image } }))
}

async fn run(client: Client, socket: &Path, calls: Vec<Call>) -> Vec<Answer> {
    let socket = socket.to_owned();
    tokio::task::spawn_blocking(move || client.run(&socket, &calls)).await.expect("client task")
}

/// Rejects everything but the registry's `policy/allowed` repository.
fn default_policy(registry: &str) -> String {
    json!({
        "default": [{ "type": "reject" }],
        "transports": { "docker": { format!("{registry}/policy/allowed"): [{ "type": "insecureAcceptAnything" }] } }
    })
    .to_string()
}

fn refused(answer: &Answer) -> (&str, &str) {
    match answer {
        Answer::Error { code, message } => (code, message),
        Answer::Ok(response) => panic!("let in: {response}"),
    }
}

#[tokio::test]
async fn an_image_the_policy_rejects_never_reaches_containerd_whichever_way_it_is_asked_for() {
    let Some(stack) = LocalStack::start() else { return };
    stack.seed("policy/allowed:v1", "allowed");
    stack.seed("policy/denied:v1", "denied");
    stack.seed("policy/present:v1", "present");
    let (allowed, denied, present) =
        (stack.image("policy/allowed:v1"), stack.image("policy/denied:v1"), stack.image("policy/present:v1"));
    // Pulled behind cri-imaged's back: present, yet the policy refuses it.
    stack.pull(&present);
    let dir = tempfile::tempdir().expect("tempdir");
    let (file, namespaces) = (dir.path().join("policy.json"), dir.path().join("namespaces"));
    std::fs::write(&file, default_policy(&stack.registry)).expect("policy");
    std::fs::create_dir(&namespaces).expect("dir");
    std::fs::write(namespaces.join("ci.json"), r#"{"default": [{"type": "insecureAcceptAnything"}]}"#).expect("ci");
    let (port, listen) = metrics_listen();
    let flags = [
        "--signature-policy",
        file.to_str().expect("utf-8"),
        "--signature-policy-dir",
        namespaces.to_str().expect("utf-8"),
        "--metrics-listen",
        &listen,
    ];
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &flags).await;

    let clients = Client::available();
    for (i, &client) in clients.iter().enumerate() {
        let uid = |what: &str| format!("{what}-{i}");
        let answers = run(
            client,
            &daemon.socket,
            vec![
                cri_pull(&denied, None),
                cri_pull(&denied, Some("prod")),
                ensure(&denied, "prod", &uid("denied")),
                ensure(&present, "prod", &uid("present")),
                cri_pull(&allowed, None),
                ensure(&allowed, "prod", &uid("allowed")),
            ],
        )
        .await;
        let rejected =
            |image: &str, policy: &str| format!("Running image docker://{image} is rejected by policy ({policy})");
        // CRI PullImage, as CRI-O answers it: UNKNOWN, the kubelet's prefix.
        for answer in &answers[..2] {
            let expected =
                format!("SignatureValidationFailed: {}", rejected(&denied, "the node's policy, its default"));
            assert_eq!(refused(answer), ("UNKNOWN", expected.as_str()), "{client:?}");
        }
        // EnsureImageExists: the kubelet's words for that reason, present or not.
        for (answer, image) in [(&answers[2], &denied), (&answers[3], &present)] {
            let expected = format!(
                "image pull failed for {image} because the signature validation failed: {}",
                rejected(image, "the node's policy, its default")
            );
            assert_eq!(refused(answer), ("PERMISSION_DENIED", expected.as_str()), "{client:?}");
        }
        assert!(answers[4..].iter().all(|answer| answer.code() == "OK"), "{client:?}: {answers:?}");
        // Straight to containerd: the rejected image was never pulled.
        let direct = run(client, &stack.containerd_socket, vec![status(&denied)]).await;
        assert_eq!(direct[0], Answer::Ok(json!({})), "{client:?}: containerd does not have it");
    }
    assert_eq!(clients.len(), 2, "grpcio and grpc-js both ran");

    // The namespace with a file of its own takes the image, by either way in.
    let client = clients[0];
    let answers = run(client, &daemon.socket, vec![cri_pull(&denied, Some("ci")), ensure(&denied, "ci", "ci-1")]).await;
    assert!(answers.iter().all(|answer| answer.code() == "OK"), "{answers:?}");
    let decided = |label: &str| metric_with_label(port, "cri_imaged_policy_decisions_total", label);
    assert!(decided(r#"result="rejected""#) >= 8.0, "{}", decided(r#"result="rejected""#));
    assert!(decided(r#"policy="namespace""#) >= 2.0, "ci's own policy decided");
    let events =
        run(client, &daemon.socket, vec![Call::new("imagemanager.v1.ImageManager/ListEvents", json!({}))]).await;
    let Answer::Ok(listed) = &events[0] else { panic!("{events:?}") };
    let reasons: Vec<&str> =
        listed["events"].as_array().into_iter().flatten().filter_map(|e| e["reason"].as_str()).collect();
    assert!(reasons.contains(&"SignatureValidationFailed"), "{reasons:?}");

    // A reload: a file that does not parse keeps the running policy; a good one replaces it.
    std::fs::write(&file, "{\"default\": [{\"type\": \"acceptIfSunny\"}]}").expect("bad policy");
    daemon.signal("-HUP");
    daemon.wait_for_log("the reload refused", |log| log.contains("configuration reload refused")).await;
    let still = run(client, &daemon.socket, vec![cri_pull(&denied, None)]).await;
    assert_eq!(still[0].code(), "UNKNOWN", "the running policy kept: {still:?}");
    std::fs::write(&file, r#"{"default": [{"type": "insecureAcceptAnything"}]}"#).expect("open policy");
    daemon.signal("-HUP");
    support::eventually("the reloaded policy lets the image in", Duration::from_secs(10), || {
        client.run(&daemon.socket, &[cri_pull(&denied, None)])[0].code() == "OK"
    })
    .await;
}

#[tokio::test]
async fn audit_mode_lets_a_refused_image_in_and_says_so() {
    let Some(stack) = LocalStack::start() else { return };
    stack.seed("policy/audited:v1", "audited");
    let image = stack.image("policy/audited:v1");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("policy.json");
    std::fs::write(&file, r#"{"default": [{"type": "reject"}]}"#).expect("policy");
    let flags = ["--signature-policy", file.to_str().expect("utf-8"), "--signature-policy-mode", "audit"];
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &flags).await;
    let client = Client::available()[0];
    let calls = vec![ensure(&image, "prod", "a-1"), Call::new("imagemanager.v1.ImageManager/ListEvents", json!({}))];
    let answers = run(client, &daemon.socket, calls).await;
    assert_eq!(answers[0].code(), "OK", "{answers:?}");
    let Answer::Ok(listed) = &answers[1] else { panic!("{answers:?}") };
    let audit = listed["events"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|event| event["reason"] == "PolicyAudit")
        .unwrap_or_else(|| panic!("a PolicyAudit event: {listed}"));
    assert!(audit["message"].as_str().is_some_and(|message| message.contains("is rejected by policy")), "{audit}");
}

#[tokio::test]
async fn a_policy_file_that_does_not_hold_refuses_the_start_naming_the_flag_and_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("policy.json");
    std::fs::write(&file, r#"{"default": [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": "/k.gpg"}]}"#)
        .expect("policy");
    let mut daemon = DaemonProcess::spawn(
        &dir.path().join("cri-imaged.sock"),
        &dir.path().join("no-runtime.sock"),
        &["--signature-policy", file.to_str().expect("utf-8")],
    );
    let exit = daemon.wait_for_exit(Duration::from_secs(10)).await;
    assert_eq!(exit.code(), Some(1), "{}", daemon.log_text());
    let log = daemon.log_text();
    assert!(log.contains(&format!("--signature-policy {}", file.display())), "{log}");
    assert!(log.contains("signedBy (GPG signatures) is not supported"), "{log}");
}
