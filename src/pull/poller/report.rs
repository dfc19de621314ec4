//! A pull's progress as the last poll found it, as the scheduler and GetStatus read it.

use std::{sync::Arc, time::Duration};

use crate::{
    events::{LayerFacts, ProgressFacts},
    pull::progress::Progress,
};

/// A pull's progress at the last poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub progress: Progress,
    /// Each layer it fetches (the first [`crate::events::MOST_LAYERS`]).
    pub layers: Arc<[LayerFacts]>,
    /// Over the last two seconds.
    pub bytes_per_second: u64,
    /// The stall timeout, once no byte has moved for it while downloading.
    pub stalled: Option<Duration>,
    /// Bytes a pull resumed from its lease found fetched already, by an earlier pull cut short;
    /// 0 for any other.
    pub kept: u64,
    /// The lease holding what the pull fetches, once it does: cut short, a pull of the same image
    /// that names it goes on from there instead of fetching it again.
    pub held_in: Option<Arc<str>>,
}

impl Report {
    pub fn facts(&self) -> ProgressFacts {
        ProgressFacts {
            bytes_done: self.progress.bytes_done,
            bytes_total: self.progress.bytes_total,
            layers_done: self.progress.layers_done,
            layers_total: self.progress.layers_total,
            bytes_per_second: self.bytes_per_second,
            layers: self.layers.clone(),
        }
    }
}
