//! The presence cache's metrics.

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::metric_labels::Labels;

/// What a hit answered: the label `call` of the hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answered {
    /// A presence check (EnsureImageExists).
    Presence,
    ImageStatus,
    ListImages,
    ImageFsInfo,
}

impl Answered {
    const ALL: [Self; 4] = [Self::Presence, Self::ImageStatus, Self::ListImages, Self::ImageFsInfo];

    fn labels(self) -> Labels {
        let call = match self {
            Self::Presence => "presence",
            Self::ImageStatus => "ImageStatus",
            Self::ListImages => "ListImages",
            Self::ImageFsInfo => "ImageFsInfo",
        };
        vec![("call", call)]
    }
}

/// What the presence cache and its watcher count.
#[derive(Debug, Clone)]
pub struct PresenceMetrics {
    /// By [`Answered`], in its order: made once, so a hit allocates nothing.
    hits: [Counter; 4],
    invalidations: Counter,
    watching: Gauge,
    barriers: Counter,
}

impl PresenceMetrics {
    /// The metrics, registered in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let hits = Family::<Labels, Counter>::default();
        let metrics = Self {
            hits: Answered::ALL.map(|answered| hits.get_or_create(&answered.labels()).clone()),
            invalidations: Counter::default(),
            watching: Gauge::default(),
            barriers: Counter::default(),
        };
        registry.register(
            "presence_cache_hits",
            "Presence checks (call=\"presence\") and CRI calls answered from memory, without a runtime call",
            hits,
        );
        registry.register(
            "presence_cache_invalidations",
            "Times the presence cache was emptied: image events, pulls and removals through cri-imaged, and once more after an event settles",
            metrics.invalidations.clone(),
        );
        registry.register(
            "presence_cache_watching",
            "1 while a change signal (containerd's image events, CRI-O's image store) is watched and presence answers are remembered",
            metrics.watching.clone(),
        );
        registry.register(
            "presence_cache_barriers",
            "Barriers that proved the presence cache current: marker events published, or the image store's inotify queue read dry (see --presence-cache-max-staleness)",
            metrics.barriers.clone(),
        );
        metrics
    }

    pub fn hit(&self, answered: Answered) {
        self.hits[answered as usize].inc();
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
