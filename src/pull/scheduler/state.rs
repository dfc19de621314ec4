//! What the scheduler tells of the pulls under way: each one's state and progress.

use std::time::SystemTime;

use super::PullClass;
use crate::pull::poller::Report;

/// A pull under way, as [`super::PullScheduler::in_flight`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlight {
    pub image: String,
    /// Callers waiting for it.
    pub callers: usize,
    pub asked_at: SystemTime,
    /// `None` while it waits for a slot.
    pub started_at: Option<SystemTime>,
    /// `None` until its downloads are seen (or where they cannot be).
    pub progress: Option<Report>,
    /// A pre-pull until a pod's pull joins it.
    pub class: PullClass,
    pub state: PullState,
}

/// What a pull under way waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PullState {
    /// A parallel-pull slot (`--max-parallel-image-pulls`).
    Slot,
    /// A token of its registry's rate limit.
    RateLimit,
    /// Its registry's pull that has had no answer yet: its registry's next pulls wait for it.
    Registry,
    /// Nothing: the runtime is pulling it.
    Pulling,
}

impl PullState {
    pub(super) const ALL: [Self; 4] = [Self::Slot, Self::RateLimit, Self::Registry, Self::Pulling];

    /// GetStatus's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Slot => "slot",
            Self::RateLimit => "rate-limit",
            Self::Registry => "registry",
            Self::Pulling => "pulling",
        }
    }
}
