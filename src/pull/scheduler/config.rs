//! How pulls are scheduled, and the defaults: the numbers README's "A cold node" measures.

use std::{num::NonZeroUsize, time::Duration};

use crate::pull::breaker::state::BreakerConfig;

/// How pulls are scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// The most upstream pulls at once; `None` for no cap. Serial pulls are `Some(1)`.
    pub max_parallel: Option<NonZeroUsize>,
    /// Bounds one upstream pull; `None` (the kubelet's default) waits as long as it takes.
    pub pull_timeout: Option<Duration>,
    /// A watched pull whose registry has not answered for this long gives its slot back, and
    /// the registry's next pulls wait for it.
    pub answer_grace: Duration,
    /// A watched pull whose registry has not answered for this long (since it started) fails
    /// with `RegistryUnavailable`; `None` waits as long as the pull takes.
    pub resolve_timeout: Option<Duration>,
    /// A pull of at least this many bytes to fetch makes way, once, for much cheaper pods' pulls
    /// (see [`super::yielding`]); `None` never.
    pub yield_above: Option<u64>,
    pub breaker: BreakerConfig,
}

/// The most pulls at once unless told otherwise (`--max-parallel-image-pulls`). Measured (README,
/// "A cold node"): pulls that share the link each finish later, so a rollout of equal images has
/// the best mean at the smallest cap tried (5: 0.84× the mean at 10), while a cold node's 30 pods
/// lose 2 % against 10 or 20: small images in the queue go first, which the cap does not hinder.
pub const DEFAULT_MAX_PARALLEL: NonZeroUsize = NonZeroUsize::new(5).expect("not zero");

/// A pull of this many bytes or more makes way for much cheaper pods' pulls (see [`super::yielding`]).
pub const DEFAULT_YIELD_ABOVE: u64 = 64 << 20;

impl Default for SchedulerConfig {
    /// Not the kubelet's serial puller: up to [`DEFAULT_MAX_PARALLEL`] pulls at once, the queue
    /// cheapest first, a pull of
    /// [`DEFAULT_YIELD_ABOVE`] or more making way for much cheaper ones, so that a cold node's
    /// small pods start first while the big image keeps the link busy (README, "A cold node").
    /// No pull timeout, as the kubelet; a registry that has not answered for 1 s gives its slot
    /// back, and fails its pull at 20 s.
    fn default() -> Self {
        Self {
            max_parallel: Some(DEFAULT_MAX_PARALLEL),
            pull_timeout: None,
            answer_grace: Duration::from_secs(1),
            resolve_timeout: Some(Duration::from_secs(20)),
            yield_above: Some(DEFAULT_YIELD_ABOVE),
            breaker: BreakerConfig::default(),
        }
    }
}
