//! Registry rate limits on upstream pulls, as a tower layer.
//!
//! Like the kubelet's `throttledImageService`, only PullImage is limited, never presence checks.
//! By default a pull over the limit fails at once with `pull QPS exceeded`; in wait mode it
//! queues until a token frees up. Unlike the kubelet's one bucket for the node, each registry host
//! has a bucket of its own: the limit spares a registry, and a registry that hangs or is slow must
//! not spend the quota of the others (measured: beside ten pulls to a hung registry, half of the
//! pods of a healthy one were refused with one bucket for the node). A host may be given a limit of
//! its own, and gets a lower one while it answers 429 (`adaptive`).

mod adaptive;
mod bucket;

use std::{
    collections::HashMap,
    num::NonZeroU32,
    sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock},
    task::{Context, Poll},
    time::Duration,
};

use tokio::{sync::watch, time::Instant};
use tower::{Layer, Service, ServiceExt};

pub use self::adaptive::AdaptiveConfig;
use self::{
    adaptive::{Lowered, UNLIMITED_START},
    bucket::TokenBucket,
};
use crate::{
    events::{Event, EventType, Events, reason},
    pull::{
        Pull, PullError, PullFuture, Pulled,
        breaker::failure::{Failure, classify},
        metrics::PullMetrics,
    },
    reference::ImageReference,
};

/// What happens to a pull over the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RateLimitMode {
    /// Fail at once with `pull QPS exceeded`, as the kubelet does.
    #[default]
    Fail,
    /// Wait until a token frees up, bounded by the caller's deadline.
    Wait,
}

/// A token bucket: `qps` pulls a second on average, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    pub qps: f64,
    pub burst: NonZeroU32,
}

/// A rate limit that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RateLimitError {
    #[error("registry QPS {0:?} must be a finite number, 0 or more")]
    BadQps(String),
    #[error("registry burst must be at least 1 when QPS is above 0")]
    ZeroBurst,
}

impl RateLimit {
    /// `None` when `qps` is 0 (no limit), as the kubelet's `--registry-qps=0`.
    pub fn try_new(qps: f64, burst: u32) -> Result<Option<Self>, RateLimitError> {
        if !qps.is_finite() || qps < 0.0 {
            return Err(RateLimitError::BadQps(qps.to_string()));
        }
        if qps == 0.0 {
            return Ok(None);
        }
        let burst = NonZeroU32::new(burst).ok_or(RateLimitError::ZeroBurst)?;
        Ok(Some(Self { qps, burst }))
    }
}

/// Every registry limit the daemon applies.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RateLimitConfig {
    /// The limit of each registry host without one of its own; `None` for no limit.
    pub each_host: Option<RateLimit>,
    /// Registry hosts (as in the image reference, port included) with a bucket of their own.
    pub per_host: Vec<(String, RateLimit)>,
    pub mode: RateLimitMode,
    /// How a registry's rate drops while it answers 429, and comes back.
    pub adaptive: AdaptiveConfig,
}

impl RateLimitConfig {
    /// The kubelet's defaults: 5 pulls a second, bursts of 10, failing when over (for each
    /// registry host, where the kubelet has them for the node).
    pub fn kubelet() -> Self {
        let each_host = RateLimit { qps: 5.0, burst: NonZeroU32::new(10).unwrap_or(NonZeroU32::MIN) };
        Self {
            each_host: Some(each_host),
            per_host: Vec::new(),
            mode: RateLimitMode::Fail,
            adaptive: AdaptiveConfig::default(),
        }
    }
}

type Bucket = Mutex<TokenBucket>;

/// A bucket as GetStatus shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketStatus {
    /// `None` for the limit of registries without one of their own (its tokens: those of the
    /// bucket shared by pulls past [`MAX_HOSTS`] hosts, and of names without one).
    pub host: Option<String>,
    pub limit: RateLimit,
    /// Pulls it would admit now, with the fraction of the next one refilled.
    pub tokens: f64,
    /// While the registry's rate is lowered after a 429: the limit it had.
    pub lowered_from: Option<RateLimit>,
}

/// The buckets, shared by every clone of the layer's service.
pub struct RegistryLimits {
    /// Replaced whole on a reload; a bucket whose limit did not change is carried over, tokens
    /// and all.
    buckets: RwLock<Arc<Buckets>>,
    /// Registries whose rate is lowered after a 429, each with a bucket of its own meanwhile.
    lowered: Mutex<HashMap<String, Lowered>>,
    metrics: Arc<PullMetrics>,
    events: Arc<Events>,
}

struct Buckets {
    /// The limit each host without a configured bucket gets one of.
    each_host: Option<RateLimit>,
    /// Hosts given a limit of their own.
    per_host: HashMap<String, Arc<Bucket>>,
    /// Buckets of `each_host`, made as hosts are first pulled from (at most [`MAX_HOSTS`]).
    seen: Mutex<HashMap<String, Arc<Bucket>>>,
    /// Shared by the pulls of hosts past [`MAX_HOSTS`] and of names without a host.
    others: Option<Arc<Bucket>>,
    mode: RateLimitMode,
    adaptive: AdaptiveConfig,
}

