//! Prometheus metrics (`cri_imaged_*`) and the HTTP endpoint that serves them.
//!
//! Labels never carry image names or pods, so the series count stays small on any node.

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use crate::policy::PullPolicy;

/// The kubelet's `image_pull_duration_seconds` buckets.
const PULL_DURATION_BUCKETS: [f64; 18] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0,
    3600.0,
];

/// Queue waits are usually short; these buckets see milliseconds to minutes.
const QUEUE_WAIT_BUCKETS: [f64; 12] = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0];

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

type Labels = Vec<(&'static str, &'static str)>;
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// How an upstream pull ended, as the `result` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullResult {
    Success,
    Failure,
    RateLimited,
    TimedOut,
}

impl PullResult {
    fn label(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Failure => "failure",
            Self::RateLimited => "rate_limited",
            Self::TimedOut => "timed_out",
        }
    }
}

/// Every metric, registered under the `cri_imaged` prefix.
pub struct Metrics {
    registry: Registry,
    pull_duration: HistogramFamily,
    ensure_requests: Family<Labels, Counter>,
    pulls: Family<Labels, Counter>,
    pulls_in_flight: Gauge,
    queue_depth: Gauge,
    queue_wait: Histogram,
    joins: Counter,
    throttled: Counter,
    backoff_refusals: Counter,
    backoff_entries: Gauge,
    presence_hits: Counter,
    presence_invalidations: Counter,
    presence_watching: Gauge,
    presence_barriers: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("cri_imaged");
        let pull_duration: HistogramFamily = Family::new_with_constructor(|| Histogram::new(PULL_DURATION_BUCKETS));
        registry.register(
            "image_pull_duration_seconds",
            "Time to get a pulled image, waiting included, per request that pulled (the kubelet's metric)",
            pull_duration.clone(),
        );
        let ensure_requests = Family::default();
        registry.register(
            "ensure_image_requests",
            "EnsureImageExists requests that reached a decision, by pull policy, presence and whether a pull was needed",
            ensure_requests.clone(),
        );
        let pulls = Family::default();
        registry.register("pulls", "Upstream PullImage calls, by result", pulls.clone());
        let pulls_in_flight = Gauge::default();
        registry.register("pulls_in_flight", "Upstream pulls running now", pulls_in_flight.clone());
        let queue_depth = Gauge::default();
        registry.register("pull_queue_depth", "Pulls waiting for a parallel-pull slot", queue_depth.clone());
        let queue_wait = Histogram::new(QUEUE_WAIT_BUCKETS);
        registry.register("pull_queue_wait_seconds", "Time pulls waited for a slot", queue_wait.clone());
        let joins = Counter::default();
        registry.register("pull_joins", "Requests that joined a pull already under way (single-flight)", joins.clone());
        let throttled = Counter::default();
        registry.register("pulls_throttled", "Pulls refused or delayed by a registry rate limit", throttled.clone());
        let backoff_refusals = Counter::default();
        registry.register("backoff_refusals", "Requests refused with ImagePullBackOff", backoff_refusals.clone());
        let backoff_entries = Gauge::default();
        registry.register("backoff_entries", "(pod, image) keys in the backoff store", backoff_entries.clone());
        let presence_hits = Counter::default();
        registry.register(
            "presence_cache_hits",
            "Presence checks answered from memory, without a runtime call",
            presence_hits.clone(),
        );
        let presence_invalidations = Counter::default();
        registry.register(
            "presence_cache_invalidations",
            "Runtime image events that emptied the presence cache",
            presence_invalidations.clone(),
        );
        let presence_watching = Gauge::default();
        registry.register(
            "presence_cache_watching",
            "1 while the runtime's image events are watched and presence answers are remembered",
            presence_watching.clone(),
        );
        let presence_barriers = Counter::default();
        registry.register(
            "presence_cache_barriers",
            "Marker events published to prove the presence cache current (see --presence-cache-max-staleness)",
            presence_barriers.clone(),
        );
        Self {
            registry,
            pull_duration,
            ensure_requests,
            pulls,
            pulls_in_flight,
            queue_depth,
            queue_wait,
            joins,
            throttled,
            backoff_refusals,
            backoff_entries,
            presence_hits,
            presence_invalidations,
            presence_watching,
            presence_barriers,
        }
    }
}

fn flag(value: bool) -> &'static str {
    if value { "true" } else { "false" }
}

