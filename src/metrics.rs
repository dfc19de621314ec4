//! Prometheus metrics (`cri_imaged_*`): one registry that each concern registers its own metrics
//! in (`ensure`, `pull`, `presence`, `records`, `gc`, `events`, the server's connections), and the HTTP endpoint that serves them.
//!
//! Labels never carry image names or pods ([`crate::metric_labels`]), so the series count stays
//! small on any node.

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use prometheus_client::{
    encoding::text::{encode_eof, encode_registry},
    registry::Registry,
};

use crate::{
    ensure::metrics::EnsureMetrics,
    events::metrics::EventMetrics,
    gc::metrics::GcMetrics,
    kubelet_guard::GuardMetrics,
    policy::PolicyMetrics,
    prepull::metrics::PrePullMetrics,
    presence::metrics::PresenceMetrics,
    pull::metrics::PullMetrics,
    readiness::Readiness,
    records::metrics::RecordsMetrics,
    reload::metrics::ReloadMetrics,
    server::metrics::{CallMetrics, ConnectionMetrics},
    signatures::SignatureMetrics,
};

/// Every metric, registered under the `cri_imaged` prefix; each part gets its own share. Those
/// that mean what a kubelet's image metric means are served under its `kubelet_*` name too, so
/// that a dashboard made for the kubelet's image manager shows ours.
pub struct Metrics {
    registry: Registry,
    kubelet_names: Registry,
    pub ensure: Arc<EnsureMetrics>,
    pub pulls: Arc<PullMetrics>,
    pub presence: Arc<PresenceMetrics>,
    pub records: Arc<RecordsMetrics>,
    pub gc: Arc<GcMetrics>,
    pub connections: Arc<ConnectionMetrics>,
    pub calls: Arc<CallMetrics>,
    pub reloads: Arc<ReloadMetrics>,
    pub kubelet_guard: Arc<GuardMetrics>,
    pub pre_pulls: Arc<PrePullMetrics>,
    pub policy: Arc<PolicyMetrics>,
    pub signatures: Arc<SignatureMetrics>,
    pub events: Arc<EventMetrics>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("cri_imaged");
        let ensure = Arc::new(EnsureMetrics::register(&mut registry));
        let pulls = Arc::new(PullMetrics::register(&mut registry));
        let presence = Arc::new(PresenceMetrics::register(&mut registry));
        let records = Arc::new(RecordsMetrics::register(&mut registry));
        let gc = Arc::new(GcMetrics::register(&mut registry));
        let connections = Arc::new(ConnectionMetrics::register(&mut registry));
        let calls = Arc::new(CallMetrics::register(&mut registry));
        let reloads = Arc::new(ReloadMetrics::register(&mut registry));
        let kubelet_guard = Arc::new(GuardMetrics::register(&mut registry));
        let pre_pulls = Arc::new(PrePullMetrics::register(&mut registry));
        let policy = Arc::new(PolicyMetrics::register(&mut registry));
        let signatures = Arc::new(SignatureMetrics::register(&mut registry));
        let events = Arc::new(EventMetrics::register(&mut registry));
        let mut kubelet_names = Registry::with_prefix("kubelet");
        ensure.register_kubelet_names(&mut kubelet_names);
        records.register_imagemanager(kubelet_names.sub_registry_with_prefix("imagemanager"));
        gc.register_kubelet_names(&mut kubelet_names);
        Self {
            registry,
            kubelet_names,
            ensure,
            pulls,
            presence,
            records,
            gc,
            connections,
            calls,
            reloads,
            kubelet_guard,
            pre_pulls,
            policy,
            signatures,
            events,
        }
    }
}

impl Metrics {
    /// The text exposition (OpenMetrics).
    pub fn render(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = encode_registry(&mut text, &self.registry);
        let _ = encode_registry(&mut text, &self.kubelet_names);
        let _ = encode_eof(&mut text);
        text
    }

