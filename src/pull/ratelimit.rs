//! Registry rate limits on upstream pulls, as a tower layer over governor.
//!
//! Like the kubelet's `throttledImageService`, only PullImage is limited, never presence checks.
//! By default a pull over the limit fails at once with `pull QPS exceeded`; in wait mode it
//! queues until a token frees up. A registry host may have a bucket of its own.

use std::{
    collections::HashMap,
    num::NonZeroU32,
    sync::{Arc, Mutex, PoisonError, RwLock},
    task::{Context, Poll},
    time::Duration,
};

use governor::{
    Quota, RateLimiter,
    clock::{Clock, Reference},
    middleware::StateInformationMiddleware,
    state::{InMemoryState, NotKeyed},
};
use tower::{Layer, Service, ServiceExt};

use crate::{
    pull::{Pull, PullError, PullFuture, Pulled, metrics::PullMetrics},
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

    fn quota(&self) -> Quota {
        let period = Duration::from_secs_f64(1.0 / self.qps).max(Duration::from_nanos(1));
        Quota::with_period(period).unwrap_or_else(|| Quota::per_second(NonZeroU32::MAX)).allow_burst(self.burst)
    }
}

/// Every registry limit the daemon applies.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RateLimitConfig {
    /// The bucket for registries without one of their own; `None` for no limit.
    pub global: Option<RateLimit>,
    /// Registry hosts (as in the image reference, port included) with a bucket of their own.
    pub per_host: Vec<(String, RateLimit)>,
    pub mode: RateLimitMode,
}

impl RateLimitConfig {
    /// The kubelet's defaults: 5 pulls a second, bursts of 10, failing when over.
    pub fn kubelet() -> Self {
        let global = RateLimit { qps: 5.0, burst: NonZeroU32::new(10).unwrap_or(NonZeroU32::MIN) };
        Self { global: Some(global), per_host: Vec::new(), mode: RateLimitMode::Fail }
    }
}

/// tokio's clock for governor, so rate limits follow tokio's (pausable) time.
#[derive(Debug, Clone)]
pub struct TokioClock {
    start: tokio::time::Instant,
}

impl Default for TokioClock {
    fn default() -> Self {
        Self { start: tokio::time::Instant::now() }
    }
}

impl Clock for TokioClock {
    type Instant = Duration;

    fn now(&self) -> Duration {
        self.start.elapsed()
    }
}

type Limiter<C> = RateLimiter<NotKeyed, InMemoryState, C, StateInformationMiddleware>;

/// One token bucket, and what it had left after the last pull it admitted.
struct Bucket<C: Clock> {
    limiter: Limiter<C>,
    limit: RateLimit,
    /// governor cannot be asked without taking a token: the tokens left at the last admission,
    /// and when, tell how many there are now.
    last_admitted: Mutex<Option<(C::Instant, u32)>>,
}

/// A bucket as GetStatus shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketStatus {
    /// `None` for the bucket of registries without one of their own.
    pub host: Option<String>,
    pub limit: RateLimit,
    /// Pulls it would admit now, with the fraction of the next one refilled.
    pub tokens: f64,
}

/// The buckets, shared by every clone of the layer's service.
pub struct RegistryLimits<C: Clock> {
    /// Replaced whole on a reload; a bucket whose limit did not change is carried over, tokens
    /// and all.
    buckets: RwLock<Arc<Buckets<C>>>,
    clock: C,
    metrics: Arc<PullMetrics>,
}

struct Buckets<C: Clock> {
    global: Option<Arc<Bucket<C>>>,
    per_host: HashMap<String, Arc<Bucket<C>>>,
    mode: RateLimitMode,
}

impl<C: Clock + Clone> RegistryLimits<C> {
    pub fn new(config: &RateLimitConfig, clock: C, metrics: Arc<PullMetrics>) -> Self {
        let empty = Buckets { global: None, per_host: HashMap::new(), mode: config.mode };
        let buckets = RwLock::new(Arc::new(empty.reconfigured(config, &clock)));
        Self { buckets, clock, metrics }
    }

    /// Applies `config` to the pulls admitted from now on (a reload). A bucket keeps its tokens
    /// while its limit stays the same; a new or changed one starts full.
    pub fn reconfigure(&self, config: &RateLimitConfig) {
        let mut buckets = self.buckets.write().unwrap_or_else(PoisonError::into_inner);
        *buckets = Arc::new(buckets.reconfigured(config, &self.clock));
    }

