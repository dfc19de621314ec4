//! Pre-pulls in a namespace, on a real containerd and a loopback registry, through the cri-imaged
//! binary, asked for by a client we did not write (grpcio, else grpc-js) and by the command line:
//! a pre-pull names the namespace whose pods the image is for and that namespace's image policy
//! admits it (its own `--signature-policy-dir` file, its audit mode), as its pods' pulls; the same
//! image without a namespace is the node's default policy's, a pre-pull of its own; a namespace
//! that is no Kubernetes name is refused, saying why.

mod support;

use std::{
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use serde_json::{Value, json};
use support::{
    clients::{Answer, Call, Client},
    process::DaemonProcess,
    stack::LocalStack,
};

const BIN: &str = env!("CARGO_BIN_EXE_cri-imaged");

fn submit(image: &str, namespace: &str) -> Call {
    Call::new("imagemanager.v1.ImageManager/SubmitPrePull", json!({ "images": [image], "namespace": namespace }))
}

async fn run(client: Client, socket: &Path, calls: Vec<Call>) -> Vec<Answer> {
    let socket = socket.to_owned();
    tokio::task::spawn_blocking(move || client.run(&socket, &calls)).await.expect("client task")
}

/// The one pre-pull a submission answered with.
fn submitted(answer: &Answer) -> Value {
    let Answer::Ok(answer) = answer else { panic!("refused: {answer:?}") };
    answer["pre_pulls"][0].clone()
}

/// The pre-pull `id` once it ended (done or failed), within 20 s.
async fn ended(client: Client, socket: &Path, id: &str) -> Value {
    let get = Call::new("imagemanager.v1.ImageManager/GetPrePull", json!({ "id": id }));
    for _ in 0..200 {
        let answers = run(client, socket, vec![get.clone()]).await;
        let Answer::Ok(pre_pull) = &answers[0] else { panic!("{answers:?}") };
        if pre_pull["state"] == "done" || pre_pull["state"] == "failed" {
            return pre_pull.clone();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("pre-pull {id} did not end within 20 s");
}

/// `cri-imaged ARGS`: its exit status and stdout.
fn cli(args: &[&str]) -> (i32, String) {
    let output = Command::new(BIN).args(args).stdin(Stdio::null()).output().expect("cri-imaged runs");
    (output.status.code().unwrap_or(-1), String::from_utf8(output.stdout).expect("UTF-8"))
}

#[tokio::test]
async fn a_pre_pull_is_admitted_under_its_namespaces_policy_and_without_one_under_the_nodes() {
    let Some(stack) = LocalStack::start() else { return };
    let Some(&client) = Client::available().first() else { return };
    stack.seed("ns/app:v1", "app");
    stack.seed("ns/cli:v1", "cli");
    let image = stack.image("ns/app:v1");
    let dir = tempfile::tempdir().expect("tempdir");
    let (file, namespaces) = (dir.path().join("policy.json"), dir.path().join("namespaces"));
    std::fs::write(&file, r#"{"default": [{"type": "insecureAcceptAnything"}]}"#).expect("policy");
    std::fs::create_dir(&namespaces).expect("dir");
    for namespace in ["team", "audited"] {
        std::fs::write(namespaces.join(format!("{namespace}.json")), r#"{"default": [{"type": "reject"}]}"#)
            .expect("a namespace's policy");
    }
    let flags = [
        "--signature-policy",
        file.to_str().expect("utf-8"),
        "--signature-policy-dir",
        namespaces.to_str().expect("utf-8"),
        "--signature-policy-audit-namespace",
        "audited",
    ];
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &flags).await;
    let socket = &daemon.socket;

    // No Kubernetes namespace's name: refused, naming the field and why.
    let answers = run(client, socket, vec![submit(&image, "Team"), submit(&image, &"n".repeat(64))]).await;
    let Answer::Error { code, message } = &answers[0] else { panic!("{answers:?}") };
    assert_eq!(code, "INVALID_ARGUMENT");
    assert!(message.contains(r#"namespace "Team" is not a DNS label"#), "{message}");
    let Answer::Error { code, message } = &answers[1] else { panic!("{answers:?}") };
    assert_eq!(code, "INVALID_ARGUMENT");
    assert!(message.contains("namespace: 64 bytes, more than 63"), "{message}");

    // In team, whose policy rejects it: failed with the policy's reason, never on containerd.
    let team = submitted(&run(client, socket, vec![submit(&image, "team")]).await[0]);
    assert_eq!(team["namespace"], "team");
    let team = ended(client, socket, team["id"].as_str().expect("an id")).await;
    assert_eq!((&team["state"], &team["reason"]), (&json!("failed"), &json!("SignatureValidationFailed")), "{team}");
    let message = team["message"].as_str().expect("a message");
    assert!(message.contains(r#"rejected by policy (the policy of namespace "team", its default)"#), "{message}");
    let status = Call::new("runtime.v1.ImageService/ImageStatus", json!({ "image": { "image": image } }));
    assert_eq!(run(client, &stack.containerd_socket, vec![status.clone()]).await[0], Answer::Ok(json!({})));

    // The same image without a namespace: the node's policy lets it in; a pre-pull of its own.
    let node = submitted(&run(client, socket, vec![submit(&image, "")]).await[0]);
    assert_ne!(node["id"], team["id"]);
    let node = ended(client, socket, node["id"].as_str().expect("an id")).await;
    assert_eq!(node["state"], "done", "{node}");
    assert_eq!(node.get("namespace").and_then(Value::as_str).unwrap_or(""), "");

    // Present now, asked again in team: still refused (a present image is judged too).
    let again = submitted(&run(client, socket, vec![submit(&image, "team")]).await[0]);
    assert_eq!((&again["id"], &again["state"]), (&team["id"], &json!("queued")), "queued again");
    let again = ended(client, socket, again["id"].as_str().expect("an id")).await;
    assert_eq!((&again["state"], &again["reason"]), (&json!("failed"), &json!("SignatureValidationFailed")));

    // In audited (audit mode): let in, and said so.
    let audited = submitted(&run(client, socket, vec![submit(&image, "audited")]).await[0]);
    let audited = ended(client, socket, audited["id"].as_str().expect("an id")).await;
    assert_eq!(audited["state"], "done", "{audited}");
    let events = Call::new("imagemanager.v1.ImageManager/ListEvents", json!({}));
    let Answer::Ok(events) = &run(client, socket, vec![events]).await[0] else { panic!("ListEvents") };
    let audits: Vec<&Value> =
        events["events"].as_array().into_iter().flatten().filter(|event| event["reason"] == "PolicyAudit").collect();
    assert_eq!(audits.len(), 1, "{events}");
    assert_eq!(audits[0]["pod"]["namespace"], "audited", "{}", audits[0]);

    // The command line: a pre-pull in a namespace, and the listing with each one's namespace.
    let socket_flag = format!("--socket={}", socket.display());
    let cli_image = stack.image("ns/cli:v1");
    let (status, stdout) = cli(&["prepull", &socket_flag, &cli_image, "--namespace", "team", "-o", "json"]);
    assert_eq!(status, 0, "{stdout}");
    let asked: Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    assert_eq!((&asked["namespace"], &asked["image"]), (&json!("team"), &json!(cli_image)));
    ended(client, socket, asked["id"].as_str().expect("an id")).await;
    let (status, stdout) = cli(&["prepull", &socket_flag, "-o", "wide"]);
    assert_eq!(status, 0, "{stdout}");
    let rows: Vec<Vec<&str>> = stdout.lines().map(|line| line.split_whitespace().collect()).collect();
    assert_eq!(rows[0], ["ID", "IMAGE", "NAMESPACE", "STATE", "PRIORITY", "AGE", "DETAIL"], "{stdout}");
    let mut listed: Vec<(&str, &str, &str)> = rows[1..].iter().map(|row| (row[1], row[2], row[3])).collect();
    listed.sort_unstable();
    let mut expected = [
        (image.as_str(), "-", "done"),
        (image.as_str(), "audited", "done"),
        (image.as_str(), "team", "failed"),
        (cli_image.as_str(), "team", "failed"),
    ];
    expected.sort_unstable();
    assert_eq!(listed, expected, "{stdout}");
    let (status, stdout) = cli(&["prepull", &socket_flag, "--namespace", "audited", "-o", "json"]);
    assert_eq!((status, stdout.lines().count()), (0, 1), "only audited's: {stdout}");
}
