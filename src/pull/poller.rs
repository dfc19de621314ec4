//! Polls containerd's content service for the pulls under way: each pull's progress and rate
//! (GetStatus, `PullProgress` events), and its stall, on which the scheduler cancels it
//! (`--image-pull-progress-timeout`).
//!
//! One task serves every tracked pull, so N pulls cost one `ListStatuses` a tick; it sleeps while
//! none is tracked. Until a pull's manifest is found (see [`ContentStore::find_manifest`]) each
//! tick also lists that repository's manifests: a pull whose image was already stored, or whose
//! manifest cannot be found, reports nothing and never stalls. A runtime without the content
//! service (CRI-O) turns polling off for good, with one log line: pulls report start and end only.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex, MutexGuard, PoisonError, Weak,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, SystemTime},
};

use tokio::{
    sync::{Notify, watch},
    time::{Instant, MissedTickBehavior},
};

use super::progress::{Ingest, Progress, PullProgress, RateWindow, digest_of_ref, host_without_port, manifest_layers};
use crate::{
    events::{Event, EventType, Events, Pod, ProgressFacts, reason},
    messages,
    reference::ImageReference,
    runtime::{ContentStore, RuntimeError},
};

/// How pulls are watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgressConfig {
    /// How often the ingests are listed while a pull is tracked.
    pub interval: Duration,
    /// A pull downloading with no byte moved for this long is stalled; `None` never stalls.
    pub stall_timeout: Option<Duration>,
    /// At most one progress event per pull this often.
    pub event_interval: Duration,
}

impl Default for ProgressConfig {
    /// A quarter-second poll; containerd 1.7's stall default (5m); two events a second at most.
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(250),
            stall_timeout: Some(Duration::from_secs(300)),
            event_interval: Duration::from_millis(500),
        }
    }
}

/// The most pods a progress event names as waiting.
pub const MAX_WAITING_PODS: usize = 32;

/// The pods waiting for a pull, kept by the scheduler as callers join.
pub type WaitingPods = Arc<Mutex<Vec<Pod>>>;

/// The largest manifest read; an image manifest is a few KiB.
const MANIFEST_LIMIT: usize = 4 * 1024 * 1024;

/// The least time between two looks for one pull's manifest.
const SEARCH_INTERVAL: Duration = Duration::from_millis(500);

/// How much older than the pull's start its manifest may look: containerd stamps it with its own
/// reading of the same wall clock, to the millisecond or coarser.
const CLOCK_SLACK: Duration = Duration::from_secs(2);

/// A pull the scheduler has started.
pub struct TrackedPull {
    /// The image as the runtime is asked for it.
    pub image: String,
    pub reference: Arc<ImageReference>,
    pub started_at: SystemTime,
    pub waiting: WaitingPods,
    /// The lease to keep the pull's blobs and downloads in, once its manifest is found.
    pub keep_in: Option<Arc<str>>,
    /// Without `keep_in`: a lease the poller makes to keep them in, named so, once the pull turns
    /// out to fetch at least this many bytes (a big pull that may make way for smaller ones).
    pub lease_above: Option<(Arc<str>, u64)>,
}

/// How long a lease the poller made keeps what its pull fetched: past the longest a pull that
/// made way waits before it goes on ([`super::scheduler::yielding::YIELD_FOR_AT_MOST`]), and
/// ended by containerd then, so nothing has to remember to end it.
pub const LEASE_LIFETIME: Duration = Duration::from_secs(600);

/// What the scheduler needs of the poller (which is generic over the runtime; the scheduler is
/// not).
pub trait TrackPulls: Send + Sync {
    /// Watches `pull` until the returned tracker is dropped.
    fn track(&self, pull: TrackedPull) -> Tracker;
}

struct Registered {
    image: String,
    reference: Arc<ImageReference>,
    started_at: SystemTime,
    waiting: WaitingPods,
    reports: watch::Sender<Option<Report>>,
    keep_in: Option<Arc<str>>,
    lease_above: Option<(Arc<str>, u64)>,
    /// When an unaccounted download last moved while this pull had no answer.
    activity: watch::Sender<Option<Instant>>,
    events: Arc<Events>,
    /// A progress event has said all of it is done: the pull's end need not say it again.
    told_all: AtomicBool,
}

