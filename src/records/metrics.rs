//! The pull records' metrics, as the kubelet's `kubelet_imagemanager_*`.

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::metric_labels::Labels;

/// The `result` label of each [`CheckResult`], in its order.
const RESULTS: [&str; 4] = ["credentialPolicyAllowed", "credentialRecordFound", "mustAuthenticate", "error"];

/// The outcome of one check of a present image's credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CheckResult {
    /// The policy needs no verification for the image.
    CredentialPolicyAllowed,
    /// A record lets the pod use the image.
    CredentialRecordFound,
    /// The pod must pull with its own credentials.
    MustAuthenticate,
    /// The records could not be read: the pod must pull.
    Error,
}

#[derive(Debug, Clone)]
pub struct RecordsMetrics {
    ondisk_intents: Gauge,
    ondisk_records: Gauge,
    inmemory_intents_percent: Gauge,
    inmemory_records_percent: Gauge,
    /// One series a result, made at start, so that counting a check allocates nothing.
    checks: [Counter; RESULTS.len()],
    /// State files set aside as unreadable (a link, a FIFO, a device, too large), by file.
    quarantined: Family<Labels, Counter>,
    /// The checks by result, for `kubelet_*` names too.
    checks_family: Family<Labels, Counter>,
}

impl RecordsMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let family = Family::<Labels, Counter>::default();
        // Counter handles share their value with the family's series.
        let checks = RESULTS.map(|result| family.get_or_create(&vec![("result", result)]).clone());
        let metrics = Self {
            ondisk_intents: Gauge::default(),
            ondisk_records: Gauge::default(),
            inmemory_intents_percent: Gauge::default(),
            inmemory_records_percent: Gauge::default(),
            checks,
            quarantined: Family::default(),
            checks_family: family.clone(),
        };
        registry.register(
            "state_files_quarantined",
            "State files set aside because they were not regular files or were too large, by file",
            metrics.quarantined.clone(),
        );
        metrics.register_imagemanager(registry.sub_registry_with_prefix("imagemanager"));
        metrics
    }

    /// The kubelet's `imagemanager_*` metrics, under `registry`'s prefix (ours, and `kubelet`).
    pub fn register_imagemanager(&self, sub: &mut Registry) {
        sub.register("ondisk_pullintents", "Number of ImagePullIntents stored on disk", self.ondisk_intents.clone());
        sub.register(
            "ondisk_pulledrecords",
            "Number of ImagePulledRecords stored on disk",
            self.ondisk_records.clone(),
        );
        sub.register(
            "inmemory_pullintents_usage_percent",
            "The ImagePullIntents in-memory cache usage in percent",
            self.inmemory_intents_percent.clone(),
        );
        sub.register(
            "inmemory_pulledrecords_usage_percent",
            "The ImagePulledRecords in-memory cache usage in percent",
            self.inmemory_records_percent.clone(),
        );
        sub.register(
            "image_mustpull_checks",
            "Checks of whether a pod's credentials must be verified to use a present image, by result",
            self.checks_family.clone(),
        );
    }

    /// The count of quarantined `file`s (`record`, `intent`, `ages`, `pre_pull`, `signatures`).
    pub fn quarantined(&self, file: &'static str) -> Counter {
        self.quarantined.get_or_create(&vec![("file", file)]).clone()
    }

    pub fn checked(&self, result: CheckResult) {
        self.checks[result as usize].inc();
    }

    pub fn on_disk(&self, intents: usize, records: usize) {
        self.ondisk_intents.set(i64::try_from(intents).unwrap_or(i64::MAX));
        self.ondisk_records.set(i64::try_from(records).unwrap_or(i64::MAX));
    }

    pub fn in_memory(&self, intents_percent: usize, records_percent: usize) {
        self.inmemory_intents_percent.set(i64::try_from(intents_percent).unwrap_or(i64::MAX));
        self.inmemory_records_percent.set(i64::try_from(records_percent).unwrap_or(i64::MAX));
    }
}

impl Default for RecordsMetrics {
    /// Registered nowhere: for the records tested alone.
    fn default() -> Self {
        Self::register(&mut Registry::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_check_counts_under_its_kubelet_result() {
        let mut registry = Registry::with_prefix("cri_imaged");
        let metrics = RecordsMetrics::register(&mut registry);
        metrics.checked(CheckResult::MustAuthenticate);
        metrics.checked(CheckResult::MustAuthenticate);
        metrics.checked(CheckResult::CredentialRecordFound);
        metrics.on_disk(3, 7);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        for line in [
            r#"cri_imaged_imagemanager_image_mustpull_checks_total{result="mustAuthenticate"} 2"#,
            r#"cri_imaged_imagemanager_image_mustpull_checks_total{result="credentialRecordFound"} 1"#,
            r#"cri_imaged_imagemanager_image_mustpull_checks_total{result="error"} 0"#,
            "cri_imaged_imagemanager_ondisk_pullintents 3",
            "cri_imaged_imagemanager_ondisk_pulledrecords 7",
        ] {
            assert!(text.lines().any(|candidate| candidate == line), "{line} in:\n{text}");
        }
    }
}
