use std::{os::unix::fs::PermissionsExt, time::Duration};

use super::*;
use crate::shutdown;

fn mode_of(path: &Path) -> u32 {
    std::fs::metadata(path).expect("exists").permissions().mode() & 0o7777
}

fn refused(root_dir: &Path) -> RootLockError {
    RootLock::take(root_dir, false).expect_err("the lock is held")
}

/// Lets spawned tasks run (and a dropped one release its file).
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[test]
fn creates_the_root_dir_0700_and_a_lock_file_0600_holding_our_pid() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("var/lib/cri-imaged");
    let _lock = RootLock::take(&root, false).expect("taken");
    assert_eq!(mode_of(&root), DIRECTORY_MODE);
    assert_eq!(mode_of(&root.join(FILE_NAME)), FILE_MODE);
    let written = std::fs::read_to_string(root.join(FILE_NAME)).expect("reads");
    assert_eq!(written, us().to_file());
    assert!(written.starts_with(&format!("{}\n", std::process::id())), "{written}");
}

/// This process as a holder, each part read here as the daemon reads it.
fn us() -> Holder {
    let pid_namespace = std::fs::read_link("/proc/self/ns/pid").expect("our PID namespace");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("our host name");
    Holder {
        pid: Some(std::process::id()),
        pid_namespace: Some(pid_namespace.to_string_lossy().into_owned()),
        host: Some(host.trim().to_owned()),
    }
}

#[test]
fn a_second_daemon_is_refused_naming_the_root_dir_and_the_holder_which_stays_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _first = RootLock::take(dir.path(), false).expect("taken");
    let error = refused(dir.path());
    let us = us();
    assert!(matches!(&error, RootLockError::Held { holder, .. } if *holder == us), "{error}");
    let (pid, namespace, host) = (std::process::id(), us.pid_namespace.as_deref(), us.host.as_deref());
    let message = error.to_string();
    let named = format!("(pid {pid} in PID namespace {} on host {})", namespace.unwrap_or(""), host.unwrap_or(""));
    let expected = format!("--root-dir {} is in use by another cri-imaged {named}", dir.path().display());
    assert!(message.starts_with(&expected), "{message}");
    let written = std::fs::read_to_string(dir.path().join(FILE_NAME)).expect("reads");
    assert_eq!(written, us.to_file(), "the refused daemon left the holder alone");
}

#[test]
fn a_lock_file_left_by_a_dead_daemon_is_taken_and_rewritten() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join(FILE_NAME), "999999999 and more than a pid\n").expect("written");
    drop(RootLock::take(dir.path(), false).expect("nobody holds it"));
    let written = std::fs::read_to_string(dir.path().join(FILE_NAME)).expect("reads");
    assert_eq!(written, us().to_file());
}

#[test]
fn a_holder_that_has_not_written_its_pid_yet_is_named_as_such() {
    let holder = Holder::default();
    assert_eq!(holder.to_string(), "pid not yet written");
}

#[test]
fn a_holder_in_a_pod_is_named_by_its_pid_namespace_and_host_and_junk_in_the_file_is_left_out() {
    let pod = Holder::from_file("1\npid_namespace=pid:[4026532841]\nhost=cri-imaged-x7k2p\n");
    assert_eq!(pod.to_string(), "pid 1 in PID namespace pid:[4026532841] on host cri-imaged-x7k2p");
    assert_eq!(Holder::from_file(&pod.to_file()), pod, "read as written");

    let long = "a".repeat(65);
    let junk = Holder::from_file(&format!("7\nhost=\u{1b}[31mred\npid_namespace={long}\nother=x\n"));
    assert_eq!(junk, Holder { pid: Some(7), ..Holder::default() });
    assert_eq!(Holder::from_file("not a pid\nhost=h\n").to_string(), "pid not yet written on host h");
}

#[test]
fn a_link_a_directory_or_a_fifo_in_place_of_the_lock_file_is_refused_without_blocking() {
    let dir = tempfile::tempdir().expect("tempdir");
    let target = dir.path().join("precious");
    std::fs::write(&target, "keep me").expect("written");
    let root = dir.path().join("root");
    std::fs::create_dir(&root).expect("mkdir");
    std::os::unix::fs::symlink(&target, root.join(FILE_NAME)).expect("symlink");
    assert!(matches!(RootLock::take(&root, false), Err(RootLockError::NotRegular { .. })));
    assert_eq!(std::fs::read_to_string(&target).expect("reads"), "keep me", "the link was not followed");

    std::fs::remove_file(root.join(FILE_NAME)).expect("removed");
    std::fs::create_dir(root.join(FILE_NAME)).expect("a directory in its place");
    assert!(matches!(RootLock::take(&root, false), Err(RootLockError::NotRegular { .. })));

    std::fs::remove_dir(root.join(FILE_NAME)).expect("removed");
    let made = std::process::Command::new("mkfifo").arg(root.join(FILE_NAME)).status().expect("mkfifo runs");
    assert!(made.success());
    let error = RootLock::take(&root, false).expect_err("a FIFO");
    assert!(matches!(error, RootLockError::NotRegular { .. }), "{error}");
    assert!(error.to_string().contains("is not a regular file"), "{error}");
}

#[tokio::test]
async fn the_lock_is_let_go_when_the_daemon_starts_draining() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (trigger, shutdown) = shutdown::channel();
    RootLock::take(dir.path(), false).expect("taken").release_on(shutdown);
    settle().await;
    refused(dir.path());
    trigger.request();
    settle().await;
    let _successor = RootLock::take(dir.path(), false).expect("the draining daemon let it go");
}

#[tokio::test(start_paused = true)]
async fn a_daemon_taking_over_waits_for_the_lock_and_holds_it_once_the_holder_drains() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (old_trigger, old_shutdown) = shutdown::channel();
    RootLock::take(dir.path(), false).expect("taken").release_on(old_shutdown);
    let (new_trigger, new_shutdown) = shutdown::channel();
    let new = RootLock::take(dir.path(), true).expect("taking over is not refused");
    assert!(!new.held);
    new.release_on(new_shutdown);

    tokio::time::sleep(Duration::from_secs(30)).await;
    refused(dir.path());
    old_trigger.request();
    tokio::time::sleep(Duration::from_secs(2)).await;
    refused(dir.path());
    // Only the new daemon can hold it now; it lets it go when it drains in turn.
    new_trigger.request();
    settle().await;
    let _third = RootLock::take(dir.path(), false).expect("the new daemon let it go");
}

#[tokio::test(start_paused = true)]
async fn a_daemon_taking_over_that_drains_before_the_lock_frees_never_takes_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let holder = RootLock::take(dir.path(), false).expect("taken");
    let (trigger, shutdown) = shutdown::channel();
    RootLock::take(dir.path(), true).expect("waits").release_on(shutdown);
    tokio::time::sleep(Duration::from_secs(5)).await;
    trigger.request();
    settle().await;
    drop(holder);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let _next = RootLock::take(dir.path(), false).expect("the stopped waiter took nothing");
}
