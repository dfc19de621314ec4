//! KEP-2535 end to end ("ensure secret pulled images"): the real binary and a real containerd
//! pulling from a loopback registry that only alice and bob may use. Once one pod has pulled a
//! private image with its secret, the image is on the node; these tests say which other pods may
//! then use it without pulling, what the records on disk say, and that they survive a restart
//! and `kill -9` at any moment.
//!
//! Every daemon gets its own `--root-dir`, working directory and `$HOME`; a daemon restarted on the
//! same directory finds the records its predecessor wrote.

mod support;

use std::{
    collections::BTreeMap,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    time::Duration,
};

use cri_imaged::api::{EnsureImageExistsResponse, PullPolicy, image_manager_client::ImageManagerClient};
use cri_imaged::cri::{
    AuthConfig, ImageSpec, ImageStatusRequest, PullImageRequest, RemoveImageRequest,
    image_service_client::ImageServiceClient,
};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use support::{
    call,
    private::{ALICE, BOB, Private, for_pod, private_registry},
    process::{DaemonProcess, metric, metric_with_label, metrics_listen},
    reason, unix_channel,
};
use tokio::time::Instant;
use tonic::{Code, Status, transport::Channel};

const IF_NOT_PRESENT: i32 = PullPolicy::IfNotPresent as i32;
const ALWAYS: i32 = PullPolicy::Always as i32;
const NEVER: i32 = PullPolicy::Never as i32;

const POLICY: &str = "--image-pull-credentials-verification-policy";

const CHECKS: &str = "cri_imaged_imagemanager_image_mustpull_checks_total";
const RECORDS_ON_DISK: &str = "cri_imaged_imagemanager_ondisk_pulledrecords";
const INTENTS_ON_DISK: &str = "cri_imaged_imagemanager_ondisk_pullintents";

impl Private {
    /// containerd's own CRI image service, behind cri-imaged's back.
    fn containerd(&self) -> ImageServiceClient<Channel> {
        ImageServiceClient::new(unix_channel(&self.stack.containerd_socket))
    }
}

fn assert_pulled(response: &EnsureImageExistsResponse, image: &str) {
    assert!(response.pulled, "{image} should have been pulled: {response:?}");
    assert!(response.image_ref.starts_with("sha256:"), "containerd's image id: {response:?}");
    assert!(response.message.starts_with(&format!("Successfully pulled image {image:?} in ")), "{response:?}");
}

/// The pod may use the present image `image_ref` as it is.
fn assert_used_as_present(response: &EnsureImageExistsResponse, image: &str, image_ref: &str) {
    assert!(!response.pulled, "{image} should not have been pulled: {response:?}");
    assert_eq!(response.image_ref, image_ref, "{response:?}");
    assert_eq!(
        response.message,
        format!("Container image {image:?} already present on machine and can be accessed by the pod")
    );
}

/// The pod had to pull the image itself, and the registry refused it: ErrImagePull with the
/// registry's 401, and no image ref.
fn assert_unauthorized(status: &Status) {
    assert_eq!((status.code(), reason(status).as_str()), (Code::Unknown, "ErrImagePull"), "{status:?}");
    assert!(support::refused_as_unauthorized(status.message()), "{}", status.message());
}

/// Exactly what a pod asking with `Never` hears of an absent image.
fn assert_never_pull_answer(status: &Status, image: &str) {
    assert_eq!((status.code(), reason(status).as_str()), (Code::FailedPrecondition, "ErrImageNeverPull"));
    assert_eq!(status.message(), format!("Container image {image:?} is not present with pull policy of Never"));
}

/// The value of the check counter for `result`, read from the daemon's `/metrics`.
async fn checks(port: u16, result: &'static str) -> f64 {
    let label = format!("result=\"{result}\"");
    tokio::task::spawn_blocking(move || metric_with_label(port, CHECKS, &label)).await.expect("metrics")
}

async fn gauge(port: u16, name: &'static str) -> f64 {
    tokio::task::spawn_blocking(move || metric(port, name)).await.expect("metrics")
}

/// An `ImagePulledRecord` file, decoded strictly (an unknown field is an error).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RecordFile {
    kind: String,
    api_version: String,
    last_updated_time: String,
    image_ref: String,
    #[serde(default)]
    credential_mapping: BTreeMap<String, CredentialsFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CredentialsFile {
    #[serde(default)]
    kubernetes_secrets: Vec<SecretFile>,
    #[serde(default)]
    node_pods_accessible: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SecretFile {
    uid: String,
    namespace: String,
    name: String,
    credential_hash: String,
}

/// An `ImagePullIntent` file, decoded strictly.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct IntentFile {
    kind: String,
    api_version: String,
    image: String,
}

const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";

/// The kubelet's name for the file of `key`: `sha256-` and the hex SHA-256 of the key.
fn file_name(key: &str) -> String {
    format!("sha256-{:x}", Sha256::digest(key.as_bytes()))
}

/// Decodes a record file named `name`: an `ImagePulledRecord` of v1beta1, named after its ref.
fn decode_record(name: &str, bytes: &[u8]) -> Result<RecordFile, String> {
    let record: RecordFile = serde_json::from_slice(bytes).map_err(|error| error.to_string())?;
    let updated = &record.last_updated_time;
    let well_formed = record.kind == "ImagePulledRecord"
        && record.api_version == API_VERSION
        && record.image_ref.starts_with("sha256:")
        && updated.len() == 20
        && updated.ends_with('Z')
        && name == file_name(&record.image_ref);
    if well_formed { Ok(record) } else { Err(format!("not a well-formed ImagePulledRecord: {record:?}")) }
}

