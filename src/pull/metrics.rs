//! The pull path's metrics: upstream pulls by result, in flight, queued, joined, throttled; and
//! the registries in trouble (an open breaker, a lowered rate), one series each, for as long as
//! they are: the daemon follows a bounded number of registries, so the series stay few.
//!
//! - `by_registry`: pulls by registry and result, and their durations (the first 32 registries
//!   named, the rest `other`).

mod by_registry;

use std::{sync::atomic::AtomicU64, time::Duration};

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use self::by_registry::ByRegistry;
use crate::metric_labels::Labels;

/// Queue waits are usually short; these buckets see milliseconds to minutes.
const QUEUE_WAIT_BUCKETS: [f64; 12] = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0];

/// How an upstream pull ended, as the `result` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullResult {
    Success,
    Failure,
    RateLimited,
    TimedOut,
    /// Cancelled for making no progress (`--image-pull-progress-timeout`).
    Stalled,
    /// Cancelled because every caller went away.
    Cancelled,
    /// Its registry could not be reached (a network-level failure) or did not answer, or its breaker was open.
    RegistryUnavailable,
    /// A big pull gave its slot to the pulls queued behind it, and was queued again.
    Yielded,
    /// A pre-pull gave its slot to a pod's pull, and was queued again.
    Preempted,
}

impl PullResult {
    /// Every result, so that each series exists at 0 from the start: a rate over the first
    /// failure of a node then sees it (a series made by it would start at 1, and show no rise).
    const ALL: [Self; 9] = [
        Self::Success,
        Self::Failure,
        Self::RateLimited,
        Self::TimedOut,
        Self::Stalled,
        Self::Cancelled,
        Self::RegistryUnavailable,
        Self::Yielded,
        Self::Preempted,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Failure => "failure",
            Self::RateLimited => "rate_limited",
            Self::TimedOut => "timed_out",
            Self::Stalled => "stalled",
            Self::Cancelled => "cancelled",
            Self::RegistryUnavailable => "registry_unavailable",
            Self::Yielded => "yielded",
            Self::Preempted => "preempted",
        }
    }
}

/// What the scheduler and the rate limits count.
#[derive(Debug, Clone)]
pub struct PullMetrics {
    pulls: Family<Labels, Counter>,
    in_flight: Gauge,
    queue_depth: Gauge,
    pre_pull_queue_depth: Gauge,
    queue_wait: Histogram,
    joins: Counter,
    throttled: Counter,
    breaker_open: Family<RegistryLabel, Gauge>,
    breaker_openings: Counter,
    lowered_rate: Family<RegistryLabel, Gauge<f64, AtomicU64>>,
    too_many_requests: Counter,
    by_registry: ByRegistry,
}

