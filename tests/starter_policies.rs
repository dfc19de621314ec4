//! The starter image policies shipped in `examples/policy/` (the book's "Allow only my
//! registries"): each file loads into a real daemon as the node's policy or a namespace's, and
//! `cri-imaged policy check`, run as a process, lets in and refuses what the page says it does.
//! The runtime is the fake one: these policies decide by scope alone, so no registry is asked.

mod support;

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use support::{
    fake_runtime::{FakeImageService, FakeRuntime},
    process::DaemonProcess,
};

const BIN: &str = env!("CARGO_BIN_EXE_cri-imaged");

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/policy").join(name)
}

/// `cri-imaged policy check IMAGE [--namespace NS]`: its exit status and stdout.
fn check(socket: &Path, image: &str, namespace: Option<&str>) -> (i32, String) {
    let mut command = Command::new(BIN);
    command.args(["policy", "check", image]).arg(format!("--socket={}", socket.display())).stdin(Stdio::null());
    if let Some(namespace) = namespace {
        command.args(["--namespace", namespace]);
    }
    let output = command.output().expect("cri-imaged runs");
    let text = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    (output.status.code().unwrap_or(-1), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_starter_policies_load_and_let_in_only_the_registries_they_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The namespaces' directory, as an operator installs it: `ci` as shipped, and `signed`, the
    // signatures policy with its key path pointed at a real P-256 public key.
    let namespaces = dir.path().join("policy.d");
    std::fs::create_dir(&namespaces).expect("dir");
    std::fs::copy(example("namespaces/ci.json"), namespaces.join("ci.json")).expect("copy ci.json");
    let key = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/policy/sigstore/testdata/p256.pub");
    let signed = std::fs::read_to_string(example("signed-from-my-registry.json")).expect("signed policy");
    assert!(signed.contains("/etc/cri-imaged/keys/apps.pub"), "the page's key path: {signed}");
    let signed = signed.replace("/etc/cri-imaged/keys/apps.pub", key.to_str().expect("utf-8"));
    std::fs::write(namespaces.join("signed.json"), signed).expect("signed.json");

    let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), FakeImageService::default());
    let node_policy = example("allow-my-registries.json");
    let flags = [
        "--signature-policy",
        node_policy.to_str().expect("utf-8"),
        "--signature-policy-dir",
        namespaces.to_str().expect("utf-8"),
    ];
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &runtime.socket, &flags).await;
    let socket = daemon.socket.clone();

    // The node's policy: the named registries, nothing else (Docker Hub's short names included).
    for (image, namespace, allowed) in [
        ("registry.example.com/app:v1", None, true),
        ("registry.example.com/team/api:2.0", None, true),
        ("registry.k8s.io/pause:3.10", None, true),
        ("registry.k8s.io/coredns/coredns:v1.11.3", None, true),
        ("docker.io/library/nginx:1.27", None, false),
        ("nginx", None, false),
        ("quay.io/prometheus/node-exporter:v1.8.2", None, false),
        ("registry.example.com.evil.test/app:v1", None, false),
        // `ci`'s own file: the registry and Docker Hub's official images, not other Hub accounts.
        ("registry.example.com/app:v1", Some("ci"), true),
        ("docker.io/library/busybox:1.36", Some("ci"), true),
        ("busybox", Some("ci"), true),
        ("docker.io/someone/tool:1", Some("ci"), false),
        ("registry.k8s.io/pause:3.10", Some("ci"), false),
        // The signatures policy loads with its key; what it lets in without a signature.
        ("registry.k8s.io/pause:3.10", Some("signed"), true),
        ("registry.example.com/other/app:v1", Some("signed"), false),
        ("docker.io/library/nginx:1.27", Some("signed"), false),
        // A namespace without a file of its own gets the node's.
        ("docker.io/library/busybox:1.36", Some("web"), false),
        ("registry.example.com/app:v1", Some("web"), true),
    ] {
        let (code, text) = check(&socket, image, namespace);
        let verdict = if allowed { "allowed" } else { "refused" };
        assert_eq!(code, if allowed { 0 } else { 1 }, "{image} for {namespace:?} must be {verdict}:\n{text}");
        assert!(text.contains(&format!(": {verdict}\n")), "{image} for {namespace:?}:\n{text}");
    }
}
