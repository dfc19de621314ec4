//! Pull records at scale: a root dir holding many records, as a node that pulled many private
//! images has, for the start-up and presence-path measurements.

use std::{
    path::Path,
    sync::Arc,
    time::{Duration, Instant, UNIX_EPOCH},
};

use cri_imaged::{
    files::StateDir,
    records::{
        PullRecords,
        format::{PullCredentials, PulledRecord, SecretRecord},
        metrics::RecordsMetrics,
    },
};

/// Records on disk.
pub const RECORDS: usize = 10_000;

/// Writes `count` records under `root/image_manager/pulled`, each for an image of its own
/// pulled with a secret. They are dated ahead of the run, so that the start-up prune (which only
/// removes records of absent images written before the start) keeps them; plain writes, as this
/// is set-up, not what is measured.
pub fn fill(root: &Path, count: usize) {
    let dir = root.join("image_manager/pulled");
    std::fs::create_dir_all(&dir).expect("records dir");
    let ahead = UNIX_EPOCH + Duration::from_secs(4_070_908_800); // 2099-01-01
    for index in 0..count {
        let image_ref = format!("sha256:{index:064x}");
        let mut record = PulledRecord::new(&image_ref, ahead);
        let secret = SecretRecord {
            uid: format!("{index:08x}-7a1c-4d2e-9f3b-000000000000"),
            namespace: format!("team-{}", index % 100),
            name: "regcred".into(),
            credential_hash: format!("{index:064x}"),
        };
        let credentials = PullCredentials { kubernetes_secrets: vec![secret], ..Default::default() };
        record.credential_mapping.insert(format!("registry.example.com/team-{}/app-{index}", index % 100), credentials);
        std::fs::write(dir.join(StateDir::file_name(&image_ref)), record.encode()).expect("record written");
    }
}

/// How long opening the records and reading them all into memory takes, in process.
pub fn warm_time(root: &Path) -> Duration {
    let started = Instant::now();
    let records = PullRecords::open(root, Arc::new(RecordsMetrics::default())).expect("records open");
    records.warm().expect("records read");
    started.elapsed()
}