#[derive(Default)]
struct Registry {
    pulls: Mutex<HashMap<u64, Arc<Registered>>>,
    next_id: AtomicU64,
    /// Wakes the polling task when a pull is tracked, or when the poller goes.
    wake: Arc<Notify>,
    /// The runtime has no content service: nothing is tracked.
    unsupported: AtomicBool,
    /// A poll has been answered: the runtime has the content service.
    supported: AtomicBool,
}

impl Registry {
    fn pulls(&self) -> MutexGuard<'_, HashMap<u64, Arc<Registered>>> {
        self.pulls.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Watches the pulls under way on the runtime's content service.
pub struct ProgressPoller {
    registry: Arc<Registry>,
    events: Arc<Events>,
}

impl ProgressPoller {
    /// Starts the polling task (it ends when the poller is dropped).
    pub fn start<R: ContentStore>(runtime: Arc<R>, config: ProgressConfig, events: Arc<Events>) -> Arc<Self> {
        let registry = Arc::new(Registry::default());
        let task = Poll { runtime, config, pulls: HashMap::new(), unaccounted: HashMap::new() };
        tokio::spawn(task.run(Arc::downgrade(&registry), registry.wake.clone()));
        Arc::new(Self { registry, events })
    }
}

impl ProgressPoller {
    /// Whether the runtime has the content service the poller reads; `None` until it is known.
    pub fn supported(&self) -> Option<bool> {
        if self.registry.unsupported.load(Ordering::Relaxed) {
            Some(false)
        } else {
            self.registry.supported.load(Ordering::Relaxed).then_some(true)
        }
    }
}

impl Drop for ProgressPoller {
    fn drop(&mut self) {
        self.registry.wake.notify_one();
    }
}

impl TrackPulls for ProgressPoller {
    fn track(&self, pull: TrackedPull) -> Tracker {
        if self.registry.unsupported.load(Ordering::Relaxed) {
            return Tracker::untracked();
        }
        let id = self.registry.next_id.fetch_add(1, Ordering::Relaxed);
        let (reports, receiver) = watch::channel(None);
        let (activity, moved) = watch::channel(None);
        let TrackedPull { image, reference, started_at, waiting, keep_in, lease_above } = pull;
        let (events, told_all) = (self.events.clone(), AtomicBool::new(false));
        let pull = Arc::new(Registered {
            image,
            reference,
            started_at,
            waiting,
            reports,
            keep_in,
            lease_above,
            activity,
            events,
            told_all,
        });
        self.registry.pulls().insert(id, pull.clone());
        self.registry.wake.notify_one();
        let registration = Registration { id, registry: Arc::downgrade(&self.registry), pull };
        Tracker::registered(receiver, moved, registration)
    }
}

/// The polling task and what it knows of each tracked pull.
struct Poll<R> {
    runtime: Arc<R>,
    config: ProgressConfig,
    pulls: HashMap<u64, Watched>,
    /// Offsets of the downloads no tracked pull accounted for, at the last poll.
    unaccounted: HashMap<String, u64>,
}

/// A tracked pull as the task follows it.
#[derive(Default)]
struct Watched {
    /// `None` until its manifest is found.
    progress: Option<PullProgress>,
    /// No look for its manifest before this.
    next_search: Option<Instant>,
    rate: RateWindow,
    /// The progress last published, and when.
    published: Option<(Instant, Progress)>,
    /// See [`Report::kept`].
    kept: u64,
    /// See [`Report::held_in`].
    held_in: Option<Arc<str>>,
}

impl<R: ContentStore> Poll<R> {
    async fn run(mut self, registry: Weak<Registry>, wake: Arc<Notify>) {
        let mut ticker = tokio::time::interval(self.config.interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            let tracked: Vec<(u64, Arc<Registered>)> = match registry.upgrade() {
                Some(registry) => registry.pulls().iter().map(|(id, pull)| (*id, pull.clone())).collect(),
                None => return,
            };
            self.pulls.retain(|id, _| tracked.iter().any(|(tracked, _)| tracked == id));
            if tracked.is_empty() {
                wake.notified().await;
                ticker.reset();
                continue;
            }
            ticker.tick().await;
            match self.poll(&tracked).await {
                Ok(()) => {
                    if let Some(registry) = registry.upgrade() {
                        registry.supported.store(true, Ordering::Relaxed);
                    }
                }
                Err(error) if error.code() == tonic::Code::Unimplemented => {
                    tracing::info!(%error, "pull progress is off: the runtime has no content service to read it from");
                    if let Some(registry) = registry.upgrade() {
                        registry.unsupported.store(true, Ordering::Relaxed);
                        registry.pulls().clear();
                    }
                    return;
                }
                Err(error) => tracing::debug!(%error, "listing the runtime's downloads failed"),
            }
        }
    }

