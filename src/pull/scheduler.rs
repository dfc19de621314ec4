//! The pull scheduler: a fair cap on parallel pulls, and single-flight so that identical
//! concurrent pulls share one upstream call. Each pull is bounded by `--image-pull-timeout` and,
//! where its downloads can be watched ([`super::poller`]), cancelled when they stall.
//!
//! Each pull runs in its own task: a caller that gives up never aborts a pull others wait for.
//! A pull every caller has left is cancelled, as the runtime cancels a PullImage whose caller
//! leaves: still queued, it is dropped, so the queue moves on; running, its upstream call is
//! dropped, which cancels the runtime's pull and leaves no image behind.
//!
//! Slots are for pulls that move bytes: a pull whose registry has not answered for the answer
//! grace gives its slot back (and the registry's next pulls wait for it, see [`super::breaker`]);
//! one still unanswered at the resolve timeout fails with `RegistryUnavailable`. So a registry
//! that hangs never holds the node's pulls, and serial pulls still mean one download at a time,
//! but for a pull that waited without a slot and whose registry answered at last.
//!
//! Small pulls do not wait behind big ones nor share the link with them: pulls waiting for a slot
//! take one cheapest first (`cheapest_first`), and a pull that turns out big makes way, once, for
//! the pods' pulls that are much cheaper, and goes on from what it fetched ([`yielding`]).
//!
//! Pods first: a pre-pull never holds a slot a pod's pull waits for (`pods_first`).
//!
//! Callers differ in what a registry rate limit does to them: EnsureImageExists (the kubelet's
//! way) fails at once, a CRI PullImage waits for a token. A shared pull waits if any caller that
//! joined it before it was admitted would wait: the pull runs anyway for that caller, so sharing
//! it costs the registry nothing more, and every caller's own deadline still bounds its wait.
//! (Taking a token per caller would refuse most of a herd; keying pulls by mode would pull twice.)

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering},
    },
    time::{Duration, SystemTime},
};

use tokio::{
    sync::{Notify, OwnedSemaphorePermit, Semaphore, watch},
    time::Instant,
};

mod admission;
mod cheapest_first;
mod config;
mod pods_first;
mod state;
mod task;
pub mod yielding;

use self::{
    cheapest_first::{Line, Ranking},
    task::run,
    yielding::Queued,
};
pub use self::{
    config::{DEFAULT_MAX_PARALLEL, DEFAULT_YIELD_ABOVE, SchedulerConfig},
    state::{InFlight, PullState},
};

use crate::{
    events::{Events, Pod},
    pull::{
        Pull, PullClass, PullError, PullKey, PullService, Pulled,
        breaker::Breakers,
        metrics::PullMetrics,
        poller::{MAX_WAITING_PODS, Report, TrackPulls, WaitingPods},
        size::SizePulls,
    },
};

/// Frees room on the image filesystem before a pull starts (image GC, as the composition root
/// wires it).
pub trait MakeRoom: Send + Sync {
    fn make_room(&self) -> futures_util::future::BoxFuture<'_, ()>;
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

impl Scheduled {
    /// The caller went away before the pull ended.
    pub fn cancelled() -> Self {
        Self { result: Err(Arc::new(PullError::Cancelled)), joined: false }
    }
}

/// One pull under way, shared by its callers.
struct PullSlot {
    result: watch::Sender<Option<SharedResult>>,
    /// The image, as the first caller asked for it (never its credentials).
    image: String,
    asked_at: SystemTime,
    /// For the order of [`PullScheduler::in_flight`]: a stepped wall clock does not change it.
    asked: Instant,
    /// When the upstream pull began; `None` while it waits for a slot.
    started_at: Mutex<Option<SystemTime>>,
    /// Whether a caller that joined would rather wait for a registry token than fail. Set and read
    /// under the in-flight lock, so no caller joins after the pull decided it was refused.
    waits_for_rate_limit: AtomicBool,
    /// The pods waiting, for progress events; the first [`MAX_WAITING_PODS`].
    waiting: WaitingPods,
    /// The pull's progress reports, once it is downloading and they can be had.
    progress: Mutex<Option<watch::Receiver<Option<Report>>>>,
    /// A pre-pull until a pod's pull joins it.
    class: watch::Sender<PullClass>,
    /// Told when a pod's pull takes this pre-pull's slot.
    preempt: Notify,
    /// What it waits for now, as a [`PullState`]; set by its task as it goes.
    state: AtomicU8,
    /// Tells, while the upstream call runs, whether it waits for a registry token.
    cleared: Mutex<Option<Arc<watch::Sender<Option<Instant>>>>>,
    /// Its image's bytes as its registry's manifest says, where its downloads cannot be watched;
    /// 0 until read (see [`crate::pull::size`]).
    sized: AtomicU64,
    /// Its registry was asked for its size (once is enough, whatever the answer).
    size_asked: AtomicBool,
}

impl PullSlot {
    fn set_state(&self, state: PullState) {
        self.state.store(state as u8, Ordering::Relaxed);
    }

