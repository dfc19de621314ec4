//! The clients node agents and operators really use, with their default options, against the
//! daemon's socket: Python grpcio here; grpcurl in `daemon_process.rs`; grpcio, grpc-js and
//! grpcurl against containerd and cri-imaged alike in `cri_conformance.rs`. grpcio sends the
//! socket path, not a host name, as its HTTP/2 `:authority`.

mod support;

use std::{path::PathBuf, process::Command};

use support::{
    fake_runtime::{FakeImageService, FakeRuntime},
    process::{DaemonProcess, require_python_modules, require_tool},
};

const GRPCIO_CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/grpcio_client.py");
const PROTO_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/proto");

/// Runs the Python grpcio client against `daemon` for `images`, watching its pod's events if
/// `watch`; its stdout and stderr, once it succeeded.
async fn grpcio_client(python: PathBuf, daemon: &DaemonProcess, images: Vec<String>, watch: bool) -> (String, String) {
    let socket = daemon.socket.clone();
    let output = tokio::task::spawn_blocking(move || {
        let mut client = Command::new(python);
        client.arg(GRPCIO_CLIENT).arg(&socket).arg(PROTO_DIR).args(images);
        if watch {
            client.env("WATCH_EVENTS", "1");
        }
        client.output()
    })
    .await
    .expect("client task")
    .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "the client failed:\n{stdout}\n{stderr}");
    (stdout, stderr)
}

#[tokio::test]
async fn python_grpcio_with_its_default_authority_checks_health_ensures_images_and_watches_their_events() {
    if !require_python_modules(&["grpc", "grpc_tools", "grpc_health.v1", "grpc_status"]) {
        return;
    }
    let Some(python) = require_tool("python3") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), FakeImageService::default());
    runtime.service.fail_pull("missing:1", tonic::Status::not_found("manifest unknown"));
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &runtime.socket, &[]).await;

    let images = ["busybox:1.36", "busybox:1.36", "missing:1", "Not/A Valid:Name"];
    let (stdout, stderr) = grpcio_client(python, &daemon, images.map(String::from).to_vec(), true).await;

    let lines: Vec<&str> = stdout.lines().collect();
    let expected = [
        r#"{"health": "", "status": "SERVING"}"#,
        r#"{"health": "imagemanager.v1.ImageManager", "status": "SERVING"}"#,
    ];
    assert_eq!(lines[..2], expected, "{stderr}");
    assert!(lines[2].contains(r#""pulled": true"#), "{}", lines[2]);
    assert!(lines[2].contains(r#"Successfully pulled image \"busybox:1.36\" in "#), "{}", lines[2]);
    assert_eq!(
        lines[3],
        r#"{"image": "busybox:1.36", "pulled": false, "message": "Container image \"busybox:1.36\" already present on machine and can be accessed by the pod"}"#
    );
    assert!(
        lines[4].contains(r#""code": "NOT_FOUND""#) && lines[4].contains(r#""reason": "ErrImagePull""#),
        "{}",
        lines[4]
    );
    assert!(
        lines[5].contains(r#""code": "INVALID_ARGUMENT""#) && lines[5].contains(r#""reason": "InvalidImageName""#),
        "{}",
        lines[5]
    );
    // Its pod's events, in order, read through the WatchEvents stream.
    let events: Vec<String> = lines[6..]
        .iter()
        .map(|line| {
            let event: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
            assert_eq!(event["pod"], "python-agent-uid", "{line}");
            format!("{} {} {}", event["type"].as_str().unwrap(), event["event"].as_str().unwrap(), event["image"])
        })
        .collect();
    assert_eq!(
        events,
        [
            r#"Normal Pulling "busybox:1.36""#,
            r#"Normal Pulled "busybox:1.36""#,
            r#"Normal Pulled "busybox:1.36""#,
            r#"Normal Pulling "missing:1""#,
            r#"Warning Failed "missing:1""#,
            r#"Warning InspectFailed "Not/A Valid:Name""#,
        ],
        "{stdout}"
    );
    assert_eq!(runtime.service.pulls().len(), 2, "busybox once, missing:1 once");
}

/// A 1 MiB image name once made an answer whose trailers C-core clients refuse (`received
/// metadata size exceeds hard limit`, no reason); a 3 MiB request is beyond what our API takes.
#[tokio::test]
async fn python_grpcio_gets_invalid_image_name_for_a_huge_name_and_the_size_limit_beyond() {
    if !require_python_modules(&["grpc", "grpc_tools", "grpc_health.v1", "grpc_status"]) {
        return;
    }
    let Some(python) = require_tool("python3") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), FakeImageService::default());
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &runtime.socket, &[]).await;
    let images = vec![format!("LONG:{}", 1 << 20), format!("LONG:{}", 3 << 20)];
    let (stdout, _) = grpcio_client(python, &daemon, images, false).await;
    let lines: Vec<serde_json::Value> =
        stdout.lines().skip(2).map(|line| serde_json::from_str(line).expect("a JSON line")).collect();
    let huge = &lines[0];
    assert_eq!(huge["code"], "INVALID_ARGUMENT", "{huge}");
    assert_eq!(huge["reason"], "InvalidImageName", "{huge}");
    let message = huge["message"].as_str().expect("a message");
    assert!(message.len() < 1024, "the name is echoed bounded: {} bytes", message.len());
    assert!(message.contains("(1048576 bytes)"), "{message}");
    let beyond = &lines[1];
    // tonic's code for a request over the limit (grpc-go says RESOURCE_EXHAUSTED), with both sizes.
    assert_eq!(beyond["code"], "OUT_OF_RANGE", "{beyond}");
    assert!(
        beyond["message"].as_str().is_some_and(|message| message.contains("the limit is: 2097152 bytes")),
        "{beyond}"
    );
    assert_eq!(lines.len(), 2, "{stdout}");
    let log = daemon.log_text();
    assert!(log.len() < 64 * 1024, "the log repeats the name bounded: {} bytes", log.len());
    assert!(runtime.service.pulls().is_empty());
}
