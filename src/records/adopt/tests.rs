use std::{collections::BTreeMap, path::Path, time::SystemTime};

use super::super::{PullRecords, metrics::RecordsMetrics};
use super::*;
use crate::{files::StateDir, runtime::fake::FakeRuntime};

/// A record as the kubelet 1.35 writes it.
fn kubelet_record(image_ref: &str, mapping: &str) -> String {
    format!(
        r#"{{"kind":"ImagePulledRecord","apiVersion":"kubelet.config.k8s.io/v1beta1","lastUpdatedTime":"2026-01-01T00:00:00Z","imageRef":"{image_ref}"{mapping}}}"#
    )
}

const WITH_SECRET: &str = r#","credentialMapping":{"registry.local/private":{"kubernetesSecrets":[{"uid":"u1","namespace":"ns","name":"s1","credentialHash":"h1"}]}}"#;

/// Every file under `dir`, by path, with its contents.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    for sub in ["pulled", "pulling"] {
        for entry in fs::read_dir(dir.join(sub)).expect("listed") {
            let path = entry.expect("entry").path();
            // A link is its target: reading it would never end (one goes to /dev/zero).
            let contents = match fs::read_link(&path) {
                Ok(target) => target.into_os_string().into_encoded_bytes(),
                Err(_) => fs::read(&path).expect("a file"),
            };
            files.insert(path, contents);
        }
    }
    files
}

#[tokio::test]
async fn the_kubelets_records_of_present_images_are_adopted_and_its_directory_is_left_as_it_was() {
    let (ours, kubelet) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    let (pulled, pulling) = (kubelet.path().join("image_manager/pulled"), kubelet.path().join("image_manager/pulling"));
    fs::create_dir_all(&pulled).expect("pulled");
    fs::create_dir_all(&pulling).expect("pulling");
    let write =
        |dir: &Path, key: &str, text: &str| fs::write(dir.join(StateDir::file_name(key)), text).expect("written");
    write(&pulled, "sha256:private", &kubelet_record("sha256:private", WITH_SECRET));
    write(&pulled, "sha256:unknown", &kubelet_record("sha256:unknown", ""));
    write(&pulled, "sha256:gone", &kubelet_record("sha256:gone", WITH_SECRET));
    write(&pulled, "sha256:garbage", "not a record");
    std::os::unix::fs::symlink("/dev/zero", pulled.join("sha256-endless")).expect("a link");
    let intent = r#"{"kind":"ImagePullIntent","apiVersion":"kubelet.config.k8s.io/v1beta1","image":"registry.local/crashed:v1"}"#;
    write(&pulling, "registry.local/crashed:v1", intent);
    let before = snapshot(&kubelet.path().join("image_manager"));

    let records = Arc::new(PullRecords::open(ours.path(), Arc::new(RecordsMetrics::default())).expect("opens"));
    records.adopt_from(kubelet.path());
    assert!(
        records.pulled_by_cri_imaged("preloaded:v1", "sha256:preloaded").await.expect("readable"),
        "until adopted, every image is verified"
    );
    let runtime = [
        ("registry.local/private:v1", "sha256:private"),
        ("registry.local/unknown:v1", "sha256:unknown"),
        ("registry.local/crashed:v1", "sha256:crashed"),
        ("preloaded:v1", "sha256:preloaded"),
    ]
    .iter()
    .fold(FakeRuntime::default(), |runtime, (name, id)| runtime.with_image(name, id, 1));
    records.clone().settle(&runtime, SystemTime::now()).await;

    let private = records.record("sha256:private").await.expect("readable").expect("adopted");
    let secrets = &private.credential_mapping["registry.local/private"].kubernetes_secrets;
    assert_eq!((secrets[0].name.as_str(), secrets[0].credential_hash.as_str()), ("s1", "h1"));
    for unknown in ["sha256:unknown", "sha256:crashed"] {
        let record = records.record(unknown).await.expect("readable").expect("adopted");
        assert!(
            record.credential_mapping.is_empty(),
            "{unknown}: pulled under unknown credentials, every pod verified"
        );
    }
    assert!(records.record("sha256:gone").await.expect("readable").is_none(), "not present: not adopted");
    assert!(!records.pulled_by_cri_imaged("preloaded:v1", "sha256:preloaded").await.expect("readable"));
    assert_eq!(snapshot(&kubelet.path().join("image_manager")), before, "the kubelet's files as they were");

    // The next start adopts them again: nothing changes.
    let ours_before = snapshot(&ours.path().join("image_manager"));
    let again = Arc::new(PullRecords::open(ours.path(), Arc::new(RecordsMetrics::default())).expect("opens"));
    again.adopt_from(kubelet.path());
    again.clone().settle(&runtime, SystemTime::now()).await;
    assert_eq!(snapshot(&ours.path().join("image_manager")), ours_before);
}

#[tokio::test]
async fn a_kubelet_without_records_adopts_nothing() {
    let (ours, kubelet) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    let records = Arc::new(PullRecords::open(ours.path(), Arc::new(RecordsMetrics::default())).expect("opens"));
    records.adopt_from(kubelet.path());
    let runtime = FakeRuntime::default().with_image("preloaded:v1", "sha256:preloaded", 1);
    assert_eq!(records.adopt(&runtime).await.expect("adopted"), Adopted::default());
    records.clone().settle(&runtime, SystemTime::now()).await;
    assert!(!records.pulled_by_cri_imaged("preloaded:v1", "sha256:preloaded").await.expect("readable"));
}

#[tokio::test]
async fn without_the_kubelets_records_nothing_waits_for_them() {
    let (ours, kubelet) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    fs::create_dir_all(kubelet.path().join("image_manager/pulled")).expect("an empty records dir");
    let records = Arc::new(PullRecords::open(ours.path(), Arc::new(RecordsMetrics::default())).expect("opens"));
    records.adopt_from(kubelet.path());
    // Before anything settled: a preloaded image is not taken for one cri-imaged pulled.
    assert!(!records.pulled_by_cri_imaged("preloaded:v1", "sha256:preloaded").await.expect("readable"));
}