    /// What it waits for: its task's word, a call under way waiting for a token told apart.
    fn state(&self) -> PullState {
        let told = PullState::ALL.into_iter().find(|state| *state as u8 == self.state.load(Ordering::Relaxed));
        match told.unwrap_or(PullState::Slot) {
            PullState::Pulling => {
                let cleared = self.cleared.lock().unwrap_or_else(PoisonError::into_inner);
                match cleared.as_ref().is_some_and(|cleared| cleared.borrow().is_none()) {
                    true => PullState::RateLimit,
                    false => PullState::Pulling,
                }
            }
            state => state,
        }
    }

    /// Its progress at the last poll, once its downloads are seen.
    fn report(&self) -> Option<Report> {
        let progress = self.progress.lock().unwrap_or_else(PoisonError::into_inner);
        progress.as_ref().and_then(|reports| reports.borrow().clone())
    }

    /// What it costs, as far as is known: its bytes fetched and in all, from its downloads where
    /// they are watched, else from its registry's manifest (nothing known fetched).
    fn cost(&self) -> Option<Cost> {
        match self.report() {
            Some(report) => Some(Cost {
                done: report.progress.bytes_done,
                total: report.progress.bytes_total,
                held_in: report.held_in,
            }),
            None => match self.sized.load(Ordering::Relaxed) {
                0 => None,
                total => Some(Cost { done: 0, total, held_in: None }),
            },
        }
    }

    fn wait_for(&self, caller: Option<&Pod>) {
        let Some(caller) = caller else { return };
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if waiting.len() < MAX_WAITING_PODS && !waiting.iter().any(|pod| pod.uid == caller.uid) {
            waiting.push(caller.clone());
        }
    }
}

type Slot = Arc<PullSlot>;

/// A pull's cost as [`PullSlot::cost`] knows it.
struct Cost {
    done: u64,
    total: u64,
    /// The lease holding what it fetched, where one does (see [`yielding`]).
    held_in: Option<Arc<str>>,
}

/// How long a successful pull's result serves callers who decided to pull before it ended.
const RECENT: Duration = Duration::from_secs(10);

struct Shared {
    service: PullService,
    slots: Option<Arc<Semaphore>>,
    config: SchedulerConfig,
    breakers: Arc<Breakers>,
    in_flight: Mutex<HashMap<PullKey, Slot>>,
    /// Successful pulls of the last [`RECENT`], with when each ended: a caller that saw the image
    /// absent before one ended, and reaches the scheduler after, gets its result. Changed only
    /// under the in-flight lock, so a caller sees a pull either under way or ended.
    recent: Mutex<HashMap<PullKey, (Instant, Pulled)>>,
    metrics: Arc<PullMetrics>,
    /// Watches each pull's downloads, and finds it stalled.
    progress: Option<Arc<dyn TrackPulls>>,
    /// Pods' pulls waiting for a slot.
    queued: watch::Sender<usize>,
    /// The order they get one in.
    line: Line,
    /// Pre-pulls waiting for a slot.
    pre_pulls_queued: watch::Sender<usize>,
    /// Pre-pulls holding a slot, the most recently started last.
    running_pre_pulls: Mutex<Vec<Slot>>,
    /// Pods' pulls in flight, with a slot or not.
    pods_in_flight: watch::Sender<usize>,
    /// For a pre-pull giving its slot to a pod's pull.
    events: Arc<Events>,
    /// Run as each pull starts, once set.
    room: std::sync::OnceLock<Arc<dyn MakeRoom>>,
    /// Sizes the pulls that cannot be watched, once set.
    sizes: std::sync::OnceLock<Arc<dyn SizePulls>>,
    /// The leases made for big pulls are named from this, unique to this daemon's start.
    lease_prefix: String,
    leases_named: AtomicU64,
}

/// The scheduler; cheap to clone.
#[derive(Clone)]
pub struct PullScheduler {
    shared: Arc<Shared>,
}

impl PullScheduler {
    pub fn new(service: PullService, config: SchedulerConfig, metrics: Arc<PullMetrics>) -> Self {
        Self::tracked(service, config, metrics, None, Arc::default())
    }

