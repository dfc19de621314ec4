//! EnsureImageExists's metrics: decisions, the kubelet's pull-duration histogram, backoff.

use std::time::Duration;

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use crate::{metric_labels::Labels, pull_policy::PullPolicy};

/// The kubelet's `image_pull_duration_seconds` buckets.
const PULL_DURATION_BUCKETS: [f64; 18] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0,
    3600.0,
];

const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;
/// The kubelet's image size buckets: a size goes to the last bucket whose bound it exceeds.
const IMAGE_SIZE_BUCKETS: [(u64, &str); 12] = [
    (0, "0-10MB"),
    (10 * MIB, "10MB-100MB"),
    (100 * MIB, "100MB-500MB"),
    (500 * MIB, "500MB-1GB"),
    (GIB, "1GB-5GB"),
    (5 * GIB, "5GB-10GB"),
    (10 * GIB, "10GB-20GB"),
    (20 * GIB, "20GB-30GB"),
    (30 * GIB, "30GB-40GB"),
    (40 * GIB, "40GB-60GB"),
    (60 * GIB, "60GB-100GB"),
    (100 * GIB, "GT100GB"),
];

/// The kubelet's `GetImageSizeBucket`: `N/A` for an unknown (0) size.
pub fn image_size_bucket(size: u64) -> &'static str {
    if size == 0 {
        return "N/A";
    }
    IMAGE_SIZE_BUCKETS.iter().rev().find(|(bound, _)| size > *bound).map_or("0-10MB", |(_, label)| label)
}

type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// What the manager counts.
#[derive(Debug, Clone)]
pub struct EnsureMetrics {
    pull_duration: HistogramFamily,
    requests: Family<Labels, Counter>,
    backoff_refusals: Counter,
    backoff_entries: Gauge,
    backoff_cleared: Counter,
}

impl EnsureMetrics {
    /// The metrics, registered in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            pull_duration: Family::new_with_constructor(|| Histogram::new(PULL_DURATION_BUCKETS)),
            requests: Family::default(),
            backoff_refusals: Counter::default(),
            backoff_entries: Gauge::default(),
            backoff_cleared: Counter::default(),
        };
        registry.register(
            "image_pull_duration_seconds",
            "Time to get a pulled image, waiting included, per request that pulled (the kubelet's metric)",
            metrics.pull_duration.clone(),
        );
        registry.register(
            "ensure_image_requests",
            "EnsureImageExists requests, by pull policy, presence and whether a pull was needed (unknown: not found out)",
            metrics.requests.clone(),
        );
        registry.register(
            "backoff_refusals",
            "Requests refused with ImagePullBackOff",
            metrics.backoff_refusals.clone(),
        );
        registry.register("backoff_entries", "(pod, image) keys in the backoff store", metrics.backoff_entries.clone());
        registry.register("backoff_cleared", "(pod, image) keys ClearBackoff forgot", metrics.backoff_cleared.clone());
        metrics
    }

    /// The kubelet's metrics these mean the same as, for `kubelet_*` names: the pull duration and
    /// the image manager's requests.
    pub fn register_kubelet_names(&self, registry: &mut Registry) {
        registry.register(
            "image_pull_duration_seconds",
            "Time to get a pulled image, waiting included, per request that pulled",
            self.pull_duration.clone(),
        );
        registry.sub_registry_with_prefix("image_manager").register(
            "ensure_image_requests",
            "EnsureImageExists requests, by pull policy, presence and whether a pull was needed (unknown: not found out)",
            self.requests.clone(),
        );
    }

    /// A request, to be counted once when it ends, however it ends (the kubelet's deferred
    /// count): fill in what it learns as it goes; what it never learned is `unknown`.
    pub fn request(&self) -> RequestCount<'_> {
        RequestCount { metrics: self, policy: None, present: None, pull_required: None }
    }

    /// Requests counted with these labels.
    #[cfg(test)]
    pub fn requests(&self, policy: Option<PullPolicy>, present: Option<bool>, pull_required: Option<bool>) -> u64 {
        self.requests.get_or_create(&request_labels(policy, present, pull_required)).get()
    }

    pub fn pulled_for_request(&self, total: Duration, image_size: u64) {
        let labels = vec![("image_size_in_bytes", image_size_bucket(image_size))];
        self.pull_duration.get_or_create(&labels).observe(total.as_secs_f64());
    }

    pub fn backoff_refused(&self) {
        self.backoff_refusals.inc();
    }

    /// `pairs` forgotten by ClearBackoff.
    pub fn backoff_cleared(&self, pairs: usize) {
        self.backoff_cleared.inc_by(pairs as u64);
    }

    /// How many were forgotten so far.
    #[cfg(test)]
    pub fn backoffs_cleared(&self) -> u64 {
        self.backoff_cleared.get()
    }

    pub fn backoff_size(&self, entries: usize) {
        self.backoff_entries.set(i64::try_from(entries).unwrap_or(i64::MAX));
    }
}

/// One EnsureImageExists request, counted when dropped.
pub struct RequestCount<'a> {
    metrics: &'a EnsureMetrics,
    /// `None` only for an image whose policy could not be defaulted (no valid reference).
    pub policy: Option<PullPolicy>,
    /// `None` when not looked at (under Always, as the kubelet does not) or not found out.
    pub present: Option<bool>,
    /// `None` when refused before a pull could be decided (under Never) or not found out.
    pub pull_required: Option<bool>,
}

impl Drop for RequestCount<'_> {
    fn drop(&mut self) {
        let labels = request_labels(self.policy, self.present, self.pull_required);
        self.metrics.requests.get_or_create(&labels).inc();
    }
}

fn request_labels(policy: Option<PullPolicy>, present: Option<bool>, pull_required: Option<bool>) -> Labels {
    let flag = |value: Option<bool>| match value {
        Some(true) => "true",
        Some(false) => "false",
        None => "unknown",
    };
    vec![
        ("pull_policy", policy.map_or("unknown", policy_label)),
        ("present_locally", flag(present)),
        ("pull_required", flag(pull_required)),
    ]
}

/// The pull policy as the kubelet's `ensure_image_requests_total` labels it: lower case.
fn policy_label(policy: PullPolicy) -> &'static str {
    match policy {
        PullPolicy::Always => "always",
        PullPolicy::IfNotPresent => "ifnotpresent",
        PullPolicy::Never => "never",
    }
}
