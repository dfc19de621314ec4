//! One daemon per `--root-dir`, the real binary twice on one root dir: the second is refused at
//! start, naming the root dir and the first (its pid, PID namespace and host name), and binds no socket, while the first keeps
//! serving. A daemon taking the socket over is not refused: it serves at once and holds the root
//! dir once the old one drains. No runtime is needed: health answers without one.

mod support;

use std::time::Duration;

use support::process::DaemonProcess;

#[tokio::test]
async fn a_second_daemon_on_a_root_dir_in_use_exits_naming_it_and_the_holder_while_the_first_serves() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = dir.path().join("no-runtime.sock");
    // Both sockets in one directory: DaemonProcess gives both its `root` as --root-dir.
    let first = DaemonProcess::start(&dir.path().join("first.sock"), &runtime, &[]).await;
    let second_socket = dir.path().join("second.sock");
    let mut second = DaemonProcess::spawn(&second_socket, &runtime, &[]);
    let status = second.wait_for_exit(Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(1), "{}", second.log_text());
    let root = dir.path().join("root");
    let expected =
        format!("cri-imaged: --root-dir {} is in use by another cri-imaged ({})", root.display(), named(first.pid()));
    assert!(second.log_text().contains(&expected), "expected `{expected}` in:\n{}", second.log_text());
    assert!(!second_socket.exists(), "the refused daemon never bound its socket");
    first.wait_until_serving().await;
    let (status, log) = first.terminate().await;
    assert!(status.success(), "the first served on and stopped cleanly:\n{log}");
}

#[tokio::test]
async fn a_daemon_taking_the_socket_over_is_not_refused_and_holds_the_root_dir_once_the_old_one_drains() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = dir.path().join("no-runtime.sock");
    let socket = dir.path().join("agents.sock");
    let take_over = ["--take-over-socket", "true"];
    let mut old = DaemonProcess::start(&socket, &runtime, &take_over).await;
    // Serving means not refused.
    let new = DaemonProcess::start(&socket, &runtime, &take_over).await;
    let lock_file = dir.path().join("root").join(cri_imaged::root_lock::FILE_NAME);
    let holder = || std::fs::read_to_string(&lock_file).unwrap_or_default().lines().next().unwrap_or("").to_owned();
    assert_eq!(holder(), old.pid().to_string(), "the old daemon holds the root dir while it serves");

    old.send_sigterm();
    assert!(old.wait_for_exit(Duration::from_secs(10)).await.success(), "{}", old.log_text());
    for _ in 0..250 {
        if holder() == new.pid().to_string() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(holder(), new.pid().to_string(), "the new daemon holds the root dir within 5 s");
    let mut third = DaemonProcess::spawn(&dir.path().join("third.sock"), &runtime, &[]);
    assert_eq!(third.wait_for_exit(Duration::from_secs(10)).await.code(), Some(1), "{}", third.log_text());
    let refusal = format!("is in use by another cri-imaged ({})", named(new.pid()));
    assert!(third.log_text().contains(&refusal), "expected `{refusal}` in:\n{}", third.log_text());
    new.wait_until_serving().await;
}

/// How a refusal names a daemon this test started: `pid` in this test's PID namespace, on its host.
fn named(pid: u32) -> String {
    let namespace = std::fs::read_link("/proc/self/ns/pid").expect("our PID namespace");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("our host name");
    format!("pid {pid} in PID namespace {} on host {}", namespace.display(), host.trim())
}
