//! The flag values of `serve` that name a mode, as typed; what they configure has its own type.

use crate::pull::ratelimit::RateLimitMode;

/// `--registry-rate-limit-mode` as typed; the rate limiter has its own [`RateLimitMode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RateLimitModeArg {
    /// Fail at once with `pull QPS exceeded`, as the kubelet does.
    Fail,
    /// Wait until a token frees up, bounded by the caller's deadline.
    Wait,
}

/// `--signature-policy-mode` as typed; the gate has its own [`crate::policy::Mode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PolicyModeArg {
    Enforce,
    Audit,
}

impl From<PolicyModeArg> for crate::policy::Mode {
    fn from(mode: PolicyModeArg) -> Self {
        match mode {
            PolicyModeArg::Enforce => Self::Enforce,
            PolicyModeArg::Audit => Self::Audit,
        }
    }
}

impl From<RateLimitModeArg> for RateLimitMode {
    fn from(mode: RateLimitModeArg) -> Self {
        match mode {
            RateLimitModeArg::Fail => Self::Fail,
            RateLimitModeArg::Wait => Self::Wait,
        }
    }
}
