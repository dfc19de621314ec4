//! Verified signatures kept across restarts (issue 49), on a real containerd and a loopback
//! registry, through the cri-imaged binary, with cosign signing: a signed image verified and
//! pulled, the daemon stopped and started again on the same root dir, and the image, present, is
//! let in from the verification kept on disk without reading its signature again (and listed
//! verified); started again with a changed requirement, the kept verification does not count and
//! the signature is read again.

mod support;

use std::path::Path;

use cri_imaged::api::{ListImagesRequest, image_manager_client::ImageManagerClient};
use serde_json::json;
use support::{
    call,
    cosign::{cosign, key_pair, sign},
    process::{DaemonProcess, metric, metrics_listen},
    stack::LocalStack,
    unix_channel,
};

const IF_NOT_PRESENT: i32 = cri_imaged::api::PullPolicy::IfNotPresent as i32;

/// The daemon with `policy`, its metrics on a port of their own; waits until it read back what
/// was kept.
async fn start(dir: &Path, stack: &LocalStack, policy: &Path) -> (DaemonProcess, u16) {
    let (port, listen) = metrics_listen();
    let flags = ["--signature-policy", policy.to_str().expect("utf-8"), "--metrics-listen", &listen];
    let daemon = DaemonProcess::start(&dir.join("cri-imaged.sock"), &stack.containerd_socket, &flags).await;
    daemon.wait_for_log("verifications read back", |log| log.contains("signature verifications read back")).await;
    (daemon, port)
}

/// EnsureImageExists for a pod in `prod`.
async fn ensure(daemon: &DaemonProcess, image: &str, uid: &str) -> Result<(), tonic::Status> {
    let mut client = ImageManagerClient::new(unix_channel(&daemon.socket));
    let mut request = support::ensure(image, IF_NOT_PRESENT);
    let pod = request.pod.as_mut().expect("pod");
    (pod.namespace, pod.uid) = ("prod".into(), uid.into());
    call(&mut client, request).await.map(|_| ())
}

/// The policies `image`'s digest is listed verified under (ListImages, the VERIFIED column).
async fn listed_verified(daemon: &DaemonProcess, digest: &str) -> Vec<String> {
    let mut client = ImageManagerClient::new(unix_channel(&daemon.socket));
    let images = client.list_images(ListImagesRequest {}).await.expect("ListImages").into_inner().images;
    let verifications = images.into_iter().flat_map(|image| image.verifications);
    verifications.filter(|verified| verified.digest == digest).map(|verified| verified.policy).collect()
}

fn write_policy(path: &Path, scope: &str, keys: &Path, identity: serde_json::Value) {
    let policy = json!({
        "default": [{ "type": "reject" }],
        "transports": { "docker": { scope: [{
            "type": "sigstoreSigned", "keyPath": keys.join("cosign.pub"), "signedIdentity": identity,
        }] } }
    });
    std::fs::write(path, policy.to_string()).expect("policy");
}

#[tokio::test]
async fn a_present_signed_image_is_let_in_after_a_restart_without_reading_its_signature_again() {
    let Some(cosign) = cosign() else { return };
    let Some(stack) = LocalStack::start() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let keys = key_pair(&cosign, &dir.path().join("keys"));
    let digest = stack.seed("kept/app:v1", "kept");
    sign(&cosign, &keys, &format!("{}@{digest}", stack.image("kept/app")));
    let image = stack.image("kept/app:v1");
    let (policy, scope) = (dir.path().join("policy.json"), format!("{}/kept", stack.registry));
    write_policy(&policy, &scope, &keys, json!({ "type": "matchRepository" }));

    // Verified and pulled; the verification written (a second after it).
    let (daemon, port) = start(dir.path(), &stack, &policy).await;
    ensure(&daemon, &image, "first").await.expect("the signed image is pulled");
    assert_eq!(metric(port, "cri_imaged_signature_manifests_fetched_total"), 1.0);
    daemon.wait_for_log("written", |log| log.contains("signature verifications written")).await;
    let (status, log) = daemon.terminate().await;
    assert!(status.success(), "{log}");

    // Restarted on the same root dir: the present image is answered from what was kept.
    let (daemon, port) = start(dir.path(), &stack, &policy).await;
    assert!(daemon.log_text().contains("verified=1"), "{}", daemon.log_text());
    assert_eq!(listed_verified(&daemon, &digest).await, ["default"], "listed verified before any pod asks");
    let (manifests, started) = (stack.manifest_requests("kept/app"), tokio::time::Instant::now());
    ensure(&daemon, &image, "after-restart").await.expect("let in from the verification kept");
    let took = started.elapsed();
    assert_eq!(stack.manifest_requests("kept/app"), manifests, "the registry was not asked");
    assert_eq!(metric(port, "cri_imaged_signature_manifests_fetched_total"), 0.0, "no signature read again");
    assert_eq!(metric(port, "cri_imaged_signature_cache_hits_total"), 1.0);
    assert_eq!(stack.runtime_pulls(&image), 1, "nor the image pulled again");
    eprintln!("after the restart: let in in {took:?} without reading the registry");
    let (status, log) = daemon.terminate().await;
    assert!(status.success(), "{log}");

    // Restarted with a changed requirement (another signedIdentity, which the signature still
    // meets): what was kept does not count, and the signature is read again.
    let identity = json!({ "type": "exactRepository", "dockerRepository": stack.image("kept/app") });
    write_policy(&policy, &scope, &keys, identity);
    let (daemon, port) = start(dir.path(), &stack, &policy).await;
    ensure(&daemon, &image, "changed").await.expect("verified again under the new requirement");
    assert_eq!(metric(port, "cri_imaged_signature_manifests_fetched_total"), 1.0, "read again");
    assert_eq!(metric(port, "cri_imaged_signature_cache_hits_total"), 0.0);
    let (status, log) = daemon.terminate().await;
    assert!(status.success(), "{log}");
}
