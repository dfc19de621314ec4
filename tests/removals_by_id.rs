//! What cri-imaged removes itself (image GC, an image whose tag moved during its pull) it removes
//! by image id and then checks it is gone: CRI-O answers OK to a removal by `repo@digest` and
//! removes nothing. Against a scripted runtime that removes as CRI-O does, or not at all.

mod support;

use std::time::Duration;

use cri_imaged::{
    api::{GarbageCollectRequest, image_manager_client::ImageManagerClient},
    runtime::{CriClient, ImageRuntime, RuntimeEndpoint, RuntimeError},
};
use support::{
    fake_runtime::{FakeImageService, FakeRuntime},
    process::DaemonProcess,
    unix_channel,
};

const ID: &str = "sha256:5eed";
const BY_DIGEST: &str = "registry.example/app@sha256:1111111111111111111111111111111111111111111111111111111111111111";
const BY_TAG: &str = "registry.example/app:v1";

/// A runtime holding one image under a tag and a digest, removing as CRI-O does.
fn crio_like(dir: &tempfile::TempDir) -> (FakeRuntime, CriClient) {
    let runtime = FakeRuntime::start_for_gc(&dir.path().join("runtime.sock"), FakeImageService::default());
    for name in [BY_TAG, BY_DIGEST] {
        runtime.service.add_image(name, ID, 4096);
    }
    runtime.service.script.lock().unwrap().removes_by_id_only = true;
    let endpoint = RuntimeEndpoint::parse(runtime.socket.to_str().expect("UTF-8")).expect("endpoint");
    let client = CriClient::new(&endpoint, Duration::from_secs(5));
    (runtime, client)
}

fn removals_asked(runtime: &FakeRuntime) -> Vec<String> {
    runtime.service.script.lock().unwrap().removals.iter().map(|spec| spec.image.clone()).collect()
}

#[tokio::test]
async fn an_image_named_by_its_digest_is_removed_by_its_id_and_is_gone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (runtime, client) = crio_like(&dir);
    client.remove_image(BY_DIGEST, "").await.expect("removed");
    assert_eq!(removals_asked(&runtime), [ID], "asked by id, never by repo@digest");
    assert!(runtime.service.script.lock().unwrap().images.is_empty(), "every name of the image is gone");
}

#[tokio::test]
async fn a_removal_answered_ok_that_left_the_image_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (runtime, client) = crio_like(&dir);
    runtime.service.script.lock().unwrap().removals_ignored = true;
    let error = client.remove_image(ID, "").await.expect_err("the image is still there");
    assert!(matches!(&error, RuntimeError::NotRemoved(id) if id == ID), "{error}");
    assert_eq!(error.to_string(), format!("image {ID} is still present after the runtime answered its removal"));
}

#[tokio::test]
async fn an_image_already_gone_needs_no_removal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (runtime, client) = crio_like(&dir);
    client.remove_image("registry.example/gone:v1", "").await.expect("nothing to remove");
    assert!(removals_asked(&runtime).is_empty());
}

#[tokio::test]
async fn image_gc_on_a_crio_like_runtime_removes_by_id_and_reports_a_removal_that_did_not_happen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (runtime, _) = crio_like(&dir);
    let flags = ["--minimum-image-ttl-duration", "0s"];
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &runtime.socket, &flags).await;
    let mut client = ImageManagerClient::new(unix_channel(&daemon.socket));
    let request = GarbageCollectRequest { dry_run: false, delete_unused: true };

    runtime.service.script.lock().unwrap().removals_ignored = true;
    let pass = client.garbage_collect(request).await.expect("GarbageCollect answers").into_inner();
    let [image] = pass.images.as_slice() else { panic!("one image chosen: {pass:?}") };
    assert!(!image.removed);
    assert!(image.error.contains("still present after the runtime answered its removal"), "{}", image.error);

    runtime.service.script.lock().unwrap().removals_ignored = false;
    let pass = client.garbage_collect(request).await.expect("GarbageCollect answers").into_inner();
    let [image] = pass.images.as_slice() else { panic!("one image chosen: {pass:?}") };
    assert!(image.removed, "{}", image.error);
    assert!(removals_asked(&runtime).iter().all(|asked| asked == ID), "{:?}", removals_asked(&runtime));
    assert!(runtime.service.script.lock().unwrap().images.is_empty());
}