/// Decodes an intent file named `name`: an `ImagePullIntent` of v1beta1, named after its image.
fn decode_intent(name: &str, bytes: &[u8]) -> Result<IntentFile, String> {
    let intent: IntentFile = serde_json::from_slice(bytes).map_err(|error| error.to_string())?;
    let well_formed =
        intent.kind == "ImagePullIntent" && intent.api_version == API_VERSION && name == file_name(&intent.image);
    if well_formed { Ok(intent) } else { Err(format!("not a well-formed ImagePullIntent: {intent:?}")) }
}

/// `ROOT/image_manager/{pulled,pulling}` of a daemon.
struct RecordDirs {
    pulled: PathBuf,
    pulling: PathBuf,
}

/// What the record directories hold: every file decoded, temporary ones counted.
#[derive(Debug, Default)]
struct OnDisk {
    records: Vec<RecordFile>,
    intents: Vec<IntentFile>,
    temporary: Vec<String>,
}

impl RecordDirs {
    fn of(root: &Path) -> Self {
        let base = root.join("image_manager");
        Self { pulled: base.join("pulled"), pulling: base.join("pulling") }
    }

    /// The record of `image_ref`; panics when there is none or it does not decode.
    fn record(&self, image_ref: &str) -> RecordFile {
        let name = file_name(image_ref);
        let bytes = std::fs::read(self.pulled.join(&name)).unwrap_or_else(|error| panic!("record {name}: {error}"));
        decode_record(&name, &bytes).unwrap_or_else(|error| panic!("record {name}: {error}"))
    }

    /// Every file, read and decoded; panics naming the first that does not decode. Files ending
    /// in `.tmp` (writes a crash interrupted) are only counted; files a running daemon removes
    /// meanwhile are passed over.
    fn read(&self) -> OnDisk {
        let mut on_disk = OnDisk::default();
        for (dir, is_record) in [(&self.pulled, true), (&self.pulling, false)] {
            let Ok(entries) = std::fs::read_dir(dir) else { continue };
            for entry in entries {
                let entry = entry.expect("dir entry");
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.ends_with(".tmp") {
                    on_disk.temporary.push(name);
                    continue;
                }
                let bytes = match std::fs::read(entry.path()) {
                    Ok(bytes) => bytes,
                    // Removed since it was listed, by a daemon still running.
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(error) => panic!("{}: {error}", entry.path().display()),
                };
                let shown = || format!("{}: {:?}", entry.path().display(), String::from_utf8_lossy(&bytes));
                if is_record {
                    let record = decode_record(&name, &bytes).unwrap_or_else(|error| panic!("{error}\n{}", shown()));
                    on_disk.records.push(record);
                } else {
                    let intent = decode_intent(&name, &bytes).unwrap_or_else(|error| panic!("{error}\n{}", shown()));
                    on_disk.intents.push(intent);
                }
            }
        }
        on_disk
    }
}

/// The modification time given to the temporary files a crash left, to tell them from those a
/// running daemon writes.
fn crash_leftover_time() -> std::time::SystemTime {
    std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000)
}

impl RecordDirs {
    /// After a crash: marks every temporary file it left (see [`crash_leftover_time`]), and adds
    /// a torn one to each directory, as a crash in the middle of writing leaves; returns how many
    /// the crash itself left.
    fn mark_crash_leftovers(&self, round: usize) -> usize {
        let mut left = 0;
        for dir in [&self.pulled, &self.pulling] {
            let torn = dir.join(format!("{}.tmp", file_name(&format!("torn-{round}"))));
            std::fs::write(&torn, br#"{"kind":"ImagePulledRecord","apiVersion":"kubelet.con"#).expect("a torn file");
            for entry in std::fs::read_dir(dir).expect("list a record dir") {
                let path = entry.expect("dir entry").path();
                if path.to_string_lossy().ends_with(".tmp") {
                    left += usize::from(path != torn);
                    let file = std::fs::File::options().write(true).open(&path).expect("open a temporary file");
                    file.set_modified(crash_leftover_time()).expect("mark it");
                }
            }
        }
        left
    }

    /// The temporary files marked by [`RecordDirs::mark_crash_leftovers`] that are still there.
    fn crash_leftovers(&self) -> Vec<PathBuf> {
        let mut left = Vec::new();
        for dir in [&self.pulled, &self.pulling] {
            for entry in std::fs::read_dir(dir).expect("list a record dir") {
                let entry = entry.expect("dir entry");
                let modified = entry.metadata().and_then(|metadata| metadata.modified());
                if entry.file_name().to_string_lossy().ends_with(".tmp")
                    && modified.is_ok_and(|modified| modified == crash_leftover_time())
                {
                    left.push(entry.path());
                }
            }
        }
        left
    }
}

/// The secrets (name, uid) a record lists for `repository`.
fn secret_names(record: &RecordFile, repository: &str) -> Vec<(String, String)> {
    let recorded = record.credential_mapping.get(repository);
    recorded.map_or_else(Vec::new, |recorded| {
        recorded.kubernetes_secrets.iter().map(|secret| (secret.name.clone(), secret.uid.clone())).collect()
    })
}

fn names(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(name, uid)| ((*name).to_owned(), (*uid).to_owned())).collect()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).expect("metadata").permissions().mode() & 0o777
}

