//! An image's signatures, for a policy that requires them (issue 49): the digest that will run
//! (the present image's, the reference's own, or its tag resolved once at the registry), cosign's
//! signatures for that digest read from the image's repository with the pull's credentials, and
//! the policy's requirements checked against them ([`crate::policy::sigstore`]). A result is kept
//! by (digest, requirement), in memory and on disk across restarts, so a present image verified
//! once is answered without its registry, and a policy reload (or a restart) that changes a
//! requirement leaves what it covered behind; verifications of one image under way at once are one.
//!
//! - `fetch`: the tag resolved, the signature manifest and its payloads read, bounded;
//! - `cache`: verified digests by requirement, and the verifications under way;
//! - `requirement`: a requirement's name across restarts (a digest of its canonical form);
//! - `stored`: the verified digests kept on disk, written off the request path, read back at
//!   start as hostile input;
//! - `metrics`: verifications by result, their time, signatures fetched, cache hits;
//! - `health`: the registry's circuit breaker, asked before reading it and told how it answered.

mod cache;
mod fetch;
mod health;
mod metrics;
mod requirement;
mod stored;

use std::{
    sync::{Arc, OnceLock},
    time::Duration,
};

use futures_util::{FutureExt, future::BoxFuture};

use self::{cache::Flights, cache::VerifiedCache};
pub use self::{
    fetch::FetchLimits,
    health::{Reached, RegistryHealth, RegistryVisit, unreachable},
    metrics::SignatureMetrics,
    stored::VerifiedFile,
};
use crate::{
    credentials::Credential,
    policy::{PolicySource, SigstoreSigned, Verdict, sigstore},
    reference::ImageReference,
    registry::{RegistryError, RegistryHosts},
};

/// An image whose signatures met every requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The manifest digest verified: the one that may run.
    pub digest: String,
    /// Per requirement, the key (fingerprint) and the signature (its layer's digest) that met it.
    pub by: Vec<(String, String)>,
}

/// Which policy and scope required a verification: kept with what it verified, and counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Under {
    pub policy: PolicySource,
    /// As [`Verdict::scope`]: a `transports.docker` key, or `None` for the policy's default.
    pub scope: Option<String>,
}

impl Under {
    pub fn of(verdict: &Verdict) -> Self {
        Self { policy: verdict.policy.clone(), scope: verdict.scope.clone() }
    }

    /// The metrics' `policy` label: a namespace's name would be a label without bound.
    pub fn label(&self) -> &'static str {
        match self.policy {
            PolicySource::Namespace(_) => "namespace",
            PolicySource::Default | PolicySource::None => "default",
        }
    }
}

/// Why an image's signatures were not accepted.
#[derive(Debug, thiserror::Error)]
pub enum SignatureError {
    #[error("the image's manifest {0} was not found at its registry")]
    NoManifest(String),
    #[error("no signature for {digest} in {repository} (no cosign signature manifest {tag}, none among its referrers)")]
    NoSignatures { digest: String, repository: String, tag: String },
    #[error("the signature manifest for {digest}: {reason}")]
    BadArtifact { digest: String, reason: String },
    #[error("{reason}")]
    Rejected { digest: String, reason: String },
    #[error("reading signatures: {0}")]
    Registry(#[from] RegistryError),
    #[error("reading signatures took longer than {0:?}")]
    TimedOut(Duration),
    /// The registry's circuit breaker is open: its words.
    #[error("{0}")]
    RegistryUnavailable(String),
}

impl SignatureError {
    /// The digest whose signatures were read, when it was known before the failure.
    pub fn digest(&self) -> Option<&str> {
        match self {
            Self::NoSignatures { digest, .. } | Self::BadArtifact { digest, .. } | Self::Rejected { digest, .. } => {
                Some(digest)
            }
            Self::NoManifest(_) | Self::Registry(_) | Self::TimedOut(_) | Self::RegistryUnavailable(_) => None,
        }
    }
}

/// The signature checks of the node; shared by every entry point.
pub struct Signatures {
    limits: FetchLimits,
    cache: VerifiedCache,
    flights: Flights,
    metrics: Arc<SignatureMetrics>,
    /// Where signatures are read from: containerd's registry host settings.
    hosts: Arc<RegistryHosts>,
    /// Where what is verified is kept across restarts ([`Signatures::keep`]); none: memory only.
    file: Option<VerifiedFile>,
    /// The pulls' circuit breakers ([`Signatures::watched_by`]); none: not asked.
    health: OnceLock<Arc<dyn RegistryHealth>>,
}

impl Signatures {
    pub fn new(limits: FetchLimits, metrics: Arc<SignatureMetrics>) -> Self {
        let (cache, flights, hosts) = (VerifiedCache::default(), Flights::default(), Arc::default());
        Self { limits, cache, flights, metrics, hosts, file: None, health: OnceLock::new() }
    }

