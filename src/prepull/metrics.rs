//! Pre-pulls' metrics: how many are in each state, and the bytes they pulled.

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::metric_labels::Labels;

#[derive(Debug, Clone, Default)]
pub struct PrePullMetrics {
    by_state: Family<Labels, Gauge>,
    pulled_bytes: Counter,
    resumed_bytes: Counter,
}

impl PrePullMetrics {
    /// The metrics, registered in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register("pre_pulls", "Pre-pulls listed, by state", metrics.by_state.clone());
        registry.register("pre_pulled_bytes", "Bytes of the images pre-pulls pulled", metrics.pulled_bytes.clone());
        registry.register(
            "pre_pull_resumed_bytes",
            "Bytes pre-pulls cut short had fetched, found kept when they went on (not fetched again)",
            metrics.resumed_bytes.clone(),
        );
        metrics
    }

    /// How many pre-pulls are in each state now.
    pub fn states(&self, counts: [(&'static str, usize); 6]) {
        for (state, count) in counts {
            self.by_state.get_or_create(&vec![("state", state)]).set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }

    /// A pre-pull went on from `bytes` it had fetched before.
    pub fn resumed(&self, bytes: u64) {
        self.resumed_bytes.inc_by(bytes);
    }

    /// A pre-pull pulled an image of `bytes`.
    pub fn pre_pulled(&self, bytes: u64) {
        self.pulled_bytes.inc_by(bytes);
    }
}
