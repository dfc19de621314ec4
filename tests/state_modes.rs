//! State others could write, under the real binary (issue 59): a root dir or state directory
//! writable by its group or others is made writable by its owner only, said in the log, and the
//! daemon serves; one another user owns refuses the start, naming it (the verifications, a cache,
//! are then kept in memory only); a state file of each kind writable by others, or another user's,
//! is set aside (quarantined, counted, logged) and read as none. Run as root (the tests' user):
//! files are given to uid 65534 (nobody).

mod support;

use std::{
    fs,
    os::unix::fs::{MetadataExt, PermissionsExt, chown},
    path::{Path, PathBuf},
    time::Duration,
};

use cri_imaged::{
    api::{GarbageCollectRequest, image_manager_client::ImageManagerClient},
    files::StateDir,
};
use support::{
    fake_runtime::{FakeImageService, FakeRuntime},
    process::{DaemonProcess, metric_with_label, metrics_listen},
    unix_channel,
};

/// Another user than the daemon's (root).
const NOBODY: u32 = 65534;

/// Each directory of state under `--root-dir`, the root dir itself first.
const STATE_DIRS: [&str; 7] =
    ["", "image_manager", "image_manager/pulling", "image_manager/pulled", "pre_pulls", "image_gc", "signatures"];

/// Each kind of state file: its directory, a key it is kept under, its `file` label in
/// `cri_imaged_state_files_quarantined_total`.
const STATE_FILES: [(&str, &str, &str); 5] = [
    ("image_manager/pulling", "registry.local/app:v1", "intent"),
    ("image_manager/pulled", "sha256:app", "record"),
    ("pre_pulls", "pre-pull-1", "pre_pull"),
    ("image_gc", "image-ages", "ages"),
    ("signatures", "verified", "signatures"),
];

/// `dir` under `root`; `""` is the root dir itself (as `--root-dir` names it, no trailing slash).
fn in_root(root: &Path, dir: &str) -> PathBuf {
    if dir.is_empty() { root.to_owned() } else { root.join(dir) }
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).expect("metadata").permissions().mode() & 0o7777
}

fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
}

/// A root dir with every state directory in it, mode 0700.
fn state_dirs(root: &Path) -> Vec<PathBuf> {
    let dirs: Vec<PathBuf> = STATE_DIRS.iter().map(|dir| in_root(root, dir)).collect();
    for dir in &dirs {
        fs::create_dir_all(dir).expect("created");
        chmod(dir, 0o700);
    }
    dirs
}

/// A file of each kind under `root`, as `spoil` leaves it; their paths.
fn state_files(root: &Path, spoil: impl Fn(&Path)) -> Vec<PathBuf> {
    state_dirs(root);
    let files: Vec<PathBuf> =
        STATE_FILES.iter().map(|(dir, key, _)| root.join(dir).join(StateDir::file_name(key))).collect();
    for file in &files {
        // What it says does not matter: it is refused before it is read.
        fs::write(file, b"{}").expect("written");
        chmod(file, 0o600);
        spoil(file);
    }
    files
}

/// Asks for a (dry-run) image GC pass: the ages file is read on the first.
async fn collect(daemon: &DaemonProcess) {
    let mut client = ImageManagerClient::new(unix_channel(&daemon.socket));
    let request = GarbageCollectRequest { dry_run: true, delete_unused: true };
    client.garbage_collect(request).await.expect("GarbageCollect answers");
}

async fn serve_on(dir: &Path, extra: &[&str]) -> (FakeRuntime, DaemonProcess) {
    let runtime = FakeRuntime::start_for_gc(&dir.join("runtime.sock"), FakeImageService::default());
    let daemon = DaemonProcess::start(&dir.join("cri-imaged.sock"), &runtime.socket, extra).await;
    (runtime, daemon)
}

#[tokio::test]
async fn a_root_dir_and_state_dirs_writable_by_others_are_made_writable_by_their_owner_only_logged_and_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dirs = state_dirs(&dir.path().join("root"));
    for (state_dir, open) in dirs.iter().zip([0o777, 0o770, 0o757, 0o1777, 0o722, 0o775, 0o703]) {
        chmod(state_dir, open);
    }
    let (_runtime, daemon) = serve_on(dir.path(), &[]).await;
    collect(&daemon).await;
    let log = daemon.log_text();
    let modes: Vec<u32> = dirs.iter().map(|state_dir| mode(state_dir)).collect();
    assert_eq!(modes, [0o755, 0o750, 0o755, 0o1755, 0o700, 0o755, 0o701], "group and others' write bits gone");
    for (state_dir, open) in dirs.iter().zip(["0777", "0770", "0757", "1777", "0722", "0775", "0703"]) {
        let said = log.lines().any(|line| {
            line.contains("state was writable by others; made writable by its owner only")
                && line.contains(&format!("path={}", state_dir.display()))
                && line.contains(&format!("from={open}"))
        });
        assert!(said, "{}: no log line naming it and its mode {open}\n{log}", state_dir.display());
    }
    let (status, _) = daemon.terminate().await;
    assert!(status.success(), "{status}");
}

