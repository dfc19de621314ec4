//! Reloads' metrics: how each SIGHUP ended.

use prometheus_client::{
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

use crate::metric_labels::Labels;

/// How a reload ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadResult {
    /// The files were read and what can change while serving was applied.
    Applied,
    /// A file could not be read or used: the running configuration is kept.
    Refused,
}

impl ReloadResult {
    fn label(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Refused => "refused",
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct ReloadMetrics {
    reloads: Family<Labels, Counter>,
}

impl ReloadMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register("config_reloads", "Configuration reloads (SIGHUP), by result", metrics.reloads.clone());
        metrics
    }

    pub fn reloaded(&self, result: ReloadResult) {
        self.reloads.get_or_create(&vec![("result", result.label())]).inc();
    }
}
