//! What the signature tests on containerd share: cri-imaged started with a policy file, and each
//! image asked for through EnsureImageExists and CRI PullImage by grpcio and grpc-js, let in or
//! refused with the kubelet's reason and ours.

use std::path::Path;

use serde_json::{Value, json};

use super::{
    clients::{Answer, Call, Client},
    process::DaemonProcess,
    stack::LocalStack,
};

/// cri-imaged on `stack`'s containerd, `policy` (containers-policy.json) written in `dir` as its
/// `--signature-policy`.
pub async fn daemon_with_policy(dir: &Path, stack: &LocalStack, policy: &Value) -> DaemonProcess {
    let file = dir.join("policy.json");
    std::fs::write(&file, policy.to_string()).expect("policy");
    let flags = ["--signature-policy", file.to_str().expect("utf-8")];
    DaemonProcess::start(&dir.join("cri-imaged.sock"), &stack.containerd_socket, &flags).await
}

/// Each `(image, let in, our reason)` through EnsureImageExists (a pod of namespace `prod`) and CRI
/// PullImage, by grpcio and grpc-js: both answer OK, or EnsureImageExists answers
/// PERMISSION_DENIED with the kubelet's words and `reason`, and PullImage an error the kubelet reads
/// as SignatureValidationFailed.
pub async fn judged_by_each_client(socket: &Path, cases: &[(String, bool, &str)]) {
    let clients = Client::available();
    for (i, &client) in clients.iter().enumerate() {
        for (n, (image, expected, reason)) in cases.iter().enumerate() {
            let uid = format!("pod-{n}-{i}");
            let pod = json!({ "namespace": "prod", "name": "web", "uid": uid });
            let ensure = Call::new(
                "imagemanager.v1.ImageManager/EnsureImageExists",
                json!({ "image": image, "pull_policy": "IF_NOT_PRESENT", "pod": pod }),
            );
            let sandbox = json!({ "metadata": { "name": "web", "uid": uid, "namespace": "prod" } });
            let pull = Call::new(
                "runtime.v1.ImageService/PullImage",
                json!({ "image": { "image": image }, "sandbox_config": sandbox }),
            );
            let socket = socket.to_owned();
            let answers =
                tokio::task::spawn_blocking(move || client.run(&socket, &[ensure, pull])).await.expect("client task");
            if *expected {
                assert!(answers.iter().all(|answer| answer.code() == "OK"), "{client:?} {image}: {answers:?}");
                continue;
            }
            let Answer::Error { code, message } = &answers[0] else { panic!("{client:?} let {image} in") };
            assert_eq!(code, "PERMISSION_DENIED", "{client:?} {image}: {message}");
            assert!(message.contains("because the signature validation failed: "), "{message}");
            assert!(message.contains(reason), "{client:?} {image}: {message}");
            let Answer::Error { code, message } = &answers[1] else { panic!("{client:?} CRI let {image} in") };
            assert_eq!(code, "UNKNOWN", "{client:?} {image}: {message}");
            assert!(message.starts_with("SignatureValidationFailed: "), "{client:?} {image}: {message}");
        }
    }
    assert_eq!(clients.len(), 2, "grpcio and grpc-js both ran");
}
