//! Upstream pulls by registry: how each ended and how long the successful ones took. The
//! `registry` label is bounded: the first [`NAMED_REGISTRIES`] registries pulled from since the
//! daemon started are named, any later one is `other`, so that pods naming registries at random
//! cannot grow the series without bound. A pull without a registry (a name only the runtime
//! understands) is `none`; neither word can be a registry, which always has a `.`, a `:` or is
//! `localhost`.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use prometheus_client::{
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};

use super::PullResult;

/// The most registries named in a label; the rest are counted as [`OTHER`].
pub const NAMED_REGISTRIES: usize = 32;

/// The label of the registries past the first [`NAMED_REGISTRIES`].
pub const OTHER: &str = "other";

/// The label of a pull without a registry.
pub const NONE: &str = "none";

/// Registry pulls are timed from their slot, so they are quicker than the kubelet's waits:
/// these buckets see a small image from a near registry as well as a huge one from afar.
const DURATION_BUCKETS: [f64; 16] =
    [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0];

/// A series' labels: the registry (owned: hosts are not static) and maybe the result.
type RegistryLabels = Vec<(&'static str, String)>;

type HistogramFamily = Family<RegistryLabels, Histogram, fn() -> Histogram>;

/// Pulls and durations by registry, with the registries named so far.
#[derive(Debug, Clone)]
pub(super) struct ByRegistry {
    pulls: Family<RegistryLabels, Counter>,
    duration: HistogramFamily,
    labels: Arc<Mutex<Labelled>>,
}

/// The registry labels given so far; each got its series at 0 when first given.
#[derive(Debug, Default)]
struct Labelled {
    named: HashSet<String>,
    other: bool,
    none: bool,
}

impl ByRegistry {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            pulls: Family::default(),
            duration: Family::new_with_constructor(|| Histogram::new(DURATION_BUCKETS)),
            labels: Arc::default(),
        };
        registry.register(
            "registry_pulls",
            "Upstream PullImage calls by registry (the first 32 registries pulled from; any later one as other; none without one) and result",
            metrics.pulls.clone(),
        );
        registry.register(
            "registry_pull_duration_seconds",
            "Time of a successful upstream pull, from its parallel-pull slot to the image, by registry (as registry_pulls names it)",
            metrics.duration.clone(),
        );
        metrics
    }

    /// A pull from `host` (`None` or "" without a registry) ended with `result`.
    pub(super) fn ended(&self, host: Option<&str>, result: PullResult) {
        let registry = self.label(host);
        self.pulls.get_or_create(&vec![("registry", registry), ("result", result.label().to_owned())]).inc();
    }

    /// A pull from `host` succeeded after `took`.
    pub(super) fn pulled(&self, host: Option<&str>, took: Duration) {
        self.duration.get_or_create(&vec![("registry", self.label(host))]).observe(took.as_secs_f64());
    }

    /// Pulls from `host` that ended with `result` so far.
    pub(super) fn total(&self, host: Option<&str>, result: PullResult) -> u64 {
        let registry = self.label(host);
        self.pulls.get_or_create(&vec![("registry", registry), ("result", result.label().to_owned())]).get()
    }

    /// The `registry` label of `host`: itself while there is room to name it, else `other`. A
    /// label's series are made at 0 when it is first given, so that a rate sees its first failure.
    fn label(&self, host: Option<&str>) -> String {
        let mut labelled = self.labels.lock().unwrap_or_else(PoisonError::into_inner);
        let labelled = &mut *labelled;
        let (label, first) = match host.filter(|host| !host.is_empty()) {
            None => (NONE, !std::mem::replace(&mut labelled.none, true)),
            Some(host) if labelled.named.contains(host) => return host.to_owned(),
            Some(host) if labelled.named.len() < NAMED_REGISTRIES => {
                labelled.named.insert(host.to_owned());
                (host, true)
            }
            Some(_) => (OTHER, !std::mem::replace(&mut labelled.other, true)),
        };
        if first {
            for result in PullResult::ALL {
                let _ = self
                    .pulls
                    .get_or_create(&vec![("registry", label.to_owned()), ("result", result.label().to_owned())]);
            }
            let _ = self.duration.get_or_create(&vec![("registry", label.to_owned())]);
        }
        label.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rendered(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).expect("encoded");
        text
    }

    #[test]
    fn the_first_32_registries_are_named_and_the_rest_are_counted_as_other() {
        let mut registry = Registry::default();
        let metrics = ByRegistry::register(&mut registry);
        for i in 0..NAMED_REGISTRIES + 8 {
            metrics.ended(Some(&format!("r{i}.example:5000")), PullResult::Success);
        }
        metrics.ended(Some("r0.example:5000"), PullResult::Failure);
        assert_eq!(metrics.total(Some("r0.example:5000"), PullResult::Success), 1);
        assert_eq!(metrics.total(Some("r0.example:5000"), PullResult::Failure), 1);
        assert_eq!(metrics.total(Some("r31.example:5000"), PullResult::Success), 1, "the 32nd is named");
        assert_eq!(metrics.total(Some("r32.example:5000"), PullResult::Success), 8, "the 33rd on are other");
        assert_eq!(metrics.total(Some("later.example"), PullResult::Success), 8, "other, once full");
        let text = rendered(&registry);
        let registries: HashSet<&str> = text
            .lines()
            .filter_map(|line| line.split_once("registry=\"").map(|(_, rest)| rest))
            .filter_map(|rest| rest.split_once('"').map(|(registry, _)| registry))
            .collect();
        assert_eq!(registries.len(), NAMED_REGISTRIES + 1, "{registries:?}");
        assert!(registries.contains(OTHER));
        assert!(!registries.contains("r32.example:5000"));
    }

    #[test]
    fn a_registry_gets_each_result_at_zero_when_first_seen_and_a_pull_without_one_is_none() {
        let mut registry = Registry::default();
        let metrics = ByRegistry::register(&mut registry);
        metrics.pulled(Some("localhost:5000"), Duration::from_millis(300));
        metrics.ended(None, PullResult::Failure);
        metrics.ended(Some(""), PullResult::Failure);
        let text = rendered(&registry);
        for line in [
            r#"registry_pulls_total{registry="localhost:5000",result="failure"} 0"#,
            r#"registry_pulls_total{registry="localhost:5000",result="success"} 0"#,
            r#"registry_pulls_total{registry="none",result="failure"} 2"#,
            r#"registry_pull_duration_seconds_bucket{le="0.25",registry="localhost:5000"} 0"#,
            r#"registry_pull_duration_seconds_bucket{le="0.5",registry="localhost:5000"} 1"#,
            r#"registry_pull_duration_seconds_count{registry="none"} 0"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in:\n{text}");
        }
    }
}
