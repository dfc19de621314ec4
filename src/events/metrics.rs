//! The node's events, counted by reason and type (`cri_imaged_events_total`): the reasons are
//! the fixed names of [`super::reason`], so the series stay few.

use prometheus_client::{
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

use super::EventType;

/// Events published, by reason and type.
#[derive(Debug, Clone, Default)]
pub struct EventMetrics {
    events: Family<Vec<(&'static str, &'static str)>, Counter>,
}

impl EventMetrics {
    /// The metrics, registered in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "events",
            "Events the node published, by reason and type (those kept for ListEvents: progress reports and an image already present, made only for watchers, are not counted)",
            metrics.events.clone(),
        );
        metrics
    }

    pub(super) fn published(&self, kind: EventType, reason: &'static str) {
        self.events.get_or_create(&vec![("reason", reason), ("type", kind.as_str())]).inc();
    }

    /// Events of `reason` and `kind` counted so far.
    pub fn total(&self, kind: EventType, reason: &'static str) -> u64 {
        self.events.get_or_create(&vec![("reason", reason), ("type", kind.as_str())]).get()
    }
}
