//! The daemon under a local client that abuses its socket (issue 17): what it does at its
//! open-file limit.

mod support;

use std::{
    os::unix::net::UnixStream,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use cri_imaged::api::{GetStatusRequest, image_manager_client::ImageManagerClient};
use support::{
    fake_runtime::{FakeImageService, FakeRuntime},
    process::require_tool,
    unix_channel,
};

/// User and system CPU time of `pid` so far (`/proc/PID/stat`, in 10 ms ticks).
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the daemon's stat");
    let (_, fields) = stat.rsplit_once(") ").expect("a stat line");
    let ticks: u64 = fields.split(' ').skip(11).take(2).map(|field| field.parse::<u64>().expect("ticks")).sum();
    Duration::from_millis(ticks * 10)
}

/// GetStatus, retried for at most `limit` (each try bounded by a second).
async fn answers_within(socket: &std::path::Path, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let mut client = ImageManagerClient::new(unix_channel(socket));
        let call = client.get_status(GetStatusRequest::default());
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), call).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn at_the_open_file_limit_the_daemon_waits_and_warns_instead_of_spinning_and_recovers() {
    let Some(prlimit) = require_tool("prlimit") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), FakeImageService::default());
    let socket = dir.path().join("cri-imaged.sock");
    let log = dir.path().join("daemon.log");
    let mut daemon = Command::new(prlimit)
        .arg("--nofile=64:64")
        .arg(env!("CARGO_BIN_EXE_cri-imaged"))
        .arg("serve")
        .arg("--listen")
        .arg(&socket)
        .arg("--runtime-endpoint")
        .arg(&runtime.socket)
        .arg("--root-dir")
        .arg(dir.path().join("root"))
        .args(["--image-gc-high-threshold", "100", "--shutdown-timeout", "2s"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("the daemon starts");
    assert!(answers_within(&socket, Duration::from_secs(10)).await, "never served");

    // Idle connections that never send a byte, more than the daemon has descriptors for.
    let idle: Vec<UnixStream> = (0..100).map(|_| UnixStream::connect(&socket).expect("connects")).collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = cpu_time(daemon.id());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let spent = cpu_time(daemon.id()) - before;
    let text = std::fs::read_to_string(&log).expect("the log");
    assert!(text.contains("cannot accept connections"), "no warning at the limit:\n{text}");
    assert!(spent < Duration::from_millis(500), "{spent:?} of CPU in 2 s at the limit: the accept loop spins");
    eprintln!("at the limit, with {} idle connections: {spent:?} of CPU in 2 s", idle.len());

    drop(idle);
    assert!(answers_within(&socket, Duration::from_secs(5)).await, "no answer once the idle connections went");
    let text = std::fs::read_to_string(&log).expect("the log");
    assert!(text.contains("accepting connections again"), "{text}");
    let _ = daemon.kill();
    let _ = daemon.wait();
}