    /// Keeps what is verified in `file`, once [`Signatures::keep`] runs.
    pub fn kept_in(mut self, file: VerifiedFile) -> Self {
        self.file = Some(file);
        self
    }

    /// Reads signatures from the hosts `hosts` names (containerd's defaults without it).
    pub fn with_registry_hosts(mut self, hosts: Arc<RegistryHosts>) -> Self {
        self.hosts = hosts;
        self
    }

    /// The registry hosts signatures are read from, for whatever else reads the registries.
    pub fn registry_hosts(&self) -> Arc<RegistryHosts> {
        self.hosts.clone()
    }

    /// What `digest` was verified as under exactly these requirements, if it was.
    /// Asks and tells `health` (the pulls' breakers) from now on (set once).
    pub fn watched_by(&self, health: Arc<dyn RegistryHealth>) {
        let _ = self.health.set(health);
    }

    pub fn cached(&self, digest: &str, requirements: &[Arc<SigstoreSigned>]) -> Option<Verified> {
        self.cache.get(digest, requirements)
    }

    /// Under which policies `digest` was verified (the newest 4,096 verifications kept, across
    /// restarts).
    pub fn verified_under(&self, digest: &str) -> Vec<(Under, Verified)> {
        self.cache.under(digest)
    }

    /// The verifications' counters, for GetStatus.
    pub fn metrics(&self) -> &SignatureMetrics {
        &self.metrics
    }

    /// Verifies `reference` under `requirements` (each must be met): at `digest` when the digest
    /// that will run is known (a present image's, or the reference's own), else at the digest
    /// its tag names now. `credentials` are tried in turn, as the pull tries them; `under` is
    /// the policy that asks, counted and kept with the result.
    pub async fn verify(
        &self,
        reference: &ImageReference,
        digest: Option<&str>,
        (requirements, under): (&[Arc<SigstoreSigned>], &Under),
        credentials: &[Arc<Credential>],
    ) -> Result<Verified, Arc<SignatureError>> {
        let digest = digest.or(reference.digest());
        if let Some(digest) = digest
            && let Some(verified) = self.cache.get(digest, requirements)
        {
            self.metrics.cache_hit();
            return Ok(verified);
        }
        let key = format!("{}|{}|{requirements:?}", reference.name(), digest.unwrap_or(reference.tag().unwrap_or("")));
        let work = {
            let (reference, digest) = (reference.clone(), digest.map(str::to_owned));
            let (requirements, credentials) = (requirements.to_vec(), credentials.to_vec());
            let (limits, metrics, policy) = (self.limits.clone(), self.metrics.clone(), under.label());
            let (hosts, health) = (self.hosts.current(), self.health.get().cloned());
            async move {
                let started = tokio::time::Instant::now();
                let visit = match health.map(|health| health.visit(reference.domain())).transpose() {
                    Ok(visit) => visit,
                    Err(refused) => {
                        let result = Err(SignatureError::RegistryUnavailable(refused));
                        metrics.verified(&result, policy, started.elapsed());
                        return result.map_err(Arc::new);
                    }
                };
                let enough = |digest: &str, found: &[(sigstore::Layer, Vec<u8>)]| {
                    requirements
                        .iter()
                        .all(|requirement| sigstore::verify(requirement, &reference, digest, found).is_ok())
                };
                let reading = fetch::Reading { hosts: &hosts, limits: &limits, metrics: &metrics, enough: &enough };
                let fetched = tokio::time::timeout(
                    limits.deadline,
                    fetch::signatures(&reference, digest.as_deref(), &credentials, &reading),
                )
                .await
                .unwrap_or(Err(SignatureError::TimedOut(limits.deadline)));
                if let Some(visit) = visit {
                    visit.ended(Reached::of(&fetched));
                }
                let result = fetched.and_then(|found| check(&reference, &requirements, found));
                metrics.verified(&result, policy, started.elapsed());
                result.map_err(Arc::new)
            }
            .boxed()
        };
        let result = self.flights.join(key, work as BoxFuture<'static, _>).await;
        if let Ok(verified) = &result {
            self.cache.put(&verified.digest, requirements, (under.clone(), verified.clone()));
        }
        result
    }
}

/// Every requirement met by some signature of the digest fetched.
fn check(
    reference: &ImageReference,
    requirements: &[Arc<SigstoreSigned>],
    found: fetch::Found,
) -> Result<Verified, SignatureError> {
    let mut by = Vec::with_capacity(requirements.len());
    for requirement in requirements {
        match sigstore::verify(requirement, reference, &found.digest, &found.signatures) {
            Ok(accepted) => by.push((accepted.key, accepted.layer)),
            Err(rejected) => {
                return Err(SignatureError::Rejected { digest: found.digest, reason: rejected.to_string() });
            }
        }
    }
    Ok(Verified { digest: found.digest, by })
}
