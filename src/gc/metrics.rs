//! Image GC's metrics: images removed by reason (the kubelet's
//! `image_garbage_collected_total`), bytes freed, pass duration and outcome, the image
//! filesystem's usage.

use std::time::Duration;

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use super::plan::{GcPolicy, Reason};
use crate::{metric_labels::Labels, runtime::ImageFsUsage};

/// A pass lists, plans and removes; removals take from milliseconds to minutes.
const PASS_BUCKETS: [f64; 10] = [0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0];

const REASONS: [Reason; 3] = [Reason::Age, Reason::Space, Reason::Unused];

/// How a pass of the collector ended; `failure` labels the kubelet's event reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassOutcome {
    Success,
    /// The kubelet's `FreeDiskSpaceFailed`: too few eligible bytes, or removals failed.
    FreeDiskSpaceFailed,
    /// The kubelet's `InvalidDiskCapacity`.
    InvalidDiskCapacity,
    /// The runtime could not be asked.
    RuntimeFailed,
}

impl PassOutcome {
    /// Every outcome, each series made at 0 at start (a rate then sees a node's first failure).
    const ALL: [Self; 4] = [Self::Success, Self::FreeDiskSpaceFailed, Self::InvalidDiskCapacity, Self::RuntimeFailed];

    fn label(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::FreeDiskSpaceFailed => "FreeDiskSpaceFailed",
            Self::InvalidDiskCapacity => "InvalidDiskCapacity",
            Self::RuntimeFailed => "RuntimeFailed",
        }
    }
}

#[derive(Debug, Clone)]
pub struct GcMetrics {
    /// One series a reason, made at start.
    collected: [Counter; REASONS.len()],
    /// The kubelet's `image_garbage_collected_total`: `age` and `space`, which counts the removals
    /// of `DeleteUnusedImages` (our `unused`) too; registered by [`Self::register_kubelet_names`].
    kubelet_family: Family<Labels, Counter>,
    kubelet_collected: [Counter; 2],
    freed_bytes: Counter,
    passes: Family<Labels, Counter>,
    pass_duration: Histogram,
    /// Passes that failed after one that failed: the kubelet's `ImageGCFailed` event.
    repeated_failures: Counter,
    capacity: Gauge,
    available: Gauge,
    /// `--image-gc-high-threshold` and `--image-gc-low-threshold` when the filesystem was measured
    /// (a reload may change them), so that usage can be set against them.
    high_threshold: Gauge,
    low_threshold: Gauge,
}

impl GcMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let family = Family::<Labels, Counter>::default();
        let collected = REASONS.map(|reason| family.get_or_create(&vec![("reason", reason.as_str())]).clone());
        let kubelet_family = Family::<Labels, Counter>::default();
        let kubelet_collected =
            ["age", "space"].map(|reason| kubelet_family.get_or_create(&vec![("reason", reason)]).clone());
        let metrics = Self {
            collected,
            kubelet_family,
            kubelet_collected,
            freed_bytes: Counter::default(),
            passes: Family::default(),
            pass_duration: Histogram::new(PASS_BUCKETS),
            repeated_failures: Counter::default(),
            capacity: Gauge::default(),
            available: Gauge::default(),
            high_threshold: Gauge::default(),
            low_threshold: Gauge::default(),
        };
        for outcome in PassOutcome::ALL {
            let _ = metrics.passes.get_or_create(&vec![("outcome", outcome.label())]);
        }
        registry.register("image_garbage_collected", "Images removed by garbage collection, by reason", family);
        registry.register("image_gc_freed_bytes", "Bytes freed by removing images", metrics.freed_bytes.clone());
        registry.register("image_gc_passes", "Garbage collection passes, by outcome", metrics.passes.clone());
        registry.register(
            "image_gc_pass_duration_seconds",
            "Time a garbage collection pass took",
            metrics.pass_duration.clone(),
        );
        registry.register(
            "image_gc_repeated_failures",
            "Periodic passes that failed right after one that failed (the kubelet's ImageGCFailed)",
            metrics.repeated_failures.clone(),
        );
        registry.register(
            "image_filesystem_capacity_bytes",
            "Size of the filesystem holding the runtime's images, as last measured",
            metrics.capacity.clone(),
        );
        registry.register(
            "image_filesystem_available_bytes",
            "Bytes available on the filesystem holding the runtime's images, as last measured",
            metrics.available.clone(),
        );
        registry.register(
            "image_gc_high_threshold_percent",
            "Image GC's high threshold (--image-gc-high-threshold) when the image filesystem was last measured; 100: GC for space is off",
            metrics.high_threshold.clone(),
        );
        registry.register(
            "image_gc_low_threshold_percent",
            "Image GC's low threshold (--image-gc-low-threshold) when the image filesystem was last measured",
            metrics.low_threshold.clone(),
        );
        metrics
    }

    pub fn collected(&self, reason: Reason, bytes: u64) {
        let index = REASONS.iter().position(|known| *known == reason).unwrap_or_default();
        self.collected[index].inc();
        self.kubelet_collected[usize::from(reason != Reason::Age)].inc();
        self.freed_bytes.inc_by(bytes);
    }

    /// The kubelet's own metric, for `kubelet_*` names.
    pub fn register_kubelet_names(&self, registry: &mut Registry) {
        let family = self.kubelet_family.clone();
        registry.register("image_garbage_collected", "Images removed by garbage collection, by reason", family);
    }

    pub fn passed(&self, outcome: PassOutcome, took: Duration) {
        self.passes.get_or_create(&vec![("outcome", outcome.label())]).inc();
        self.pass_duration.observe(took.as_secs_f64());
    }

    pub fn failed_again(&self) {
        self.repeated_failures.inc();
    }

    /// The image filesystem as measured, and the thresholds GC judged it by then.
    pub fn measured(&self, usage: ImageFsUsage, policy: &GcPolicy) {
        self.capacity.set(i64::try_from(usage.capacity).unwrap_or(i64::MAX));
        self.available.set(i64::try_from(usage.available).unwrap_or(i64::MAX));
        self.high_threshold.set(i64::from(policy.high_threshold_percent));
        self.low_threshold.set(i64::from(policy.low_threshold_percent));
    }
}