    /// A scheduler whose pulls `progress` watches: their progress is reported, a stalled one is
    /// cancelled, and one whose registry does not answer gives its slot back. Registry
    /// breakers open and close with an event on `events`.
    pub fn tracked(
        service: PullService,
        config: SchedulerConfig,
        metrics: Arc<PullMetrics>,
        progress: Option<Arc<dyn TrackPulls>>,
        events: Arc<Events>,
    ) -> Self {
        let slots = config.max_parallel.map(|n| Arc::new(Semaphore::new(n.get())));
        let (in_flight, recent) = (Mutex::new(HashMap::new()), Mutex::new(HashMap::new()));
        let breakers = Arc::new(Breakers::new(config.breaker, metrics.clone(), events.clone()));
        let (queued, pre_pulls_queued) = (watch::Sender::new(0), watch::Sender::new(0));
        let shared = Shared {
            service,
            slots,
            config,
            breakers,
            in_flight,
            recent,
            metrics,
            progress,
            queued,
            line: Line::default(),
            pre_pulls_queued,
            running_pre_pulls: Mutex::default(),
            pods_in_flight: watch::Sender::new(0),
            events,
            room: std::sync::OnceLock::new(),
            sizes: std::sync::OnceLock::new(),
            lease_prefix: format!(
                "cri-imaged.resume.{}.{}",
                std::process::id(),
                SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_millis()
            ),
            leases_named: AtomicU64::new(0),
        };
        Self { shared: Arc::new(shared) }
    }

    /// Makes room with `room` as each pull starts, from now on (set once).
    pub fn make_room_with(&self, room: Arc<dyn MakeRoom>) {
        let _ = self.shared.room.set(room);
    }

    /// Sizes with `sizes` the pulls that cannot be watched, from now on (set once).
    pub fn size_with(&self, sizes: Arc<dyn SizePulls>) {
        let _ = self.shared.sizes.set(sizes);
    }

    /// Each registry's breaker and wait.
    pub fn breakers(&self) -> &Arc<Breakers> {
        &self.shared.breakers
    }

