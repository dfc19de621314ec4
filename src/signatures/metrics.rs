//! The signature checks' metrics: verifications by result and their time, signature manifests
//! fetched, and answers from memory.

use std::time::Duration;

use prometheus_client::{
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};

use super::{SignatureError, Verified};
use crate::metric_labels::Labels;

/// From a cached answer's microseconds to a slow registry's tens of seconds.
const SECONDS_BUCKETS: [f64; 10] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0];

#[derive(Debug, Clone)]
pub struct SignatureMetrics {
    verifications: Family<Labels, Counter>,
    seconds: Histogram,
    fetched: Counter,
    cache_hits: Counter,
}

impl Default for SignatureMetrics {
    fn default() -> Self {
        Self {
            verifications: Family::default(),
            seconds: Histogram::new(SECONDS_BUCKETS),
            fetched: Counter::default(),
            cache_hits: Counter::default(),
        }
    }
}

impl SignatureMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "signature_verifications",
            "Image signature verifications that read the registry, by result (verified; rejected: no signature met the policy; error: the signatures could not be read) and policy (default, or a namespace's own file; not the namespace itself, which would make a series per namespace file, up to 10,000: the SignatureVerified and SignatureValidationFailed events name the pod's namespace)",
            metrics.verifications.clone(),
        );
        registry.register(
            "signature_verification_seconds",
            "Time of a signature verification that read the registry, resolving the tag included",
            metrics.seconds.clone(),
        );
        registry.register(
            "signature_manifests_fetched",
            "Signature manifests asked of registries (cosign's sha256-<digest>.sig)",
            metrics.fetched.clone(),
        );
        registry.register(
            "signature_cache_hits",
            "Signature checks answered from the digests already verified under the same requirement",
            metrics.cache_hits.clone(),
        );
        for result in ["verified", "rejected", "error"] {
            for policy in ["default", "namespace"] {
                metrics.verifications.get_or_create(&vec![("result", result), ("policy", policy)]).get();
            }
        }
        metrics
    }

    /// A verification's result under a policy (`default` or `namespace`).
    pub fn verified(&self, result: &Result<Verified, SignatureError>, policy: &'static str, took: Duration) {
        let result = match result {
            Ok(_) => "verified",
            Err(SignatureError::Rejected { .. } | SignatureError::NoSignatures { .. }) => "rejected",
            Err(_) => "error",
        };
        self.verifications.get_or_create(&vec![("result", result), ("policy", policy)]).inc();
        self.seconds.observe(took.as_secs_f64());
    }

    pub fn fetched(&self) {
        self.fetched.inc();
    }

    pub fn cache_hit(&self) {
        self.cache_hits.inc();
    }

    /// Signature manifests fetched so far.
    pub fn fetched_total(&self) -> u64 {
        self.fetched.get()
    }

    pub fn cache_hits_total(&self) -> u64 {
        self.cache_hits.get()
    }

    /// Verifications that read the registry so far, by result (verified, rejected, error),
    /// whatever the policy.
    pub fn verifications_total(&self) -> [u64; 3] {
        ["verified", "rejected", "error"].map(|result| {
            ["default", "namespace"]
                .into_iter()
                .map(|policy| self.verifications.get_or_create(&vec![("result", result), ("policy", policy)]).get())
                .sum()
        })
    }
}