    /// Both registries, for the generated metrics reference (`tests/docs_reference.rs`): the text
    /// exposition leaves out a family with no series yet, and a registry lists its metrics only
    /// in its `Debug`.
    #[doc(hidden)]
    pub fn registries(&self) -> [&Registry; 2] {
        [&self.registry, &self.kubelet_names]
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

/// Serves `GET /metrics`, and the kubelet's probes, until `shutdown` completes: `/readyz` is 200
/// while the image service is SERVING (the runtime answers), else 503 saying why; `/livez` is 200
/// while the daemon serves, unless the runtime has been unreachable for the limit given with
/// `readiness` (then 503 saying why). The kubelet makes these requests itself, so they answer
/// whatever the runtime does, where an exec probe would go through the runtime.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    (readiness, liveness_limit): (Arc<Readiness>, Option<Duration>),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), MetricsServerError> {
    let probed = readiness.clone();
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let metrics = metrics.clone();
                async move {
                    let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
                    ([(http::header::CONTENT_TYPE, content_type)], metrics.render())
                }
            }),
        )
        .route(
            "/readyz",
            axum::routing::get(move || {
                let answer = readiness.answer();
                async move {
                    match answer {
                        Ok(ok) => (http::StatusCode::OK, ok.to_owned()),
                        Err(why) => (http::StatusCode::SERVICE_UNAVAILABLE, why),
                    }
                }
            }),
        )
        .route(
            "/livez",
            axum::routing::get(move || {
                let answer = probed.live(liveness_limit, tokio::time::Instant::now());
                async move {
                    match answer {
                        Ok(ok) => (http::StatusCode::OK, ok.to_owned()),
                        Err(why) => (http::StatusCode::SERVICE_UNAVAILABLE, why),
                    }
                }
            }),
        );
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await.map_err(MetricsServerError::Serve)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ensure::metrics::image_size_bucket, pull::metrics::PullResult, pull_policy::PullPolicy};

    const MIB: u64 = 1024 * 1024;
    const GIB: u64 = 1024 * MIB;

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
        let mut request = metrics.ensure.request();
        (request.policy, request.present, request.pull_required) =
            (Some(PullPolicy::IfNotPresent), Some(false), Some(true));
        drop(request);
        metrics.pulls.started();
        metrics.pulls.finished(Some("registry.example:5000"), PullResult::Success);
        metrics.ensure.pulled_for_request(Duration::from_millis(1500), 700);
        metrics.pulls.joined();
        metrics.presence.watching(true);
        let text = metrics.render();
        for line in [
            r#"cri_imaged_ensure_image_requests_total{pull_policy="ifnotpresent",present_locally="false",pull_required="true"} 1"#,
            r#"cri_imaged_pulls_total{result="success"} 1"#,
            r#"cri_imaged_registry_pulls_total{registry="registry.example:5000",result="success"} 1"#,
            r#"cri_imaged_image_pull_duration_seconds_bucket{le="5.0",image_size_in_bytes="0-10MB"} 1"#,
            r#"cri_imaged_image_pull_duration_seconds_bucket{le="1.0",image_size_in_bytes="0-10MB"} 0"#,
            "cri_imaged_pull_joins_total 1",
            "cri_imaged_pulls_in_flight 0",
            "cri_imaged_presence_cache_watching 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in:\n{text}");
        }
    }

    #[test]
    fn every_pull_result_and_gc_outcome_is_a_series_at_zero_from_the_start() {
        // A rate over a node's first failure sees it only if the series was there before it.
        let text = Metrics::default().render();
        for result in
            ["success", "failure", "rate_limited", "timed_out", "stalled", "cancelled", "registry_unavailable"]
        {
            let line = format!(r#"cri_imaged_pulls_total{{result="{result}"}} 0"#);
            assert!(text.lines().any(|l| l == line), "missing {line:?} in:\n{text}");
        }
        for outcome in ["success", "FreeDiskSpaceFailed", "InvalidDiskCapacity", "RuntimeFailed"] {
            let line = format!(r#"cri_imaged_image_gc_passes_total{{outcome="{outcome}"}} 0"#);
            assert!(text.lines().any(|l| l == line), "missing {line:?} in:\n{text}");
        }
    }

    #[test]
    fn a_measured_image_filesystem_comes_with_the_thresholds_it_was_judged_by() {
        let metrics = Metrics::default();
        let policy =
            crate::gc::plan::GcPolicy::try_new(90, 70, Duration::ZERO, Duration::ZERO).expect("a valid policy");
        metrics.gc.measured(crate::runtime::ImageFsUsage { capacity: 1000, available: 50 }, &policy);
        let text = metrics.render();
        for line in [
            "cri_imaged_image_filesystem_capacity_bytes 1000",
            "cri_imaged_image_filesystem_available_bytes 50",
            "cri_imaged_image_gc_high_threshold_percent 90",
            "cri_imaged_image_gc_low_threshold_percent 70",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in:\n{text}");
        }
    }

    #[test]
    fn the_kubelets_image_metrics_are_served_under_its_names_too() {
        let metrics = Metrics::default();
        let mut request = metrics.ensure.request();
        (request.policy, request.pull_required) = (Some(PullPolicy::Always), Some(true));
        drop(request);
        metrics.ensure.pulled_for_request(Duration::from_millis(1500), 700);
        metrics.records.checked(crate::records::metrics::CheckResult::MustAuthenticate);
        metrics.gc.collected(crate::gc::plan::Reason::Age, 1);
        metrics.gc.collected(crate::gc::plan::Reason::Unused, 1);
        metrics.gc.collected(crate::gc::plan::Reason::Space, 1);
        let text = metrics.render();
        for line in [
            r#"kubelet_image_manager_ensure_image_requests_total{pull_policy="always",present_locally="unknown",pull_required="true"} 1"#,
            r#"kubelet_image_pull_duration_seconds_bucket{le="5.0",image_size_in_bytes="0-10MB"} 1"#,
            r#"kubelet_imagemanager_image_mustpull_checks_total{result="mustAuthenticate"} 1"#,
            "kubelet_imagemanager_ondisk_pulledrecords 0",
            // The kubelet counts DeleteUnusedImages' removals as space.
            r#"kubelet_image_garbage_collected_total{reason="age"} 1"#,
            r#"kubelet_image_garbage_collected_total{reason="space"} 2"#,
            r#"cri_imaged_image_garbage_collected_total{reason="unused"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in:\n{text}");
        }
        assert_eq!(text.matches("# EOF").count(), 1, "one exposition");
        assert!(text.ends_with("# EOF\n"));
    }
}