#[tokio::test]
async fn a_root_dir_or_state_dir_another_user_owns_refuses_the_start_naming_it_and_the_fix() {
    for state_dir in STATE_DIRS.iter().filter(|state_dir| **state_dir != "signatures") {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        state_dirs(&root);
        let foreign = in_root(&root, state_dir);
        chown(&foreign, Some(NOBODY), None).expect("chown");
        let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), FakeImageService::default());
        let mut daemon = DaemonProcess::spawn(&dir.path().join("cri-imaged.sock"), &runtime.socket, &[]);
        let status = daemon.wait_for_exit(Duration::from_secs(10)).await;
        let log = daemon.log_text();
        assert!(!status.success(), "{state_dir:?}: started\n{log}");
        let named =
            format!("{} is owned by uid {NOBODY}, neither cri-imaged's user (uid 0) nor root", foreign.display());
        assert!(log.contains(&named), "{state_dir:?}: the refusal names the directory and its owner\n{log}");
        assert!(log.contains(&format!("`chown 0 {}`", foreign.display())), "{state_dir:?}: and the fix\n{log}");
        assert_eq!(fs::metadata(&foreign).expect("metadata").uid(), NOBODY, "left as it was");
    }
}

#[tokio::test]
async fn a_signatures_dir_another_user_owns_keeps_verifications_in_memory_only_and_says_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("root");
    state_dirs(&root);
    let signatures = root.join("signatures");
    chown(&signatures, Some(NOBODY), None).expect("chown");
    let (_runtime, daemon) = serve_on(dir.path(), &[]).await;
    daemon
        .wait_for_log("the verifications kept in memory only", |log| {
            log.lines().any(|line| {
                line.contains("signature verifications are kept in memory only")
                    && line.contains(&format!("{} is owned by uid {NOBODY}", signatures.display()))
            })
        })
        .await;
    assert!(fs::read_dir(&signatures).expect("lists").next().is_none(), "nothing written there");
}

/// Starts a daemon over a file of each kind as `spoil` leaves it, and checks each is set aside
/// (counted under its kind, logged saying `why`, renamed aside) and the daemon serves.
async fn each_state_file_is_set_aside(spoil: impl Fn(&Path), why: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let files = state_files(&dir.path().join("root"), spoil);
    let (port, listen) = metrics_listen();
    let (_runtime, daemon) = serve_on(dir.path(), &["--metrics-listen", &listen]).await;
    collect(&daemon).await;
    let quarantined = move || {
        STATE_FILES.map(|(_, _, kind)| {
            metric_with_label(port, "cri_imaged_state_files_quarantined_total", &format!("file=\"{kind}\""))
        })
    };
    // The records and the ages are read in the background: at most 10 s.
    let counted = tokio::task::spawn_blocking(move || {
        let mut counted = quarantined();
        for _ in 0..500 {
            if counted == [1.0; 5] {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            counted = quarantined();
        }
        counted
    })
    .await
    .expect("metrics");
    assert_eq!(counted, [1.0; 5], "intent, record, pre-pull, ages, signatures each set aside once");
    let log = daemon.log_text();
    for file in &files {
        let logged = log.lines().any(|line| {
            line.contains(&format!("state file is {why}")) && line.contains(&format!("path={}", file.display()))
        });
        assert!(logged, "{}: no log line saying it is {why}\n{log}", file.display());
        let name = file.file_name().expect("a name").to_string_lossy().into_owned();
        let aside: Vec<PathBuf> = fs::read_dir(file.parent().expect("a directory"))
            .expect("lists")
            .map(|entry| entry.expect("entry").path())
            .filter(|path| path.to_string_lossy().ends_with(".quarantined"))
            .collect();
        assert!(
            matches!(&aside[..], [one] if one.file_name().is_some_and(|aside| aside.to_string_lossy().starts_with(&name))),
            "{}: set aside beside the others: {aside:?}",
            file.display()
        );
        // The ages file is written anew by the GC pass: the daemon's own, private.
        if let Ok(metadata) = fs::metadata(file) {
            assert_eq!((metadata.uid(), metadata.mode() & 0o777), (0, 0o600), "{}", file.display());
        }
    }
    // Still serving.
    collect(&daemon).await;
}

#[tokio::test]
async fn a_state_file_of_each_kind_writable_by_others_is_set_aside_counted_and_logged() {
    each_state_file_is_set_aside(|file| chmod(file, 0o666), "writable by others (mode 0666); quarantined").await;
}

#[tokio::test]
async fn a_state_file_of_each_kind_another_user_owns_is_set_aside_counted_and_logged() {
    let owned_by_nobody = |file: &Path| chown(file, Some(NOBODY), None).expect("chown");
    let why = format!("owned by uid {NOBODY}, neither cri-imaged's user (uid 0) nor root; quarantined");
    each_state_file_is_set_aside(owned_by_nobody, &why).await;
}

#[tokio::test]
async fn a_lock_file_writable_by_others_is_made_private_and_one_another_user_owns_refuses_the_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("root");
    state_dirs(&root);
    let lock = root.join("cri-imaged.lock");
    fs::write(&lock, b"").expect("written");
    chmod(&lock, 0o666);
    let (_runtime, daemon) = serve_on(dir.path(), &[]).await;
    assert_eq!(mode(&lock), 0o644);
    let log = daemon.log_text();
    assert!(
        log.lines().any(|line| line.contains("state was writable by others") && line.contains("cri-imaged.lock")),
        "{log}"
    );
    let (status, _) = daemon.terminate().await;
    assert!(status.success(), "{status}");

    chown(&lock, Some(NOBODY), None).expect("chown");
    let runtime = FakeRuntime::start(&dir.path().join("runtime2.sock"), FakeImageService::default());
    let mut daemon = DaemonProcess::spawn(&dir.path().join("cri-imaged.sock"), &runtime.socket, &[]);
    let status = daemon.wait_for_exit(Duration::from_secs(10)).await;
    let log = daemon.log_text();
    assert!(!status.success(), "started\n{log}");
    assert!(log.contains(&format!("{} is owned by uid {NOBODY}", lock.display())), "{log}");
}
