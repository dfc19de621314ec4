//! The pull scheduler: a fair cap on parallel pulls, and single-flight so that identical
//! concurrent pulls share one upstream call.
//!
//! Each pull runs in its own task: a caller that gives up never aborts a pull others wait for.
//! A pull still queued when every caller has gone is dropped, so the queue moves on.

use std::{
    collections::HashMap,
    num::NonZeroUsize,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore, watch},
    time::Instant,
};
use tower::ServiceExt;

use crate::{
    cri::PullSpec,
    pull::{PullError, PullKey, PullService, Pulled},
};

/// How pulls are scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// The most upstream pulls at once; `None` for no cap. Serial pulls are `Some(1)`.
    pub max_parallel: Option<NonZeroUsize>,
    /// Bounds one upstream pull; `None` (the kubelet's default) waits as long as it takes.
    pub pull_timeout: Option<Duration>,
}

/// A pull's result, shared by everyone who waited for it.
pub type SharedResult = Result<Pulled, Arc<PullError>>;

/// What one caller got from [`PullScheduler::pull`].
#[derive(Debug, Clone)]
pub struct Scheduled {
    pub result: SharedResult,
    /// Whether this caller joined a pull another caller had started.
    pub joined: bool,
}

/// Counts the scheduler keeps, for metrics.
#[derive(Debug, Default)]
pub struct SchedulerStats {
    /// Pulls waiting for a slot.
    pub queued: std::sync::atomic::AtomicUsize,
    /// Pulls running upstream.
    pub running: std::sync::atomic::AtomicUsize,
}

type Slot = Arc<watch::Sender<Option<SharedResult>>>;

struct Shared {
    service: PullService,
    slots: Option<Arc<Semaphore>>,
    pull_timeout: Option<Duration>,
    in_flight: Mutex<HashMap<PullKey, Slot>>,
    stats: SchedulerStats,
    observer: Box<dyn Fn(PullEvent) + Send + Sync>,
}

/// Something that happened to a pull, for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PullEvent {
    /// A pull got its slot after waiting this long in the queue.
    Started { queued_for: Duration },
    /// A caller joined a pull already under way.
    Joined,
    /// A queued pull was dropped because every caller had gone.
    DroppedUnwanted,
}

/// The scheduler; cheap to clone.
#[derive(Clone)]
pub struct PullScheduler {
    shared: Arc<Shared>,
}

impl PullScheduler {
    pub fn new(service: PullService, config: SchedulerConfig) -> Self {
        Self::with_observer(service, config, |_| {})
    }

    /// A scheduler that reports each [`PullEvent`] to `observer`.
    pub fn with_observer(
        service: PullService,
        config: SchedulerConfig,
        observer: impl Fn(PullEvent) + Send + Sync + 'static,
    ) -> Self {
        let slots = config.max_parallel.map(|n| Arc::new(Semaphore::new(n.get())));
        let shared = Shared {
            service,
            slots,
            pull_timeout: config.pull_timeout,
            in_flight: Mutex::new(HashMap::new()),
            stats: SchedulerStats::default(),
            observer: Box::new(observer),
        };
        Self { shared: Arc::new(shared) }
    }

    /// Live counts, for metrics.
    pub fn stats(&self) -> &SchedulerStats {
        &self.shared.stats
    }

    /// Pulls `spec`, or joins an identical pull under way, and waits for the result.
    pub async fn pull(&self, spec: PullSpec) -> Scheduled {
        let key = PullKey::of(&spec);
        let (mut receiver, joined) = {
            let mut in_flight = self.shared.in_flight();
            match in_flight.get(&key) {
                Some(slot) => (slot.subscribe(), true),
                None => {
                    let (sender, receiver) = watch::channel(None);
                    let slot = Arc::new(sender);
                    in_flight.insert(key.clone(), slot.clone());
                    tokio::spawn(run(self.shared.clone(), key, spec, slot));
                    (receiver, false)
                }
            }
        };
        if joined {
            (self.shared.observer)(PullEvent::Joined);
        }
        let result = match receiver.wait_for(Option::is_some).await {
            Ok(value) => value.clone().unwrap_or_else(|| Err(Arc::new(PullError::Abandoned))),
            Err(_) => Err(Arc::new(PullError::Abandoned)),
        };
        Scheduled { result, joined }
    }
}

impl Shared {
    fn in_flight(&self) -> MutexGuard<'_, HashMap<PullKey, Slot>> {
        self.in_flight.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for a slot; `None` when every caller went away first (the pull is then forgotten).
    async fn acquire(&self, key: &PullKey, slot: &Slot) -> Option<Option<OwnedSemaphorePermit>> {
        let Some(slots) = &self.slots else { return Some(None) };
        use std::sync::atomic::Ordering::Relaxed;
        self.stats.queued.fetch_add(1, Relaxed);
        let acquired = tokio::select! {
            permit = slots.clone().acquire_owned() => permit.ok().map(Some),
            () = self.unwanted(key, slot) => None,
        };
        self.stats.queued.fetch_sub(1, Relaxed);
        acquired
    }

    /// Resolves once nobody waits for `key` any more, having removed it from the in-flight map.
    async fn unwanted(&self, key: &PullKey, slot: &Slot) {
        loop {
            slot.closed().await;
            let mut in_flight = self.in_flight();
            // A caller may have joined between the last receiver going and the lock.
            if slot.receiver_count() == 0 {
                in_flight.remove(key);
                return;
            }
        }
    }
}

async fn run(shared: Arc<Shared>, key: PullKey, spec: PullSpec, slot: Slot) {
    use std::sync::atomic::Ordering::Relaxed;
    let queued_at = Instant::now();
    let Some(permit) = shared.acquire(&key, &slot).await else {
        (shared.observer)(PullEvent::DroppedUnwanted);
        return;
    };
    (shared.observer)(PullEvent::Started { queued_for: queued_at.elapsed() });
    shared.stats.running.fetch_add(1, Relaxed);
    let call = shared.service.clone().oneshot(spec);
    let result = match shared.pull_timeout {
        // Dropping the call on expiry cancels the upstream request.
        Some(limit) => tokio::time::timeout(limit, call).await.unwrap_or(Err(PullError::TimedOut(limit))),
        None => call.await,
    };
    shared.stats.running.fetch_sub(1, Relaxed);
    drop(permit);
    // Forget the key before publishing, so a request arriving later starts a fresh pull.
    shared.in_flight().remove(&key);
    slot.send_replace(Some(result.map_err(Arc::new)));
}

#[cfg(test)]
mod tests;