#[tokio::test]
async fn always_verify_a_present_private_image_is_only_for_pods_holding_a_credential_that_pulled_it() {
    let Some(p) = private_registry() else { return };
    let image = p.seed("private/app:v1");
    let repository = p.stack.image("private/app");
    let dir = p.daemon_dir("d");
    let (port, listen) = metrics_listen();
    let (_daemon, mut client) = p.daemon(&dir, &[POLICY, "AlwaysVerify", "--metrics-listen", &listen]).await;

    // Pod A pulls the image with alice's secret.
    let a = call(&mut client, for_pod("a", &image, vec![p.secret("regcred-a", ALICE)], IF_NOT_PRESENT))
        .await
        .expect("A pulls with alice's secret");
    assert_pulled(&a, &image);
    assert_eq!(p.stack.auth_attempts("private/app"), ["ok alice"]);
    assert_eq!(p.stack.runtime_pulls(&image), 1);

    // Pod B has no secret: the image is on the node, but B must pull it itself, anonymously, and
    // the registry refuses.
    let (resolutions, refused) =
        (p.stack.manifest_resolutions("private/app", "v1"), p.stack.refused_resolutions("private/app", "v1"));
    let b = call(&mut client, for_pod("b", &image, vec![], IF_NOT_PRESENT)).await.expect_err("B is not given it");
    assert_unauthorized(&b);
    assert!(b.message().contains(&format!("failed to pull and unpack image {image:?}")), "{}", b.message());
    assert_eq!(p.stack.runtime_pulls(&image), 2, "B's own pull went to containerd");
    assert_eq!(p.stack.manifest_resolutions("private/app", "v1"), resolutions + 1, "one request for B");
    assert_eq!(p.stack.refused_resolutions("private/app", "v1"), refused + 1, "anonymous, refused with 401");
    assert_eq!(p.stack.successful_resolutions("private/app", "v1"), 1, "only A's");
    assert_eq!(p.stack.auth_attempts("private/app"), ["ok alice"], "B made no login");

    // Pod C has its own secret (another name and uid) holding alice's credential: allowed with
    // no pull and no request to the registry, and remembered in the record.
    let registry_requests = p.stack.manifest_requests("private/app");
    let c = call(&mut client, for_pod("c", &image, vec![p.secret("regcred-c", ALICE)], IF_NOT_PRESENT))
        .await
        .expect("C holds alice's credential");
    assert_used_as_present(&c, &image, &a.image_ref);
    assert_eq!(p.stack.runtime_pulls(&image), 2, "no pull for C");
    assert_eq!(p.stack.manifest_requests("private/app"), registry_requests, "no registry request for C");

    let dirs = RecordDirs::of(&dir.join("root"));
    let record = dirs.record(&a.image_ref);
    assert_eq!(record.image_ref, a.image_ref);
    assert_eq!(record.credential_mapping.keys().collect::<Vec<_>>(), [&repository], "by the normalised name");
    let recorded = &record.credential_mapping[&repository];
    assert!(!recorded.node_pods_accessible, "pulled with a secret, not for every pod: {record:?}");
    assert_eq!(
        secret_names(&record, &repository),
        names(&[("regcred-a", "uid-regcred-a"), ("regcred-c", "uid-regcred-c")]),
        "both secrets, sorted"
    );
    let [first, second] = &recorded.kubernetes_secrets[..] else { unreachable!("two secrets") };
    assert!(first.namespace == "default" && second.namespace == "default", "{record:?}");
    assert_eq!(first.credential_hash.len(), 64, "a SHA-256: {record:?}");
    assert_eq!(first.credential_hash, second.credential_hash, "the same credential, the same hash");

    // B again, now with Never: exactly what it would hear if the image were absent, and no pull.
    let b_never = call(&mut client, for_pod("b", &image, vec![], NEVER)).await.expect_err("B under Never");
    assert_never_pull_answer(&b_never, &image);
    assert_eq!(p.stack.runtime_pulls(&image), 2);

    // Each check counted under its result: B twice, C once, and nothing allowed by the policy.
    assert_eq!(checks(port, "mustAuthenticate").await, 2.0);
    assert_eq!(checks(port, "credentialRecordFound").await, 1.0);
    assert_eq!(checks(port, "credentialPolicyAllowed").await, 0.0);
    assert_eq!(checks(port, "error").await, 0.0);
    assert_eq!(gauge(port, RECORDS_ON_DISK).await, 1.0);
    assert_eq!(gauge(port, INTENTS_ON_DISK).await, 0.0, "B's failed pull left no intent");
    let on_disk = dirs.read();
    assert_eq!((on_disk.records.len(), on_disk.intents.len(), on_disk.temporary.len()), (1, 0, 0));
}

#[tokio::test]
async fn never_verify_any_pod_uses_a_present_private_image_without_a_pull() {
    let Some(p) = private_registry() else { return };
    let image = p.seed("private/app:v1");
    let dir = p.daemon_dir("d");
    let (port, listen) = metrics_listen();
    let (_daemon, mut client) = p.daemon(&dir, &[POLICY, "NeverVerify", "--metrics-listen", &listen]).await;

    let a = call(&mut client, for_pod("a", &image, vec![p.secret("regcred-a", ALICE)], IF_NOT_PRESENT))
        .await
        .expect("A pulls with alice's secret");
    assert_pulled(&a, &image);
    let registry_requests = p.stack.manifest_requests("private/app");

    for policy in [IF_NOT_PRESENT, NEVER] {
        let b = call(&mut client, for_pod("b", &image, vec![], policy)).await.expect("B may use it");
        assert_used_as_present(&b, &image, &a.image_ref);
    }
    assert_eq!(p.stack.runtime_pulls(&image), 1, "only A's pull");
    assert_eq!(p.stack.manifest_requests("private/app"), registry_requests, "no registry request for B");

    assert_eq!(checks(port, "credentialPolicyAllowed").await, 2.0, "B's two requests, allowed by the policy");
    assert_eq!(checks(port, "mustAuthenticate").await, 0.0);
    assert_eq!(checks(port, "credentialRecordFound").await, 0.0);
    // The pull is recorded all the same, so that a stricter policy later knows who pulled it.
    let record = RecordDirs::of(&dir.join("root")).record(&a.image_ref);
    assert_eq!(secret_names(&record, &p.stack.image("private/app")), names(&[("regcred-a", "uid-regcred-a")]));
}

