//! How the manager pulls and which present images a pod must prove its right to.

use std::time::Duration;

use crate::{
    backoff::BackoffConfig,
    pull::{poller::ProgressConfig, ratelimit::RateLimitConfig, scheduler::SchedulerConfig},
    records::verification::{Allowlist, VerificationPolicy},
};

/// How the manager pulls; [`ManagerConfig::default`] is the kubelet's behaviour.
#[derive(Debug, Clone, PartialEq)]
pub struct ManagerConfig {
    pub scheduler: SchedulerConfig,
    pub backoff: BackoffConfig,
    pub rate_limits: RateLimitConfig,
    /// How long ago the presence cache may last have been proven current for a hit to be
    /// trusted; zero proves every hit (see [`crate::presence`]).
    pub presence_max_staleness: Duration,
    /// How long the runtime's ImageFsInfo answer is served again (see [`crate::presence::answers`]).
    pub image_fs_info_max_age: Duration,
    /// Which present images a pod must have the credentials for (KEP-2535).
    pub verification: VerificationConfig,
    /// How pulls under way are watched; `None` reports only their start and end.
    pub progress: Option<ProgressConfig>,
}

/// The kubelet's `imagePullCredentialsVerificationPolicy` and its allowlist.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerificationConfig {
    pub policy: VerificationPolicy,
    pub allowlist: Allowlist,
}

impl Default for ManagerConfig {
    /// Serial pulls, no pull timeout, 10s-to-300s backoff, 5 pulls a second in bursts of 10;
    /// and, not the kubelet's, pull progress watched with a 5m stall timeout, and registries
    /// that do not answer given up on (see [`SchedulerConfig::default`]).
    fn default() -> Self {
        Self {
            scheduler: SchedulerConfig::default(),
            backoff: BackoffConfig::KUBELET,
            rate_limits: RateLimitConfig::kubelet(),
            presence_max_staleness: crate::presence::DEFAULT_MAX_STALENESS,
            image_fs_info_max_age: crate::presence::answers::DEFAULT_FS_INFO_MAX_AGE,
            verification: VerificationConfig::default(),
            progress: Some(ProgressConfig::default()),
        }
    }
}