    /// Pulls `pull`, or joins an identical pull under way, and waits for the result.
    pub async fn pull(&self, pull: Pull) -> Scheduled {
        let key = PullKey::of(&pull);
        let (mut receiver, joined) = {
            let mut in_flight = self.shared.in_flight();
            if !in_flight.contains_key(&key)
                && let Some(absent_since) = pull.absent_since
                && let Some((ended, pulled)) = self.shared.recent().get(&key)
                && *ended >= absent_since
            {
                self.shared.metrics.joined();
                return Scheduled { result: Ok(pulled.clone()), joined: true };
            }
            match in_flight.get(&key) {
                Some(slot) => {
                    if pull.wait_for_rate_limit {
                        slot.waits_for_rate_limit.store(true, Ordering::Relaxed);
                    }
                    slot.wait_for(pull.caller.as_ref());
                    if pull.class == PullClass::Pod {
                        self.shared.promote(slot);
                    }
                    (slot.result.subscribe(), true)
                }
                None => {
                    let (result, receiver) = watch::channel(None);
                    let waits_for_rate_limit = AtomicBool::new(pull.wait_for_rate_limit);
                    let slot = Arc::new(PullSlot {
                        result,
                        image: pull.image().image.clone(),
                        asked_at: SystemTime::now(),
                        asked: Instant::now(),
                        started_at: Mutex::new(None),
                        waits_for_rate_limit,
                        waiting: Arc::default(),
                        progress: Mutex::new(None),
                        class: watch::Sender::new(pull.class),
                        preempt: Notify::new(),
                        state: AtomicU8::new(PullState::Slot as u8),
                        cleared: Mutex::new(None),
                        sized: AtomicU64::new(0),
                        size_asked: AtomicBool::new(false),
                    });
                    slot.wait_for(pull.caller.as_ref());
                    if pull.class == PullClass::Pod {
                        self.shared.pod_in_flight();
                    }
                    in_flight.insert(key.clone(), slot.clone());
                    tokio::spawn(run(self.shared.clone(), key, pull, slot));
                    (receiver, false)
                }
            }
        };
        if joined {
            self.shared.metrics.joined();
        }
        let result = match receiver.wait_for(Option::is_some).await {
            Ok(value) => value.clone().unwrap_or_else(|| Err(Arc::new(PullError::Abandoned))),
            Err(_) => Err(Arc::new(PullError::Abandoned)),
        };
        Scheduled { result, joined }
    }

    /// The pulls under way or queued now, oldest first.
    pub fn in_flight(&self) -> Vec<InFlight> {
        let in_flight = self.shared.in_flight();
        let mut slots: Vec<&Slot> = in_flight.values().collect();
        slots.sort_by(|a, b| (a.asked, &a.image).cmp(&(b.asked, &b.image)));
        slots
            .into_iter()
            .map(|slot| InFlight {
                image: slot.image.clone(),
                callers: slot.result.receiver_count(),
                asked_at: slot.asked_at,
                started_at: *slot.started_at.lock().unwrap_or_else(PoisonError::into_inner),
                progress: slot.report(),
                class: *slot.class.borrow(),
                state: slot.state(),
            })
            .collect()
    }

    /// Pods' pulls and pre-pulls waiting for a slot now.
    pub fn queued(&self) -> (usize, usize) {
        (*self.shared.queued.borrow(), *self.shared.pre_pulls_queued.borrow())
    }
}

impl Shared {
    fn in_flight(&self) -> MutexGuard<'_, HashMap<PullKey, Slot>> {
        self.in_flight.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn recent(&self) -> MutexGuard<'_, HashMap<PullKey, (Instant, Pulled)>> {
        self.recent.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A name for the lease a big pull's downloads are kept in (see [`yielding`]).
    fn resume_lease(&self) -> Arc<str> {
        let n = self.leases_named.fetch_add(1, Ordering::Relaxed);
        Arc::from(format!("{}.{n}", self.lease_prefix))
    }

    /// Waits for a slot; `None` when every caller went away first (the pull is then forgotten).
    async fn acquire(&self, key: &PullKey, slot: &Slot, pull: &Pull) -> Option<Option<OwnedSemaphorePermit>> {
        let Some(slots) = &self.slots else { return Some(None) };
        let queued_at = Instant::now();
        let _queued = Queued::new(&self.queued);
        self.take_slot_from_pre_pull();
        self.metrics.queued();
        let ranking =
            Ranking { unknown: self.config.yield_above, sizing: || self.sizes.get().map(|sizes| sizes.size(pull)) };
        let acquired = tokio::select! {
            permit = self.line.take(slots, slot, ranking) => Some(Some(permit)),
            () = self.unwanted(key, slot) => None,
        };
        self.metrics.dequeued(queued_at.elapsed());
        acquired
    }

    /// Resolves once nobody waits for `key` any more, having removed it from the in-flight map.
    async fn unwanted(&self, key: &PullKey, slot: &Slot) {
        loop {
            slot.result.closed().await;
            let mut in_flight = self.in_flight();
            // A caller may have joined between the last receiver going and the lock.
            if slot.result.receiver_count() == 0 {
                in_flight.remove(key);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests;