/// Pulls `image` straight on containerd with `user`'s credentials, as an image preloaded on the
/// node by other means would have been; returns its id.
async fn pull_on_containerd(p: &Private, image: &str, (user, password): (&str, &str)) -> String {
    let request = PullImageRequest {
        image: Some(ImageSpec { image: image.into(), ..Default::default() }),
        auth: Some(AuthConfig { username: user.into(), password: password.into(), ..Default::default() }),
        sandbox_config: None,
    };
    let pulled = p.containerd().pull_image(request).await.expect("containerd pulls with alice's credentials");
    let image_ref = pulled.into_inner().image_ref;
    assert!(image_ref.starts_with("sha256:"), "{image_ref}");
    image_ref
}

#[tokio::test]
async fn an_image_preloaded_behind_cri_imageds_back_is_for_every_pod_unless_the_policy_verifies_all() {
    let Some(p) = private_registry() else { return };
    let image = p.seed("preloaded/app:v1");
    let image_ref = pull_on_containerd(&p, &image, ALICE).await;
    assert_eq!(p.stack.auth_attempts("preloaded/app"), ["ok alice"]);

    // The default, NeverVerifyPreloadedImages: cri-imaged did not pull it, so it is not verified.
    let default_dir = p.daemon_dir("default");
    let (daemon, mut client) = p.daemon(&default_dir, &[]).await;
    for policy in [IF_NOT_PRESENT, NEVER] {
        let response = call(&mut client, for_pod("b", &image, vec![], policy)).await.expect("preloaded: allowed");
        assert_used_as_present(&response, &image, &image_ref);
    }
    assert_eq!(p.stack.runtime_pulls(&image), 1, "only the pull behind cri-imaged's back");
    let on_disk = RecordDirs::of(&default_dir.join("root")).read();
    assert_eq!((on_disk.records.len(), on_disk.intents.len()), (0, 0), "cri-imaged has no record of it");
    let (exit, log) = daemon.terminate().await;
    assert!(exit.success(), "{log}");

    // AlwaysVerify: the same image, the same pod, and now the pod must pull it itself.
    let strict_dir = p.daemon_dir("strict");
    let (_daemon, mut client) = p.daemon(&strict_dir, &[POLICY, "AlwaysVerify"]).await;
    let status = call(&mut client, for_pod("b", &image, vec![], IF_NOT_PRESENT)).await.expect_err("verified");
    assert_unauthorized(&status);
    assert_eq!(p.stack.runtime_pulls(&image), 2, "B's own pull");
    let never = call(&mut client, for_pod("b", &image, vec![], NEVER)).await.expect_err("verified under Never");
    assert_never_pull_answer(&never, &image);
    // A pod with alice's secret proves it by pulling (there is no record yet to find it in).
    let a = call(&mut client, for_pod("a", &image, vec![p.secret("regcred-a", ALICE)], IF_NOT_PRESENT))
        .await
        .expect("alice's secret pulls");
    assert_pulled(&a, &image);
    assert_eq!(a.image_ref, image_ref);
    assert_eq!(p.stack.runtime_pulls(&image), 3);
}

#[tokio::test]
async fn once_cri_imaged_has_pulled_a_preloaded_image_it_is_verified_under_the_default_policy() {
    let Some(p) = private_registry() else { return };
    let image = p.seed("preloaded/app:v1");
    let image_ref = pull_on_containerd(&p, &image, ALICE).await;
    let dir = p.daemon_dir("d");
    let (_daemon, mut client) = p.daemon(&dir, &[]).await;
    let before = call(&mut client, for_pod("b", &image, vec![], IF_NOT_PRESENT)).await.expect("preloaded");
    assert_used_as_present(&before, &image, &image_ref);

    // Pod A pulls it again through cri-imaged (policy Always) with alice's secret: now there is a
    // record, and B, without a secret, must pull it itself.
    let always = for_pod("a", &image, vec![p.secret("regcred-a", ALICE)], ALWAYS);
    assert_pulled(&call(&mut client, always).await.expect("A pulls"), &image);
    let status = call(&mut client, for_pod("b2", &image, vec![], IF_NOT_PRESENT)).await.expect_err("verified now");
    assert_unauthorized(&status);
    let record = RecordDirs::of(&dir.join("root")).record(&image_ref);
    assert_eq!(secret_names(&record, &p.stack.image("preloaded/app")), names(&[("regcred-a", "uid-regcred-a")]));
}

/// Puts something that is no regular file where the file at `path` was.
fn replace_by_no_regular_file(kind: &str, path: &Path) {
    std::fs::remove_file(path).expect("the record was there");
    match kind {
        "symlink" => {
            let elsewhere = path.parent().and_then(Path::parent).expect("image_manager").join("elsewhere");
            std::fs::write(&elsewhere, b"{}").expect("written");
            std::os::unix::fs::symlink(&elsewhere, path).expect("linked");
        }
        "directory" => std::fs::create_dir(path).expect("created"),
        "fifo" => assert!(std::process::Command::new("mkfifo").arg(path).status().expect("mkfifo runs").success()),
        "/dev/zero" => std::os::unix::fs::symlink("/dev/zero", path).expect("linked"),
        other => panic!("no such kind {other}"),
    }
}