/// The most registries with a lowered rate; past it, a new one keeps its configured bucket.
const MAX_LOWERED: usize = 256;

/// The most hosts with a bucket of `each_host` of their own; past it, pulls share one, so that
/// names crafted to differ cannot grow the map without bound.
pub const MAX_HOSTS: usize = 256;

impl RegistryLimits {
    pub fn new(config: &RateLimitConfig, metrics: Arc<PullMetrics>, events: Arc<Events>) -> Self {
        let empty = Buckets {
            each_host: None,
            per_host: HashMap::new(),
            seen: Mutex::default(),
            others: None,
            mode: config.mode,
            adaptive: config.adaptive,
        };
        let buckets = RwLock::new(Arc::new(empty.reconfigured(config, Instant::now())));
        Self { buckets, lowered: Mutex::default(), metrics, events }
    }

    /// Applies `config` to the pulls admitted from now on (a reload). A bucket keeps its tokens
    /// while its limit stays the same; a new or changed one starts full.
    pub fn reconfigure(&self, config: &RateLimitConfig) {
        let mut buckets = self.buckets.write().unwrap_or_else(PoisonError::into_inner);
        *buckets = Arc::new(buckets.reconfigured(config, Instant::now()));
    }

    fn current(&self) -> Arc<Buckets> {
        self.buckets.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn lowered(&self) -> MutexGuard<'_, HashMap<String, Lowered>> {
        self.lowered.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn mode(&self) -> RateLimitMode {
        self.current().mode
    }

    /// Every bucket and its tokens now: the default one first, then by host (a lowered registry
    /// shows its lowered bucket).
    pub fn buckets(&self) -> Vec<BucketStatus> {
        let now = Instant::now();
        let buckets = self.current();
        let lowered = self.recovered(now, &buckets.adaptive);
        let status = |host: Option<&String>, bucket: &Bucket| {
            let bucket = bucket.lock().unwrap_or_else(PoisonError::into_inner);
            BucketStatus { host: host.cloned(), limit: bucket.limit(), tokens: bucket.tokens(now), lowered_from: None }
        };
        let seen = buckets.seen().clone();
        let mut hosts: Vec<BucketStatus> = buckets
            .per_host
            .iter()
            .chain(seen.iter())
            .filter(|(host, _)| !lowered.contains_key(*host))
            .map(|(host, bucket)| status(Some(host), bucket))
            .chain(lowered.iter().map(|(host, lowered)| BucketStatus {
                host: Some(host.clone()),
                limit: lowered.bucket.limit(),
                tokens: lowered.bucket.tokens(now),
                lowered_from: Some(lowered.configured()),
            }))
            .collect();
        hosts.sort_by(|a, b| a.host.cmp(&b.host));
        let others = buckets.others.as_ref().map(|bucket| status(None, bucket));
        others.into_iter().chain(hosts).collect()
    }

    /// The lowered registries, those whose rate recovered at `now` forgotten.
    fn recovered(&self, now: Instant, config: &AdaptiveConfig) -> MutexGuard<'_, HashMap<String, Lowered>> {
        let mut lowered = self.lowered();
        lowered.retain(|host, registry| {
            let back = registry.recover(now, config);
            self.metrics.registry_rate(host, (!back).then(|| registry.qps()));
            if back {
                tracing::info!(registry = %host, qps = registry.configured().qps, "no 429 for a while: the registry's pull rate is back");
            }
            !back
        });
        lowered
    }

    /// Takes a token for `host`; `Err(wait)` says when one frees up.
    fn take(&self, host: Option<&str>) -> Result<(), Duration> {
        let now = Instant::now();
        let buckets = self.current();
        if let Some(host) = host {
            let mut lowered = self.recovered(now, &buckets.adaptive);
            if let Some(lowered) = lowered.get_mut(host) {
                return lowered.bucket.take(now);
            }
        }
        let Some(bucket) = buckets.of(host, now) else { return Ok(()) };
        bucket.lock().unwrap_or_else(PoisonError::into_inner).take(now)
    }

    /// `host` answered 429: its rate is lowered (halved; at most once a moment).
    fn too_many_requests(&self, host: &str) {
        self.metrics.too_many_requests();
        let now = Instant::now();
        let buckets = self.current();
        let mut lowered = self.recovered(now, &buckets.adaptive);
        let before = lowered.get(host).map(Lowered::qps);
        if let Some(registry) = lowered.get_mut(host) {
            if !registry.lower(now, &buckets.adaptive) {
                return;
            }
        } else {
            if lowered.len() >= MAX_LOWERED {
                return;
            }
            let configured = buckets
                .of(Some(host), now)
                .map_or(UNLIMITED_START, |bucket| bucket.lock().unwrap_or_else(PoisonError::into_inner).limit());
            lowered.insert(host.to_owned(), Lowered::new(configured, now, &buckets.adaptive));
        }
        let Some(registry) = lowered.get(host) else { return };
        let (qps, configured) = (registry.qps(), registry.configured());
        self.metrics.registry_rate(host, Some(qps));
        let message = format!(
            "registry {host:?} answered 429 Too Many Requests: its pulls are limited to {qps:.2} a second (was {:.2}), \
             rising again after {} without another",
            before.unwrap_or(configured.qps),
            crate::messages::go_duration_millis(buckets.adaptive.recovery)
        );
        tracing::warn!(registry = %host, qps, "{message}");
        self.events.publish(Event::new(EventType::Warning, reason::REGISTRY_THROTTLED, message));
    }