/// A registry's series: its host.
type RegistryLabel = Vec<(&'static str, String)>;

fn registry(host: &str) -> RegistryLabel {
    vec![("registry", host.to_owned())]
}

impl PullMetrics {
    /// The metrics, registered in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            pulls: Family::default(),
            in_flight: Gauge::default(),
            queue_depth: Gauge::default(),
            pre_pull_queue_depth: Gauge::default(),
            queue_wait: Histogram::new(QUEUE_WAIT_BUCKETS),
            joins: Counter::default(),
            throttled: Counter::default(),
            breaker_open: Family::default(),
            breaker_openings: Counter::default(),
            lowered_rate: Family::default(),
            too_many_requests: Counter::default(),
            by_registry: ByRegistry::register(registry),
        };
        for result in PullResult::ALL {
            let _ = metrics.pulls.get_or_create(&vec![("result", result.label())]);
        }
        registry.register("pulls", "Upstream PullImage calls, by result", metrics.pulls.clone());
        registry.register("pulls_in_flight", "Upstream pulls running now", metrics.in_flight.clone());
        registry.register(
            "pull_queue_depth",
            "Pods' pulls waiting for a parallel-pull slot",
            metrics.queue_depth.clone(),
        );
        registry.register(
            "pre_pull_queue_depth",
            "Pre-pulls waiting for a parallel-pull slot (behind pods' pulls)",
            metrics.pre_pull_queue_depth.clone(),
        );
        registry.register("pull_queue_wait_seconds", "Time pulls waited for a slot", metrics.queue_wait.clone());
        registry.register(
            "pull_joins",
            "Requests that joined a pull already under way (single-flight)",
            metrics.joins.clone(),
        );
        registry.register(
            "pulls_throttled",
            "Pulls refused or delayed by a registry rate limit",
            metrics.throttled.clone(),
        );
        registry.register(
            "registry_breaker_open",
            "1 for each registry whose breaker is open or half-open (its pulls fail at once)",
            metrics.breaker_open.clone(),
        );
        registry.register(
            "registry_breaker_openings",
            "Times a registry's breaker opened",
            metrics.breaker_openings.clone(),
        );
        registry.register(
            "registry_pull_rate_qps",
            "The pull rate of each registry whose rate was lowered after it answered 429",
            metrics.lowered_rate.clone(),
        );
        registry.register(
            "registry_too_many_requests",
            "Pulls a registry answered with 429 Too Many Requests",
            metrics.too_many_requests.clone(),
        );
        metrics
    }

    pub fn breaker_opened(&self, host: &str) {
        self.breaker_openings.inc();
        self.breaker_open.get_or_create(&registry(host)).set(1);
    }

    pub fn breaker_closed(&self, host: &str) {
        self.breaker_open.remove(&registry(host));
    }

    /// `host`'s rate was lowered to `qps`, or (`None`) is back where it was configured.
    pub fn registry_rate(&self, host: &str, qps: Option<f64>) {
        match qps {
            Some(qps) => {
                self.lowered_rate.get_or_create(&registry(host)).set(qps);
            }
            None => {
                self.lowered_rate.remove(&registry(host));
            }
        }
    }

    pub fn too_many_requests(&self) {
        self.too_many_requests.inc();
    }

    /// Counts a pull from `host` (`None` without a registry) that ended before it reached the
    /// runtime (no slot was taken).
    pub fn refused(&self, host: Option<&str>, result: PullResult) {
        self.pulls.get_or_create(&vec![("result", result.label())]).inc();
        self.by_registry.ended(host, result);
    }

    pub fn queued(&self) {
        self.queue_depth.inc();
    }

    pub fn dequeued(&self, waited: Duration) {
        self.queue_depth.dec();
        self.queue_wait.observe(waited.as_secs_f64());
    }

    /// A pre-pull waits for a slot (`true`) or no longer does.
    pub fn pre_pull_waiting(&self, waiting: bool) {
        if waiting {
            self.pre_pull_queue_depth.inc()
        } else {
            self.pre_pull_queue_depth.dec()
        };
    }

    pub fn started(&self) {
        self.in_flight.inc();
    }

    /// An upstream pull from `host` (`None` without a registry) ended with `result`.
    pub fn finished(&self, host: Option<&str>, result: PullResult) {
        self.in_flight.dec();
        self.pulls.get_or_create(&vec![("result", result.label())]).inc();
        self.by_registry.ended(host, result);
    }

    /// A pull from `host` succeeded, `took` after it first had a slot.
    pub fn pulled(&self, host: Option<&str>, took: Duration) {
        self.by_registry.pulled(host, took);
    }

    pub fn joined(&self) {
        self.joins.inc();
    }

    pub fn throttled(&self) {
        self.throttled.inc();
    }

    /// Upstream pulls that ended with `result` so far.
    pub fn pulls_total(&self, result: PullResult) -> u64 {
        self.pulls.get_or_create(&vec![("result", result.label())]).get()
    }

    /// Upstream pulls from `host` that ended with `result` so far (`other`'s, once `host` is
    /// past the named registries).
    pub fn registry_pulls_total(&self, host: Option<&str>, result: PullResult) -> u64 {
        self.by_registry.total(host, result)
    }

    /// Requests that joined a pull under way so far.
    pub fn joins_total(&self) -> u64 {
        self.joins.get()
    }

    /// Pulls refused or delayed by a rate limit so far.
    pub fn throttled_total(&self) -> u64 {
        self.throttled.get()
    }
}

impl Default for PullMetrics {
    /// Registered nowhere: for parts tested alone.
    fn default() -> Self {
        Self::register(&mut Registry::default())
    }
}
