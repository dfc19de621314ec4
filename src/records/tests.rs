use std::time::{Duration, SystemTime};

use super::{
    format::{PullCredentials, SecretRecord},
    *,
};
use crate::runtime::fake::FakeRuntime;

fn open(root: &Path) -> Arc<PullRecords> {
    Arc::new(PullRecords::open(root, Arc::new(RecordsMetrics::default())).expect("opens"))
}

fn secret(name: &str) -> PullCredentials {
    let secret = SecretRecord {
        uid: format!("uid-{name}"),
        namespace: "ns".into(),
        name: name.into(),
        credential_hash: "h".into(),
    };
    PullCredentials { kubernetes_secrets: vec![secret], ..Default::default() }
}

fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("dir")
        .map(|entry| entry.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn an_intent_is_on_disk_while_any_pull_of_its_image_runs() {
    let root = tempfile::tempdir().unwrap();
    let records = open(root.path());
    let pulling = root.path().join("image_manager/pulling");
    records.record_intent("registry.local/app:v1").await.expect("recorded");
    records.record_intent("registry.local/app:v1").await.expect("recorded");
    assert_eq!(files(&pulling), [StateDir::file_name("registry.local/app:v1")]);
    assert_eq!(records.pulls_in_flight("registry.local/app:v1"), 2);
    assert!(records.pulled_by_cri_imaged("registry.local/app:v1", "sha256:app").await.expect("readable"));
    assert!(!records.pulled_by_cri_imaged("registry.local/app:v2", "sha256:other").await.expect("readable"));
    records.record_failed("registry.local/app:v1").await.expect("ended");
    assert_eq!(files(&pulling).len(), 1, "one pull still runs");
    records
        .record_pulled("registry.local/app:v1", "sha256:app", "registry.local/app", secret("s"))
        .await
        .expect("ended");
    assert!(files(&pulling).is_empty());
    assert_eq!(records.pulls_in_flight("registry.local/app:v1"), 0);
    let record = records.record("sha256:app").await.expect("readable").expect("recorded");
    assert_eq!(record.credential_mapping["registry.local/app"], secret("s"));
}

#[tokio::test]
async fn records_survive_a_restart_and_a_leftover_intent_survives_as_pulled_by_cri_imaged() {
    let root = tempfile::tempdir().unwrap();
    {
        let records = open(root.path());
        records.record_pulled("app:v1", "sha256:app", "docker.io/library/app", secret("s")).await.expect("written");
        records.record_intent("left:v1").await.expect("written");
        // The daemon dies here, the pull of left:v1 unfinished.
    }
    let records = open(root.path());
    assert!(
        records.pulled_by_cri_imaged("left:v1", "sha256:left").await.expect("readable"),
        "the intent is read at start"
    );
    records.warm().expect("warmed");
    let record = records.record("sha256:app").await.expect("readable").expect("kept");
    assert_eq!(record.credential_mapping["docker.io/library/app"], secret("s"));
    assert!(records.record("sha256:never").await.expect("readable").is_none());
}

#[tokio::test]
async fn a_record_that_does_not_decode_fails_safe_and_is_healed_by_the_next_pull() {
    let root = tempfile::tempdir().unwrap();
    let records = open(root.path());
    let pulled = root.path().join("image_manager/pulled");
    std::fs::write(pulled.join(StateDir::file_name("sha256:torn")), b"{\"kind\":\"ImagePulledRe").expect("written");
    records.warm().expect("warms the rest");
    assert!(records.record("sha256:torn").await.is_err(), "an error, never \"no record\"");
    assert!(records.pulled_by_cri_imaged("torn:v1", "sha256:torn").await.is_err());
    records.record_pulled("torn:v1", "sha256:torn", "docker.io/library/torn", secret("s")).await.expect("rewritten");
    assert!(records.record("sha256:torn").await.expect("readable now").is_some());
}

#[tokio::test]
async fn temporary_files_a_crash_left_are_removed_at_start() {
    let root = tempfile::tempdir().unwrap();
    drop(open(root.path()));
    let pulled = root.path().join("image_manager/pulled");
    std::fs::write(pulled.join(format!("{}.tmp", StateDir::file_name("sha256:x"))), b"half").expect("written");
    let records = open(root.path());
    assert!(files(&pulled).is_empty());
    records.warm().expect("warms");
    assert!(records.record("sha256:x").await.expect("readable").is_none());
}

#[tokio::test]
async fn at_start_torn_and_temporary_files_are_passed_over_others_set_aside_and_every_whole_one_is_read() {
    let root = tempfile::tempdir().unwrap();
    {
        let records = open(root.path());
        records.record_pulled("app:v1", "sha256:app", "docker.io/library/app", secret("s")).await.expect("written");
    }
    let (pulled, pulling) = (root.path().join("image_manager/pulled"), root.path().join("image_manager/pulling"));
    std::fs::write(pulling.join(StateDir::file_name("torn:v1")), b"{\"kind\":\"ImagePullIn").expect("written");
    std::fs::create_dir(pulled.join(StateDir::file_name("sha256:unreadable"))).expect("created");
    for dir in [&pulled, &pulling] {
        std::fs::write(dir.join(format!("{}.4194305.0.tmp", StateDir::file_name("half"))), b"{").expect("written");
    }
    let records = open(root.path());
    records.warm().expect("warms");
    assert!(records.record("sha256:app").await.expect("readable").is_some(), "a whole record is read");
    assert!(records.pulled_by_cri_imaged("torn:v1", "sha256:torn").await.is_err(), "a torn intent's image is verified");
    assert!(records.record("sha256:unreadable").await.is_err(), "no regular file: quarantined, and verified");
    assert!(!pulled.join(StateDir::file_name("sha256:unreadable")).exists(), "moved aside");
    assert!(!records.pulled_by_cri_imaged("other:v1", "sha256:other").await.expect("no file, no error"));
    assert!(files(&pulled).iter().chain(&files(&pulling)).all(|name| !name.ends_with(".tmp")), "removed at start");
}

/// Puts something that is no regular file where the file `name` in `dir` was: each kind an
/// attacker or bad luck could leave.
fn replace_by(kind: &str, dir: &Path, name: &str) {
    let path = dir.join(name);
    std::fs::remove_file(&path).expect("the file was there");
    match kind {
        "symlink" => {
            let elsewhere = dir.join("elsewhere");
            std::fs::write(&elsewhere, b"{}").expect("written");
            std::os::unix::fs::symlink(&elsewhere, &path).expect("linked");
        }
        "directory" => std::fs::create_dir(&path).expect("created"),
        "fifo" => assert!(std::process::Command::new("mkfifo").arg(&path).status().expect("mkfifo runs").success()),
        "/dev/zero" => std::os::unix::fs::symlink("/dev/zero", &path).expect("linked"),
        other => panic!("no such kind {other}"),
    }
}

const NOT_REGULAR: [&str; 4] = ["symlink", "directory", "fifo", "/dev/zero"];

#[tokio::test]
async fn a_record_lost_to_a_file_that_is_no_regular_file_fails_closed_across_restarts_until_a_pull_heals_it() {
    let root = tempfile::tempdir().unwrap();
    let pulled = root.path().join("image_manager/pulled");
    let image =
        |kind: &str| (format!("private/{}:v1", kind.replace('/', "")), format!("sha256:{}", kind.replace('/', "")));
    {
        let records = open(root.path());
        for kind in NOT_REGULAR {
            let (name, id) = image(kind);
            records.record_pulled(&name, &id, "docker.io/library/private", secret("s")).await.expect("written");
        }
    }
    for kind in NOT_REGULAR {
        replace_by(kind, &pulled, &StateDir::file_name(&image(kind).1));
    }
    // Read at start (warm), then once more after a restart that finds only the files set aside.
    for start in ["the start that finds them", "the next start"] {
        let records = open(root.path());
        records.warm().expect("warms the rest");
        for kind in NOT_REGULAR {
            let (name, id) = image(kind);
            assert!(records.record(&id).await.is_err(), "{kind} at {start}: an error, never \"no record\"");
            assert!(records.pulled_by_cri_imaged(&name, &id).await.is_err(), "{kind} at {start}: never preloaded");
        }
        assert!(records.record("sha256:never").await.expect("no file, no error").is_none());
    }
    // Looked up without a warm-up (a node with more records than memory holds reads on demand).
    let records = open(root.path());
    let (name, id) = image("fifo");
    assert!(records.pulled_by_cri_imaged(&name, &id).await.is_err());
    records.record_pulled(&name, &id, "docker.io/library/private", secret("s")).await.expect("rewritten");
    assert!(records.record(&id).await.expect("readable now").is_some(), "a pull with credentials heals it");
}

#[tokio::test]
async fn a_record_named_for_another_image_than_it_holds_fails_closed_for_both() {
    let root = tempfile::tempdir().unwrap();
    let pulled = root.path().join("image_manager/pulled");
    {
        let records = open(root.path());
        records
            .record_pulled("other:v1", "sha256:other", "docker.io/library/other", secret("s"))
            .await
            .expect("written");
    }
    // The other image's record, moved to where this image's would be.
    std::fs::rename(pulled.join(StateDir::file_name("sha256:other")), pulled.join(StateDir::file_name("sha256:mine")))
        .expect("moved");
    for warmed in [false, true] {
        let records = open(root.path());
        if warmed {
            records.warm().expect("warms");
        }
        assert!(records.record("sha256:mine").await.is_err(), "warmed {warmed}: never \"no record\"");
        assert!(records.pulled_by_cri_imaged("mine:v1", "sha256:mine").await.is_err(), "warmed {warmed}");
        assert!(records.record("sha256:other").await.expect("no file of its own").is_none(), "warmed {warmed}");
    }
}

#[tokio::test]
async fn an_intent_lost_to_a_file_that_is_no_regular_file_fails_closed() {
    let root = tempfile::tempdir().unwrap();
    let pulling = root.path().join("image_manager/pulling");
    {
        let records = open(root.path());
        for kind in NOT_REGULAR {
            records.record_intent(&format!("private/{}:v1", kind.replace('/', ""))).await.expect("written");
        }
    }
    for kind in NOT_REGULAR {
        replace_by(kind, &pulling, &StateDir::file_name(&format!("private/{}:v1", kind.replace('/', ""))));
    }
    let records = open(root.path());
    records.warm().expect("warms");
    for kind in NOT_REGULAR {
        let name = format!("private/{}:v1", kind.replace('/', ""));
        assert!(records.pulled_by_cri_imaged(&name, "sha256:x").await.is_err(), "{kind}: never preloaded");
    }
}

/// A runtime that has the images it is given: (image name, id).
fn images(present: &[(&str, &str)]) -> FakeRuntime {
    present.iter().fold(FakeRuntime::default(), |runtime, (name, id)| runtime.with_image(name, id, 1))
}

#[tokio::test]
async fn at_start_an_intent_for_a_present_image_becomes_a_record_that_verifies_everyone() {
    let root = tempfile::tempdir().unwrap();
    {
        let records = open(root.path());
        records.record_intent("crashed:v1").await.expect("written");
        records.record_intent("absent:v1").await.expect("written");
        records.record_pulled("kept:v1", "sha256:kept", "docker.io/library/kept", secret("s")).await.expect("written");
        records.record_pulled("gone:v1", "sha256:gone", "docker.io/library/gone", secret("s")).await.expect("written");
    }
    let records = open(root.path());
    let runtime = images(&[("crashed:v1", "sha256:crashed"), ("kept:v1", "sha256:kept")]);
    records.clone().settle(&runtime, SystemTime::now() + Duration::from_secs(2)).await;
    let converted = records.record("sha256:crashed").await.expect("readable").expect("a record now");
    assert!(converted.credential_mapping.is_empty(), "no credentials: every pod is verified");
    assert!(
        !records.pulled_by_cri_imaged("crashed:v1", "sha256:unrelated").await.expect("readable"),
        "the intent went"
    );
    assert!(
        records.pulled_by_cri_imaged("absent:v1", "sha256:absent").await.expect("readable"),
        "an absent image's intent stays"
    );
    assert!(records.record("sha256:kept").await.expect("readable").is_some());
    assert!(
        records.record("sha256:gone").await.expect("readable").is_none(),
        "the record of an image that is gone is pruned"
    );
}

#[tokio::test]
async fn a_caller_that_goes_away_mid_pull_leaves_the_intent_so_the_image_stays_verified() {
    let root = tempfile::tempdir().unwrap();
    let records = open(root.path());
    let intent = records.intend("private:v1").await.expect("recorded");
    assert_eq!(records.pulls_in_flight("private:v1"), 1);
    drop(intent);
    assert_eq!(records.pulls_in_flight("private:v1"), 0);
    assert!(records.pulled_by_cri_imaged("private:v1", "sha256:private").await.expect("readable"));
    assert_eq!(files(&root.path().join("image_manager/pulling")).len(), 1, "kept on disk");
    // Another pod's failed pull does not take it away: only a record replaces it.
    records.intend("private:v1").await.expect("recorded").failed().await.expect("ended");
    assert!(records.pulled_by_cri_imaged("private:v1", "sha256:private").await.expect("readable"));
    let again = records.intend("private:v1").await.expect("recorded");
    again.pulled("sha256:private", "docker.io/library/private", secret("s")).await.expect("recorded");
    assert!(files(&root.path().join("image_manager/pulling")).is_empty(), "a pull that recorded its outcome ends it");
}

#[tokio::test]
async fn a_failed_pull_does_not_remove_an_intent_a_crash_left_until_a_record_replaces_it() {
    let root = tempfile::tempdir().unwrap();
    {
        let records = open(root.path());
        records.record_intent("crashed:v1").await.expect("written");
    }
    let records = open(root.path());
    // A pod without credentials asks before the start settled: its pull fails.
    records.intend("crashed:v1").await.expect("recorded").failed().await.expect("ended");
    assert!(records.pulled_by_cri_imaged("crashed:v1", "sha256:crashed").await.expect("readable"), "still counted");
    records.clone().settle(&images(&[("crashed:v1", "sha256:crashed")]), SystemTime::now()).await;
    let converted = records.record("sha256:crashed").await.expect("readable").expect("a record now");
    assert!(converted.credential_mapping.is_empty());
    assert!(files(&root.path().join("image_manager/pulling")).is_empty());
}

#[tokio::test]
async fn until_the_intents_found_at_start_are_settled_every_image_counts_as_pulled_by_cri_imaged() {
    let root = tempfile::tempdir().unwrap();
    {
        let records = open(root.path());
        records.record_intent("crashed:v1").await.expect("written");
    }
    let records = open(root.path());
    // The crash's pull may have landed under another name (a digest for the tag).
    assert!(records.pulled_by_cri_imaged("crashed@sha256:abc", "sha256:crashed").await.expect("readable"));
    records.clone().settle(&images(&[("crashed:v1", "sha256:crashed")]), SystemTime::now()).await;
    assert!(
        records.pulled_by_cri_imaged("crashed@sha256:abc", "sha256:crashed").await.expect("readable"),
        "now by its record"
    );
    assert!(!records.pulled_by_cri_imaged("preloaded:v1", "sha256:preloaded").await.expect("readable"));
}
