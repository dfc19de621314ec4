//! The presence cache's metrics.

use prometheus_client::{
    metrics::{counter::Counter, gauge::Gauge},
    registry::Registry,
};

/// What the presence cache and its watcher count.
#[derive(Debug, Clone)]
pub struct PresenceMetrics {
    hits: Counter,
    invalidations: Counter,
    watching: Gauge,
    barriers: Counter,
}

impl PresenceMetrics {
    /// The metrics, registered in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            hits: Counter::default(),
            invalidations: Counter::default(),
            watching: Gauge::default(),
            barriers: Counter::default(),
        };
        registry.register(
            "presence_cache_hits",
            "Presence checks answered from memory, without a runtime call",
            metrics.hits.clone(),
        );
        registry.register(
            "presence_cache_invalidations",
            "Times the presence cache was emptied: image events, removals through cri-imaged, and once more after an event settles",
            metrics.invalidations.clone(),
        );
        registry.register(
            "presence_cache_watching",
            "1 while the runtime's image events are watched and presence answers are remembered",
            metrics.watching.clone(),
        );
        registry.register(
            "presence_cache_barriers",
            "Marker events published to prove the presence cache current (see --presence-cache-max-staleness)",
            metrics.barriers.clone(),
        );
        metrics
    }

    pub fn hit(&self) {
        self.hits.inc();
    }

    pub fn invalidated(&self) {
        self.invalidations.inc();
    }

    pub fn barrier(&self) {
        self.barriers.inc();
    }

    pub fn watching(&self, watching: bool) {
        self.watching.set(i64::from(watching));
    }
}

impl Default for PresenceMetrics {
    /// Registered nowhere: for the cache tested alone.
    fn default() -> Self {
        Self::register(&mut Registry::default())
    }
}