    /// One tick: the ingests once, then each pull's share of them.
    async fn poll(&mut self, tracked: &[(u64, Arc<Registered>)]) -> Result<(), RuntimeError> {
        let ingests: HashMap<String, Ingest> = self
            .runtime
            .list_ingests()
            .await?
            .into_iter()
            .filter_map(|(reference, offset, total)| {
                Some((digest_of_ref(&reference)?.to_owned(), Ingest { offset, total }))
            })
            .collect();
        // Looking for a manifest costs containerd a pass over its whole content store: only while
        // something is being written that no tracked pull accounts for, and at most every
        // [`SEARCH_INTERVAL`] a pull.
        let accounted: HashSet<&str> = self
            .pulls
            .values()
            .filter_map(|watched| watched.progress.as_ref())
            .flat_map(PullProgress::digests)
            .collect();
        let unaccounted: HashMap<String, u64> = ingests
            .iter()
            .filter(|(digest, _)| !accounted.contains(digest.as_str()))
            .map(|(digest, ingest)| (digest.clone(), ingest.offset))
            .collect();
        // A pull through us is accounted for within a poll of its first download; one unaccounted
        // for two polls running belongs to a pull the poller cannot place (a manifest stored
        // before, a client of containerd other than us): its bytes may be an unanswered pull's.
        let moved =
            unaccounted.iter().any(|(digest, offset)| self.unaccounted.get(digest).is_some_and(|was| offset > was));
        let searching = !unaccounted.is_empty();
        self.unaccounted = unaccounted;
        // Registries with a download of ours moving: they answer, however long their next
        // manifest takes over a link that download fills.
        let mut moving: HashSet<&str> = HashSet::new();
        let mut unanswered = Vec::new();
        for (id, pull) in tracked {
            let mut watched = self.pulls.remove(id).unwrap_or_default();
            let now = Instant::now();
            if watched.progress.is_none() && searching && watched.next_search.is_none_or(|next| now >= next) {
                watched.next_search = Some(now + SEARCH_INTERVAL);
                (watched.progress, watched.kept, watched.held_in) = match self.find_layers(pull, &ingests).await {
                    Some(Found { progress, kept, held_in }) => (Some(progress), kept, held_in),
                    None => (None, 0, None),
                };
            }
            if watched.progress.is_none() {
                unanswered.push(pull);
            }
            if let Some(progress) = &mut watched.progress {
                let mut committed = HashSet::new();
                for digest in progress.vanished(&ingests) {
                    if self.runtime.has_blob(&digest).await.unwrap_or(false) {
                        committed.insert(digest);
                    }
                }
                let now = Instant::now();
                let done = progress.observe(&ingests, &committed, now);
                let stalled = self.config.stall_timeout.filter(|timeout| progress.stalled(now, *timeout));
                let report = Report {
                    progress: done,
                    layers: progress.layers(),
                    bytes_per_second: watched.rate.sample(now, done.bytes_done),
                    stalled,
                    kept: watched.kept,
                    held_in: watched.held_in.clone(),
                };
                let before = pull.reports.send_replace(Some(report.clone())).map_or(0, |was| was.progress.bytes_done);
                if done.bytes_done > before {
                    moving.insert(pull.reference.domain());
                }
                self.publish(pull, &mut watched, report, now);
            }
            self.pulls.insert(*id, watched);
        }
        let now = Instant::now();
        for pull in unanswered {
            if moved || moving.contains(pull.reference.domain()) {
                pull.activity.send_replace(Some(now));
            }
        }
        Ok(())
    }