#[tokio::test]
async fn a_record_replaced_by_a_link_a_directory_a_fifo_or_dev_zero_fails_closed_after_a_restart() {
    let Some(p) = private_registry() else { return };
    let image = p.seed("private/app:v1");
    // A root dir of its own for each kind: one kind's file set aside is not another's proof.
    for kind in ["symlink", "directory", "fifo", "/dev/zero"] {
        let dir = p.daemon_dir(&kind.replace('/', ""));
        let record_file = |image_ref: &str| RecordDirs::of(&dir.join("root")).pulled.join(file_name(image_ref));
        // The default policy, under which an image without a record counts as preloaded.
        let (daemon, mut client) = p.daemon(&dir, &[]).await;
        // Always: a daemon of its own finds the image already on the node, and pulls to record it.
        let a =
            call(&mut client, for_pod("a", &image, vec![p.secret("regcred-a", ALICE)], ALWAYS)).await.expect("A pulls");
        assert_pulled(&a, &image);
        let (exit, log) = daemon.terminate().await;
        assert!(exit.success(), "{log}");
        replace_by_no_regular_file(kind, &record_file(&a.image_ref));

        let (daemon, mut client) = p.daemon(&dir, &[]).await;
        for policy in [IF_NOT_PRESENT, NEVER] {
            let status = match call(&mut client, for_pod("b", &image, vec![], policy)).await {
                Ok(answer) => panic!("{kind}: a pod with no secret was given the image: {answer:?}"),
                Err(status) => status,
            };
            if policy == NEVER {
                assert_never_pull_answer(&status, &image);
            } else {
                assert_unauthorized(&status);
            }
        }
        let (exit, log) = daemon.terminate().await;
        assert!(exit.success(), "{log}");
        assert!(log.contains("quarantined"), "{kind}: the record was set aside, saying so:\n{log}");
    }
}

#[tokio::test]
async fn records_outlive_a_restart_and_keep_every_decision() {
    let Some(p) = private_registry() else { return };
    let image = p.seed("private/app:v1");
    let repository = p.stack.image("private/app");
    let dir = p.daemon_dir("d");
    // The default policy: the record alone says that cri-imaged pulled this image.
    let (daemon, mut client) = p.daemon(&dir, &[]).await;
    let a = call(&mut client, for_pod("a", &image, vec![p.secret("regcred-a", ALICE)], IF_NOT_PRESENT))
        .await
        .expect("A pulls");
    assert_pulled(&a, &image);
    let c = call(&mut client, for_pod("c", &image, vec![p.secret("regcred-c", ALICE)], IF_NOT_PRESENT))
        .await
        .expect("C holds alice's credential");
    assert_used_as_present(&c, &image, &a.image_ref);
    let b = call(&mut client, for_pod("b", &image, vec![], IF_NOT_PRESENT)).await.expect_err("B has no secret");
    assert_unauthorized(&b);
    let (exit, log) = daemon.terminate().await;
    assert!(exit.success(), "{log}");

    // On disk: one record, the kubelet's file, private to root; no intent left.
    let root = dir.join("root");
    let dirs = RecordDirs::of(&root);
    let on_disk = dirs.read();
    assert_eq!((on_disk.records.len(), on_disk.intents.len(), on_disk.temporary.len()), (1, 0, 0), "{on_disk:?}");
    let record = &on_disk.records[0];
    assert_eq!((record.kind.as_str(), record.api_version.as_str()), ("ImagePulledRecord", API_VERSION));
    assert_eq!(record.image_ref, a.image_ref);
    let expected = names(&[("regcred-a", "uid-regcred-a"), ("regcred-c", "uid-regcred-c")]);
    assert_eq!(secret_names(record, &repository), expected);
    let file = dirs.pulled.join(file_name(&a.image_ref));
    let raw: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).expect("read")).expect("JSON");
    assert_eq!(raw["kind"], "ImagePulledRecord");
    assert_eq!(raw["apiVersion"], API_VERSION);
    assert_eq!(raw["imageRef"], a.image_ref.as_str());
    for private in [root.join("image_manager"), dirs.pulled.clone(), dirs.pulling.clone()] {
        assert_eq!(mode(&private), 0o700, "{}", private.display());
    }
    assert_eq!(mode(&file), 0o600);

    // Started again on the same root dir: the same answers.
    let (_daemon, mut client) = p.daemon(&dir, &[]).await;
    let pulls = p.stack.runtime_pulls(&image);
    let registry_requests = p.stack.manifest_requests("private/app");
    let c = call(&mut client, for_pod("c", &image, vec![p.secret("regcred-c", ALICE)], IF_NOT_PRESENT))
        .await
        .expect("C is still allowed");
    assert_used_as_present(&c, &image, &a.image_ref);
    assert_eq!(
        (p.stack.runtime_pulls(&image), p.stack.manifest_requests("private/app")),
        (pulls, registry_requests),
        "C is allowed from the record: no pull, no registry request"
    );
    let b_never = call(&mut client, for_pod("b", &image, vec![], NEVER)).await.expect_err("B under Never");
    assert_never_pull_answer(&b_never, &image);
    let b = call(&mut client, for_pod("b", &image, vec![], IF_NOT_PRESENT)).await.expect_err("B is still refused");
    assert_unauthorized(&b);
    assert_eq!(p.stack.runtime_pulls(&image), pulls + 1, "B had to pull it itself");

    // Bob's credential is not recorded: his pod proves it by pulling, and is added.
    let d = call(&mut client, for_pod("d", &image, vec![p.secret("regcred-bob", BOB)], IF_NOT_PRESENT))
        .await
        .expect("bob's secret pulls");
    assert_pulled(&d, &image);
    assert_eq!(d.image_ref, a.image_ref);
    assert_eq!(p.stack.auth_attempts("private/app"), ["ok alice", "ok bob"]);
    let record = dirs.record(&a.image_ref);
    let expected =
        names(&[("regcred-a", "uid-regcred-a"), ("regcred-bob", "uid-regcred-bob"), ("regcred-c", "uid-regcred-c")]);
    assert_eq!(secret_names(&record, &repository), expected);
}