impl Metrics {
    /// The text exposition (OpenMetrics).
    pub fn render(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }

    pub fn ensure_decided(&self, policy: PullPolicy, present: bool, pull_required: bool) {
        let labels = vec![
            ("pull_policy", policy.as_str()),
            ("present_locally", flag(present)),
            ("pull_required", flag(pull_required)),
        ];
        self.ensure_requests.get_or_create(&labels).inc();
    }

    pub fn pulled_for_request(&self, total: Duration, image_size: u64) {
        let labels = vec![("image_size_in_bytes", image_size_bucket(image_size))];
        self.pull_duration.get_or_create(&labels).observe(total.as_secs_f64());
    }

    pub fn pull_queued(&self) {
        self.queue_depth.inc();
    }

    pub fn pull_dequeued(&self, waited: Duration) {
        self.queue_depth.dec();
        self.queue_wait.observe(waited.as_secs_f64());
    }

    pub fn pull_started(&self) {
        self.pulls_in_flight.inc();
    }

    pub fn pull_finished(&self, result: PullResult) {
        self.pulls_in_flight.dec();
        self.pulls.get_or_create(&vec![("result", result.label())]).inc();
    }

    pub fn pull_joined(&self) {
        self.joins.inc();
    }

    pub fn pull_throttled(&self) {
        self.throttled.inc();
    }

    pub fn backoff_refused(&self) {
        self.backoff_refusals.inc();
    }

    pub fn backoff_size(&self, entries: usize) {
        self.backoff_entries.set(i64::try_from(entries).unwrap_or(i64::MAX));
    }

    pub fn presence_hit(&self) {
        self.presence_hits.inc();
    }

    pub fn presence_invalidated(&self) {
        self.presence_invalidations.inc();
    }

    pub fn presence_barrier(&self) {
        self.presence_barriers.inc();
    }

    pub fn presence_watching(&self, watching: bool) {
        self.presence_watching.set(i64::from(watching));
    }

    /// Upstream pulls that ended with `result` so far.
    pub fn pulls_total(&self, result: PullResult) -> u64 {
        self.pulls.get_or_create(&vec![("result", result.label())]).get()
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

/// Why the metrics endpoint could not run.
#[derive(Debug, thiserror::Error)]
pub enum MetricsServerError {
    #[error("cannot listen for metrics on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("the metrics endpoint failed: {0}")]
    Serve(std::io::Error),
}

/// Binds `addr` for [`serve`].
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, MetricsServerError> {
    tokio::net::TcpListener::bind(addr).await.map_err(|source| MetricsServerError::Bind { addr, source })
}

/// Serves `GET /metrics` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), MetricsServerError> {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let metrics = metrics.clone();
            async move {
                let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
                ([(http::header::CONTENT_TYPE, content_type)], metrics.render())
            }
        }),
    );
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await.map_err(MetricsServerError::Serve)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_sizes_fall_in_the_kubelets_buckets() {
        let cases = [
            (0, "N/A"),
            (1, "0-10MB"),
            (10 * MIB, "0-10MB"),
            (10 * MIB + 1, "10MB-100MB"),
            (3 * GIB, "1GB-5GB"),
            (100 * GIB + 1, "GT100GB"),
        ];
        for (size, label) in cases {
            assert_eq!(image_size_bucket(size), label, "{size}");
        }
    }

    #[test]
    fn rendered_metrics_carry_the_prefix_labels_and_counts() {
        let metrics = Metrics::default();
        metrics.ensure_decided(PullPolicy::IfNotPresent, false, true);
        metrics.pull_started();
        metrics.pull_finished(PullResult::Success);
        metrics.pulled_for_request(Duration::from_millis(1500), 700);
        metrics.pull_joined();
        let text = metrics.render();
        for line in [
            r#"cri_imaged_ensure_image_requests_total{pull_policy="IfNotPresent",present_locally="false",pull_required="true"} 1"#,
            r#"cri_imaged_pulls_total{result="success"} 1"#,
            r#"cri_imaged_image_pull_duration_seconds_bucket{le="5.0",image_size_in_bytes="0-10MB"} 1"#,
            r#"cri_imaged_image_pull_duration_seconds_bucket{le="1.0",image_size_in_bytes="0-10MB"} 0"#,
            "cri_imaged_pull_joins_total 1",
            "cri_imaged_pulls_in_flight 0",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in:\n{text}");
        }
    }
}
