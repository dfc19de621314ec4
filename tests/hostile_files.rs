//! State files as an attacker (or a broken disk) leaves them, under the real binary: a pull record
//! that is a FIFO, one that links to `/dev/zero`, an ages file that is a FIFO. Read as files, each
//! would block a thread forever or grow memory without end; the daemon sets each aside
//! (quarantined, counted, logged), reads it as no file, and answers.

mod support;

use std::{path::Path, process::Command, time::Duration};

use cri_imaged::{
    api::{GarbageCollectRequest, PullPolicy, image_manager_client::ImageManagerClient},
    files::StateDir,
};
use support::{
    call, ensure, eventually,
    fake_runtime::{FakeImageService, FakeRuntime},
    process::{DaemonProcess, metric_with_label, metrics_listen},
    unix_channel,
};

const IF_NOT_PRESENT: i32 = PullPolicy::IfNotPresent as i32;
/// Far longer than an answer from memory or a small file takes; a blocked read never ends.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

fn mkfifo(path: &Path) {
    let made = Command::new("mkfifo").arg(path).status().expect("mkfifo runs");
    assert!(made.success(), "mkfifo {}", path.display());
}

#[tokio::test]
async fn pull_records_that_are_a_fifo_or_a_link_to_dev_zero_are_set_aside_and_their_images_verified_without_blocking() {
    let dir = tempfile::tempdir().expect("tempdir");
    let service = FakeImageService::default();
    service.add_image("registry.local/fifo:v1", "sha256:fifo", 1);
    service.add_image("registry.local/zero:v1", "sha256:zero", 1);
    let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), service);
    // A torn record makes the records read at start incomplete: a lookup that memory cannot
    // answer then reads the image's file, on the request path.
    let pulled = dir.path().join("root/image_manager/pulled");
    std::fs::create_dir_all(&pulled).expect("records dir");
    std::fs::write(pulled.join(StateDir::file_name("sha256:torn")), b"{\"kind\":\"ImagePulledRec").expect("torn");
    let (port, listen) = metrics_listen();
    let daemon =
        DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &runtime.socket, &["--metrics-listen", &listen])
            .await;
    eventually("the records were read at start", Duration::from_secs(5), || {
        daemon.log_text().contains("pull record unreadable or corrupt")
    })
    .await;
    mkfifo(&pulled.join(StateDir::file_name("sha256:fifo")));
    std::os::unix::fs::symlink("/dev/zero", pulled.join(StateDir::file_name("sha256:zero"))).expect("link");

    let mut client = ImageManagerClient::new(unix_channel(&daemon.socket));
    for image in ["registry.local/fifo:v1", "registry.local/zero:v1"] {
        let answer = tokio::time::timeout(ANSWER_WITHIN, call(&mut client, ensure(image, IF_NOT_PRESENT)))
            .await
            .unwrap_or_else(|_| {
                panic!("{image}: no answer within {ANSWER_WITHIN:?}: a blocked read\n{}", daemon.log_text())
            })
            .unwrap_or_else(|status| panic!("{image}: {status:?}"));
        // The record is lost: the image is verified (this pod, with no credentials, pulls it), never
        // taken for one preloaded.
        assert!(answer.pulled, "{image}: {answer:?}");
    }
    let quarantined = tokio::task::spawn_blocking(move || {
        metric_with_label(port, "cri_imaged_state_files_quarantined_total", r#"file="record""#)
    })
    .await
    .expect("metrics");
    assert_eq!(quarantined, 2.0);
    let log = daemon.log_text();
    assert!(log.contains("state file is a FIFO, not a regular file; quarantined"), "{log}");
    assert!(log.contains("state file is a symbolic link, not a regular file; quarantined"), "{log}");
    let aside = std::fs::read_dir(&pulled).expect("lists").filter_map(Result::ok);
    assert_eq!(aside.filter(|entry| entry.file_name().to_string_lossy().ends_with(".quarantined")).count(), 2);
}

#[tokio::test]
async fn an_ages_file_that_is_a_fifo_is_set_aside_and_image_gc_answers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let service = FakeImageService::default();
    service.add_image("registry.local/app:v1", "sha256:app", 1);
    let runtime = FakeRuntime::start_for_gc(&dir.path().join("runtime.sock"), service);
    let ages_dir = dir.path().join("root/image_gc");
    std::fs::create_dir_all(&ages_dir).expect("ages dir");
    mkfifo(&ages_dir.join(StateDir::file_name("image-ages")));
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &runtime.socket, &[]).await;

    let mut client = ImageManagerClient::new(unix_channel(&daemon.socket));
    let request = GarbageCollectRequest { dry_run: true, delete_unused: true };
    let answer = tokio::time::timeout(ANSWER_WITHIN, client.garbage_collect(request))
        .await
        .unwrap_or_else(|_| panic!("no answer within {ANSWER_WITHIN:?}: a blocked read\n{}", daemon.log_text()))
        .expect("GarbageCollect answers")
        .into_inner();
    assert!(answer.images.is_empty(), "the image, detected just now, is too young to go: {answer:?}");
    assert!(daemon.log_text().contains("state file is a FIFO, not a regular file; quarantined"));
}