    fn current(&self) -> Arc<Buckets<C>> {
        self.buckets.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    pub fn mode(&self) -> RateLimitMode {
        self.current().mode
    }

    /// Every bucket and its tokens now: the default one first, then by host.
    pub fn buckets(&self) -> Vec<BucketStatus> {
        let now = self.clock.now();
        let status = |host: Option<&String>, bucket: &Bucket<C>| {
            let burst = f64::from(bucket.limit.burst.get());
            let last = *bucket.last_admitted.lock().unwrap_or_else(PoisonError::into_inner);
            let tokens = match last {
                None => burst,
                Some((at, left)) => {
                    let refilled = Duration::from(now.duration_since(at)).as_secs_f64() * bucket.limit.qps;
                    (f64::from(left) + refilled).min(burst)
                }
            };
            BucketStatus { host: host.cloned(), limit: bucket.limit, tokens }
        };
        let buckets = self.current();
        let mut hosts: Vec<(&String, &Arc<Bucket<C>>)> = buckets.per_host.iter().collect();
        hosts.sort_by_key(|(host, _)| *host);
        let global = buckets.global.as_ref().map(|bucket| status(None, bucket));
        global.into_iter().chain(hosts.into_iter().map(|(host, bucket)| status(Some(host), bucket))).collect()
    }

    /// Takes a token for `host`; `Err(wait)` says when one frees up.
    fn take(&self, host: Option<&str>) -> Result<(), Duration> {
        let buckets = self.current();
        let Some(bucket) = host.and_then(|host| buckets.per_host.get(host)).or(buckets.global.as_ref()) else {
            return Ok(());
        };
        match bucket.limiter.check() {
            Ok(snapshot) => {
                let left = snapshot.remaining_burst_capacity();
                *bucket.last_admitted.lock().unwrap_or_else(PoisonError::into_inner) = Some((self.clock.now(), left));
                Ok(())
            }
            Err(not_until) => Err(not_until.wait_time_from(self.clock.now())),
        }
    }

    /// Admits a pull to `host`, failing or waiting as the mode (or `always_wait`) says.
    async fn admit(&self, host: Option<&str>, always_wait: bool) -> Result<(), PullError> {
        let wait = always_wait || self.mode() == RateLimitMode::Wait;
        let mut counted = false;
        loop {
            let Err(until_free) = self.take(host) else { return Ok(()) };
            if !counted {
                self.metrics.throttled();
                counted = true;
            }
            if !wait {
                return Err(PullError::RateLimited);
            }
            // A zero wait would spin; governor's clock may round below tokio's tick.
            tokio::time::sleep(until_free.max(Duration::from_millis(1))).await;
        }
    }
}

impl<C: Clock + Clone> Buckets<C> {
    /// The buckets `config` asks for, reusing each of these whose limit is unchanged.
    fn reconfigured(&self, config: &RateLimitConfig, clock: &C) -> Self {
        let bucket = |limit: &RateLimit, old: Option<&Arc<Bucket<C>>>| match old {
            Some(old) if old.limit == *limit => old.clone(),
            _ => Arc::new(Bucket {
                limiter: RateLimiter::direct_with_clock(limit.quota(), clock.clone()).with_middleware(),
                limit: *limit,
                last_admitted: Mutex::new(None),
            }),
        };
        Self {
            global: config.global.as_ref().map(|limit| bucket(limit, self.global.as_ref())),
            per_host: config
                .per_host
                .iter()
                .map(|(host, limit)| (host.clone(), bucket(limit, self.per_host.get(host))))
                .collect(),
            mode: config.mode,
        }
    }
}

/// The layer: limits the pulls of the service it wraps.
pub struct RateLimitLayer<C: Clock> {
    limits: Arc<RegistryLimits<C>>,
}

impl<C: Clock> RateLimitLayer<C> {
    pub fn new(limits: Arc<RegistryLimits<C>>) -> Self {
        Self { limits }
    }
}

impl<S, C: Clock> Layer<S> for RateLimitLayer<C> {
    type Service = RateLimited<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimited { inner, limits: self.limits.clone() }
    }
}

/// A pull service behind the registry limits.
pub struct RateLimited<S, C: Clock> {
    inner: S,
    limits: Arc<RegistryLimits<C>>,
}

impl<S: Clone, C: Clock> Clone for RateLimited<S, C> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone(), limits: self.limits.clone() }
    }
}

impl<S, C> Service<Pull> for RateLimited<S, C>
where
    S: Service<Pull, Response = Pulled, Error = PullError> + Clone + Send + 'static,
    S::Future: Send,
    C: Clock + Clone + Send + Sync + 'static,
    <C as Clock>::Instant: Reference + Send + Sync,
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
            let host = pull.reference.as_deref().map(ImageReference::domain);
            limits.admit(host, pull.wait_for_rate_limit).await?;
            inner.oneshot(pull).await
        })
    }
}

#[cfg(test)]
mod tests;