    /// The layers `pull` fetches, once containerd has its manifest: those stored already (and
    /// not being written) are left out. With them, for a pull resumed from its lease (whose
    /// manifest came before it: the lease names it), the bytes an earlier pull fetched.
    async fn find_layers(&self, pull: &Registered, ingests: &HashMap<String, Ingest>) -> Option<Found> {
        let since = pull.started_at.checked_sub(CLOCK_SLACK).unwrap_or(pull.started_at);
        let host = host_without_port(pull.reference.domain());
        let (manifest, resumed) = match self.runtime.find_manifest(host, pull.reference.path(), since).await {
            Ok(Some(found)) => (found, false),
            Ok(None) => (self.kept_manifest(pull).await?, true),
            Err(error) => {
                tracing::debug!(%error, image = %pull.image, "looking for the pull's manifest failed");
                return None;
            }
        };
        let blob = self.runtime.read_blob(&manifest, MANIFEST_LIMIT).await.ok()?;
        let Some(layers) = manifest_layers(&blob) else {
            tracing::debug!(%manifest, image = %pull.image, "the pull's manifest names no layers");
            return None;
        };
        // A pull resumed from its lease finds it holding all this already.
        let total: u64 = layers.iter().map(|layer| layer.size).sum();
        let held_in = match (&pull.keep_in, &pull.lease_above) {
            (Some(lease), _) if resumed => Some(lease.clone()),
            (Some(lease), _) => self.keep(lease, &manifest, &blob, &layers).await.then(|| lease.clone()),
            (None, Some((lease, above))) if total >= *above => {
                let made = self.made_lease(lease, SystemTime::now() + LEASE_LIFETIME).await;
                (made && self.keep(lease, &manifest, &blob, &layers).await).then(|| lease.clone())
            }
            (None, _) => None,
        };
        let mut stored = HashSet::new();
        for layer in &layers {
            if !ingests.contains_key(&layer.digest) && self.runtime.has_blob(&layer.digest).await.unwrap_or(false) {
                stored.insert(layer.digest.clone());
            }
        }
        let kept = match resumed {
            false => 0,
            true => layers
                .iter()
                .map(|layer| match (stored.contains(&layer.digest), ingests.get(&layer.digest)) {
                    (true, _) => layer.size,
                    (false, Some(ingest)) => ingest.offset,
                    (false, None) => 0,
                })
                .sum(),
        };
        Some(Found { progress: PullProgress::new(layers, &stored, Instant::now()), kept, held_in })
    }

    /// A `PullProgress` event when the pull moved and the last one is old enough; the first
    /// report (the size is known) always goes out.
    fn publish(&self, pull: &Registered, watched: &mut Watched, report: Report, now: Instant) {
        let due = match watched.published {
            None => true,
            Some((at, progress)) => {
                progress != report.progress && now.saturating_duration_since(at) >= self.config.event_interval
            }
        };
        if !due || !pull.events.watched() {
            return;
        }
        watched.published = Some((now, report.progress));
        let progress = report.progress;
        let all = progress.bytes_done == progress.bytes_total && progress.layers_done == progress.layers_total;
        pull.told_all.store(all, Ordering::Relaxed);
        pull.events.publish(progress_event(pull, &report.facts()));
    }
}

/// A pull's layers once its manifest is found, what an earlier pull cut short fetched of them, and
/// the lease holding them.
struct Found {
    progress: PullProgress,
    kept: u64,
    held_in: Option<Arc<str>>,
}

/// A `PullProgress` event about `pull`, for every pod waiting for it.
fn progress_event(pull: &Registered, facts: &ProgressFacts) -> Event {
    let waiting = pull.waiting.lock().unwrap_or_else(PoisonError::into_inner).clone();
    Event {
        pod: waiting.first().cloned(),
        waiting,
        image: pull.image.clone(),
        progress: Some(facts.clone()),
        ..Event::new(EventType::Normal, reason::PULL_PROGRESS, messages::pull_progress(&pull.image, facts))
    }
}

mod lease;
mod report;
mod tracker;

use self::tracker::Registration;
pub use self::{
    report::Report,
    tracker::{Answer, Tracker},
};

#[cfg(test)]
mod tests;