    /// Admits a pull to `host`, failing or waiting as the mode (or `always_wait`) says.
    async fn admit(
        &self,
        host: Option<&str>,
        always_wait: bool,
        cleared: Option<&watch::Sender<Option<Instant>>>,
    ) -> Result<(), PullError> {
        let wait = always_wait || self.mode() == RateLimitMode::Wait;
        let mut counted = false;
        loop {
            let Err(until_free) = self.take(host) else {
                if counted && let Some(cleared) = cleared {
                    cleared.send_replace(Some(Instant::now()));
                }
                return Ok(());
            };
            if !counted {
                self.metrics.throttled();
                counted = true;
            }
            if !wait {
                return Err(PullError::RateLimited);
            }
            if let Some(cleared) = cleared {
                cleared.send_replace(None);
            }
            // A zero wait would spin.
            tokio::time::sleep(until_free.max(Duration::from_millis(1))).await;
        }
    }
}

impl Buckets {
    fn seen(&self) -> MutexGuard<'_, HashMap<String, Arc<Bucket>>> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The bucket a pull to `host` takes its token from: the host's configured one, else its own
    /// of `each_host` (made now if it is the first pull there), else the shared one.
    fn of(&self, host: Option<&str>, now: Instant) -> Option<Arc<Bucket>> {
        let Some(host) = host else { return self.others.clone() };
        if let Some(bucket) = self.per_host.get(host) {
            return Some(bucket.clone());
        }
        let limit = self.each_host?;
        let mut seen = self.seen();
        if let Some(bucket) = seen.get(host) {
            return Some(bucket.clone());
        }
        if seen.len() >= MAX_HOSTS {
            return self.others.clone();
        }
        let bucket = Arc::new(Mutex::new(TokenBucket::full(limit, now)));
        seen.insert(host.to_owned(), bucket.clone());
        Some(bucket)
    }

    /// The buckets `config` asks for, reusing each of these whose limit is unchanged.
    fn reconfigured(&self, config: &RateLimitConfig, now: Instant) -> Self {
        let bucket = |limit: &RateLimit, old: Option<&Arc<Bucket>>| match old {
            Some(old) if old.lock().unwrap_or_else(PoisonError::into_inner).limit() == *limit => old.clone(),
            _ => Arc::new(Mutex::new(TokenBucket::full(*limit, now))),
        };
        let per_host: HashMap<String, Arc<Bucket>> = config
            .per_host
            .iter()
            .map(|(host, limit)| (host.clone(), bucket(limit, self.per_host.get(host))))
            .collect();
        // The hosts' own buckets of an unchanged limit keep their tokens; a new limit starts
        // them again, full, at their next pull.
        let seen = match config.each_host {
            Some(limit) if self.each_host == Some(limit) => self
                .seen()
                .iter()
                .filter(|(host, _)| !per_host.contains_key(*host))
                .map(|(host, old)| (host.clone(), old.clone()))
                .collect(),
            _ => HashMap::new(),
        };
        Self {
            each_host: config.each_host,
            others: config.each_host.as_ref().map(|limit| bucket(limit, self.others.as_ref())),
            per_host,
            seen: Mutex::new(seen),
            mode: config.mode,
            adaptive: config.adaptive,
        }
    }
}

/// The layer: limits the pulls of the service it wraps.
pub struct RateLimitLayer {
    limits: Arc<RegistryLimits>,
}

impl RateLimitLayer {
    pub fn new(limits: Arc<RegistryLimits>) -> Self {
        Self { limits }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimited { inner, limits: self.limits.clone() }
    }
}

/// A pull service behind the registry limits.
pub struct RateLimited<S> {
    inner: S,
    limits: Arc<RegistryLimits>,
}

impl<S: Clone> Clone for RateLimited<S> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone(), limits: self.limits.clone() }
    }
}

impl<S> Service<Pull> for RateLimited<S>
where
    S: Service<Pull, Response = Pulled, Error = PullError> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Pulled;
    type Error = PullError;
    type Future = PullFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), PullError>> {
        // Readiness depends on the request's registry, so admission happens in `call`.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, pull: Pull) -> Self::Future {
        let limits = self.limits.clone();
        let inner = self.inner.clone();
        Box::pin(async move {
            let reference = pull.reference.clone();
            let host = reference.as_deref().map(ImageReference::domain);
            limits.admit(host, pull.wait_for_rate_limit, pull.cleared.as_deref()).await?;
            let result = inner.oneshot(pull).await;
            if let (Err(error), Some(host)) = (&result, host)
                && classify(error) == Failure::TooManyRequests
            {
                limits.too_many_requests(host);
            }
            result
        })
    }
}

#[cfg(test)]
mod tests;