/// A deterministic pseudo-random schedule: a 64-bit LCG (Knuth's MMIX constants).
struct Schedule(u64);

impl Schedule {
    /// The next fraction in [0, 1).
    fn next_fraction(&mut self) -> f64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Whether containerd has `image`.
async fn present(containerd: &mut ImageServiceClient<Channel>, image: &str) -> bool {
    let request =
        ImageStatusRequest { image: Some(ImageSpec { image: image.into(), ..Default::default() }), verbose: false };
    containerd.image_status(request).await.expect("containerd's image status").into_inner().image.is_some()
}

/// Removes `image` straight on containerd, behind cri-imaged's back.
async fn remove(containerd: &mut ImageServiceClient<Channel>, image: &str) {
    let request = RemoveImageRequest { image: Some(ImageSpec { image: image.into(), ..Default::default() }) };
    containerd.remove_image(request).await.expect("containerd removes the image");
}

type Answer = Result<EnsureImageExistsResponse, Status>;

/// One pod of a herd: its secret's name, the image it asked for, and its answer.
struct HerdPod {
    secret: String,
    image: usize,
    answer: tokio::task::JoinHandle<Answer>,
}

/// Sends, at once, one request per pod: pod `I` of round `round` has its own secret (its own name
/// and uid) holding alice's credential, and asks for `images[I % images.len()]` with IfNotPresent.
fn fire_herd(p: &Private, client: &ImageManagerClient<Channel>, images: &[String], round: usize) -> Vec<HerdPod> {
    (0..HERD)
        .map(|pod| {
            let secret = format!("herd-{round}-{pod}");
            let image = pod % images.len();
            let request =
                for_pod(&format!("pod-{round}-{pod}"), &images[image], vec![p.secret(&secret, ALICE)], IF_NOT_PRESENT);
            let mut client = client.clone();
            let answer = tokio::spawn(async move { call(&mut client, request).await });
            HerdPod { secret, image, answer }
        })
        .collect()
}

/// Pods in a herd.
const HERD: usize = 20;
/// Private images the herds ask for.
const IMAGES: usize = 4;
/// Rounds of start, herd, `kill -9`.
const ROUNDS: usize = 50;
/// Past this many secrets recorded for an image name, a check no longer adds one (the kubelet's
/// bound against unbounded writes).
const WRITE_BACK_LIMIT: usize = 100;

/// For each image containerd has, a pod without credentials asks for it: it must never be given
/// it (it has to pull it itself, and the registry refuses).
async fn assert_no_pod_without_credentials_gets_a_present_image(
    client: &ImageManagerClient<Channel>,
    containerd: &mut ImageServiceClient<Channel>,
    images: &[String],
    (round, label): (usize, &str),
    daemon: &DaemonProcess,
) -> usize {
    let mut checked = 0;
    for (index, image) in images.iter().enumerate() {
        if !present(containerd, image).await {
            continue;
        }
        let request = for_pod(&format!("no-credentials-{round}-{index}"), image, vec![], IF_NOT_PRESENT);
        match call(&mut client.clone(), request).await {
            Ok(response) => panic!(
                "{label}: a pod without credentials was given {image}: {response:?}\nlog:\n{}",
                daemon.log_text()
            ),
            Err(status) => assert_unauthorized(&status),
        }
        checked += 1;
    }
    checked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_at_any_moment_the_daemon_leaves_whole_records_and_no_pod_gets_an_image_unchecked() {
    use std::os::unix::process::ExitStatusExt;
    use tonic_types::StatusExt;

    let Some(p) = private_registry() else { return };
    let images: Vec<String> = (0..IMAGES).map(|index| p.seed(&format!("crash/app{index}:v1"))).collect();
    let repositories: Vec<String> = (0..IMAGES).map(|index| p.stack.image(&format!("crash/app{index}"))).collect();
    let dir = p.daemon_dir("d");
    let dirs = RecordDirs::of(&dir.join("root"));
    let mut containerd = p.containerd();
    let flags = |policy: &'static str| {
        [POLICY, policy, "--registry-qps", "0", "--serialize-image-pulls=false", "--max-parallel-image-pulls", "4"]
    };

    // A herd left to finish: how long one takes on this machine (every image absent, so pulled),
    // so that the kills below land from its start to just past its end.
    let (daemon, client) = p.daemon_logging(&dir, &flags("AlwaysVerify"), "info").await;
    let started = Instant::now();
    for pod in fire_herd(&p, &client, &images, 0) {
        pod.answer.await.expect("task").expect("a pod with alice's credential gets the image");
    }
    let herd_time = started.elapsed();
    let (exit, log) = daemon.terminate().await;
    assert!(exit.success(), "{log}");

    let mut schedule = Schedule(0x2535);
    let (mut answered, mut refusals_checked, mut kills_mid_pull, mut kills_mid_write) = (0, 0, 0, 0);
    let mut secrets_added = false;
    let loop_started = Instant::now();
    for round in 1..=ROUNDS {
        // Half the images go behind the daemon's back while it is down, so that this herd pulls
        // them (intents, pulls, new records) and checks the others (records rewritten).
        for (index, image) in images.iter().enumerate() {
            if (round + index) % 2 == 0 {
                remove(&mut containerd, image).await;
            }
        }
        // AlwaysVerify verifies every present image; under the default policy only a record or an
        // intent says that cri-imaged pulled an image, so what a crash left must say it.
        let policy = if round % 2 == 0 { "AlwaysVerify" } else { "NeverVerifyPreloadedImages" };
        let (mut daemon, client) = p.daemon_logging(&dir, &flags(policy), "info").await;
        let label = format!("round {round} ({policy})");
        // (The daemon may be writing files of its own already: only the crash's are looked for.)
        assert_eq!(dirs.crash_leftovers(), Vec::<PathBuf>::new(), "{label}: serving, yet a crash's files remain");
        refusals_checked += assert_no_pod_without_credentials_gets_a_present_image(
            &client,
            &mut containerd,
            &images,
            (round, &label),
            &daemon,
        )
        .await;

        let herd = fire_herd(&p, &client, &images, round);
        let delay = herd_time.mul_f64(1.25 * schedule.next_fraction());
        tokio::time::sleep(delay).await;
        let exit = daemon.kill_hard();
        assert_eq!(
            exit.signal(),
            Some(9),
            "{label}: the daemon was running until killed: {exit:?}\n{}",
            daemon.log_text()
        );

        // Every file left decodes (`.tmp` ones aside); `read` panics naming any other.
        let on_disk = dirs.read();
        kills_mid_pull += usize::from(!on_disk.intents.is_empty());
        kills_mid_write += usize::from(dirs.mark_crash_leftovers(round) > 0);
        for intent in &on_disk.intents {
            assert!(images.contains(&intent.image), "{label}: an intent for {:?}", intent.image);
        }
        // A pod that was answered is in its image's record on disk: nothing is answered before
        // its record is durable. No pod with alice's credential is refused by the daemon: an
        // error is the kill's (no ErrorInfo from the daemon).
        for pod in herd {
            let answer = pod.answer.await.expect("task");
            let response = match answer {
                Ok(response) => response,
                Err(status) => {
                    let from_daemon = status.get_error_details().error_info().map(|info| info.reason.clone());
                    assert_eq!(from_daemon, None, "{label}: the daemon refused {}: {status:?}", pod.secret);
                    continue;
                }
            };
            answered += 1;
            let record = on_disk.records.iter().find(|record| record.image_ref == response.image_ref);
            let record =
                record.unwrap_or_else(|| panic!("{label}: {} was answered, but no record: {response:?}", pod.secret));
            let listed = secret_names(record, &repositories[pod.image]);
            let is_listed =
                listed.iter().any(|(name, uid)| *name == pod.secret && *uid == format!("uid-{}", pod.secret));
            let at_limit = !response.pulled && listed.len() >= WRITE_BACK_LIMIT;
            assert!(is_listed || at_limit, "{label}: {} was answered but is not in the record: {record:?}", pod.secret);
            secrets_added |= is_listed && !response.pulled;
        }
    }
    let loop_time = loop_started.elapsed();

    // Once more, and left to settle: nothing half-written, no pod without credentials given an
    // image, every pod with alice's credential given each (nothing a crash left locks it out),
    // and the on-disk gauges count the files.
    let (port, listen) = metrics_listen();
    let final_flags = [&flags("AlwaysVerify")[..], &["--metrics-listen", &listen]].concat();
    let (daemon, mut client) = p.daemon_logging(&dir, &final_flags, "info").await;
    assert_eq!(dirs.crash_leftovers(), Vec::<PathBuf>::new(), "after the last restart");
    let last = (ROUNDS + 1, "after the last restart");
    assert_no_pod_without_credentials_gets_a_present_image(&client, &mut containerd, &images, last, &daemon).await;
    for (index, image) in images.iter().enumerate() {
        let request = for_pod(&format!("last-{index}"), image, vec![p.secret("last", ALICE)], IF_NOT_PRESENT);
        let response = call(&mut client, request).await.expect("alice's credential gets every image");
        assert!(response.image_ref.starts_with("sha256:"), "{response:?}");
    }
    let mut counted = (f64::NAN, f64::NAN);
    let mut files = (0, 0);
    for _ in 0..100 {
        let on_disk = dirs.read();
        files = (on_disk.records.len(), on_disk.intents.len());
        counted = (gauge(port, RECORDS_ON_DISK).await, gauge(port, INTENTS_ON_DISK).await);
        if counted == (files.0 as f64, files.1 as f64) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(counted, (files.0 as f64, files.1 as f64), "the gauges count the files on disk");
    let (exit, log) = daemon.terminate().await;
    assert!(exit.success(), "{log}");

    eprintln!(
        "{ROUNDS} kills in {loop_time:.1?} (a whole herd took {herd_time:.0?}): {answered} pods answered before \
         the kill, each found in its record; {kills_mid_pull} kills left an intent, {kills_mid_write} a \
         half-written file; {refusals_checked} refusals of pods without credentials checked after restarts"
    );
    // The schedule did reach into the herds: some kills came mid-pull, some after answers.
    assert!(kills_mid_pull > 0, "no kill came while a pull was under way");
    assert!(answered > 0 && secrets_added, "no kill came after a pod was answered from a record");
}

/// Writes `count` records of images that are not on the node (the kubelet's files, as a node
/// that has pulled many images over time has them), all older than any start.
fn write_old_records(dirs: &RecordDirs, count: usize) {
    std::fs::create_dir_all(&dirs.pulled).expect("mkdir pulled");
    for index in 0..count {
        let image_ref = format!("sha256:{:x}", Sha256::digest(format!("gone-{index}").as_bytes()));
        let record = serde_json::json!({
            "kind": "ImagePulledRecord",
            "apiVersion": API_VERSION,
            "lastUpdatedTime": "2025-01-01T00:00:00Z",
            "imageRef": image_ref,
            "credentialMapping": { "registry.example/gone": { "nodePodsAccessible": true } },
        });
        std::fs::write(dirs.pulled.join(file_name(&image_ref)), record.to_string()).expect("write a record");
    }
}

/// A crash after containerd finished a pull but before its record was written leaves the intent
/// alone; the next start must turn it into a record that verifies every pod. A pod without
/// credentials that asks for the image while the daemon is still reading its records is refused
/// (its own pull fails), and so must be the next one: a failed pull never removes an intent older
/// than the start (this once lost the intent when 3,000 or more records slowed the start down).
#[tokio::test]
async fn an_intent_left_by_a_crash_keeps_verifying_its_image_through_a_failed_pull_at_start_up() {
    let Some(p) = private_registry() else { return };
    let image = p.seed("private/app:v1");
    // The pull that completed on containerd just before the crash, and the intent it left.
    let image_ref = pull_on_containerd(&p, &image, ALICE).await;
    let dir = p.daemon_dir("d");
    let dirs = RecordDirs::of(&dir.join("root"));
    write_old_records(&dirs, 5_000);
    std::fs::create_dir_all(&dirs.pulling).expect("mkdir pulling");
    let intent = serde_json::json!({ "kind": "ImagePullIntent", "apiVersion": API_VERSION, "image": image });
    std::fs::write(dirs.pulling.join(file_name(&image)), intent.to_string()).expect("write the intent");

    let (port, listen) = metrics_listen();
    let (_daemon, mut client) = p.daemon(&dir, &["--metrics-listen", &listen]).await;
    let first = call(&mut client, for_pod("b", &image, vec![], IF_NOT_PRESENT)).await.expect_err("B is refused");
    assert_unauthorized(&first);
    // Start-up settles: the old records pruned, the intent gone.
    for _ in 0..400 {
        if gauge(port, RECORDS_ON_DISK).await <= 1.0 && gauge(port, INTENTS_ON_DISK).await == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(gauge(port, INTENTS_ON_DISK).await, 0.0, "start-up did not settle");

    let second = call(&mut client, for_pod("b2", &image, vec![], IF_NOT_PRESENT)).await;
    assert!(second.is_err(), "a pod without credentials was given the image cri-imaged pulled: {second:?}");
    assert_unauthorized(&second.expect_err("refused"));
    let record = dirs.record(&image_ref);
    assert!(record.credential_mapping.is_empty(), "a record with no credentials: every pod verified: {record:?}");
}

#[tokio::test]
async fn an_image_the_kubelet_pulled_with_a_secret_stays_verified_when_cri_imaged_takes_over() {
    let Some(p) = private_registry() else { return };
    let image = p.seed("adopted/app:v1");
    let repository = p.stack.image("adopted/app");
    let image_ref = pull_on_containerd(&p, &image, ALICE).await;
    // The kubelet's own image manager pulled it for pod A and recorded so, under its root dir.
    let kubelet = p.daemon_dir("kubelet");
    let pulled = kubelet.join("image_manager/pulled");
    std::fs::create_dir_all(&pulled).expect("the kubelet's records");
    let record = format!(
        r#"{{"kind":"ImagePulledRecord","apiVersion":"kubelet.config.k8s.io/v1beta1","lastUpdatedTime":"2026-11-01T00:00:00Z","imageRef":"{image_ref}","credentialMapping":{{"{repository}":{{"kubernetesSecrets":[{{"uid":"uid-regcred-a","namespace":"default","name":"regcred-a","credentialHash":"h"}}]}}}}}}"#
    );
    let kubelets_file = pulled.join(file_name(&image_ref));
    std::fs::write(&kubelets_file, &record).expect("written");

    let dir = p.daemon_dir("d");
    let kubelet_root = kubelet.to_str().expect("utf-8");
    let (_daemon, mut client) = p.daemon(&dir, &["--kubelet-root-dir", kubelet_root]).await;
    // Without the kubelet's record the image would pass for preloaded (see above): B would get it.
    let status = call(&mut client, for_pod("b", &image, vec![], IF_NOT_PRESENT)).await.expect_err("verified");
    assert_unauthorized(&status);
    let ours = RecordDirs::of(&dir.join("root"));
    support::eventually("the kubelet's record adopted", Duration::from_secs(10), || {
        ours.read().records.iter().any(|record| record.image_ref == image_ref)
    })
    .await;
    assert_eq!(secret_names(&ours.record(&image_ref), &repository), names(&[("regcred-a", "uid-regcred-a")]));
    // Adopted: refused by the record now, not only while the records settle.
    let status = call(&mut client, for_pod("b2", &image, vec![], IF_NOT_PRESENT)).await.expect_err("verified");
    assert_unauthorized(&status);
    assert_eq!(std::fs::read_to_string(&kubelets_file).expect("still there"), record, "the kubelet's file untouched");
}
