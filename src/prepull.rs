//! Pre-pulls: images fetched ahead of need, asked for over the API (`SubmitPrePull`) or declared
//! with `--pre-pull`, run through the same pull path as pods' pulls but behind them (a pre-pull
//! never holds a slot a pod's pull waits for, see [`crate::pull::scheduler`]), kept across
//! restarts, and optionally pinned from image GC for a while once done. What a pre-pull fetched
//! is held by a containerd lease of its own until it is done, so that one cut short (by a
//! restart, or by a pod's pull taking its slot) goes on from there rather than from zero.
//!
//! - `book`: the pre-pulls and their states, which go next, deadlines and pins (pure).
//! - `store`: the pre-pulls kept across restarts, without their credentials.
//! - `metrics`: pre-pulls by state, bytes pre-pulled.

pub mod book;
pub mod metrics;
pub mod store;

use std::{
    collections::HashMap,
    hash::{BuildHasher, Hash, Hasher, RandomState},
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, SystemTime},
};

use k8s_cri::v1::ImageSpec;
use secrecy::ExposeSecret;
use tokio::{sync::Notify, task::AbortHandle};

use self::{
    book::{Book, BookError, PrePull, Spec, State},
    metrics::PrePullMetrics,
    store::PrePullStore,
};
use crate::{
    credentials::secrets::PullSecret,
    ensure::{EnsureRequest, Manager},
    events::{Event, EventType, Events, reason},
    gc::{ImageGc, plan::DiskUsage},
    pinned::PinnedImages,
    presence::PresenceCache,
    pull::PullClass,
    pull_policy::PullPolicy,
    runtime::{ContentStore, ImageRuntime},
    shutdown::Shutdown,
};

/// The ids of the runtime's leases that keep pre-pulls' downloads start so.
const LEASE_PREFIX: &str = "cri-imaged.pre-pull.";

/// How long containerd keeps what a pre-pull fetched if its lease is never ended (a pre-pull
/// forgotten while the daemon was down).
const LEASE_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// How often a running pre-pull checks that its image still fits.
const ROOM_CHECK: Duration = Duration::from_secs(1);

/// The reason a pre-pull is held.
const DISK_PRESSURE: &str = "DiskPressure";

/// The lease that keeps what pre-pull `id` fetched.
fn lease_of(id: &str) -> String {
    format!("{LEASE_PREFIX}{id}")
}

/// How pre-pulls run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrePullConfig {
    /// `--pre-pull`: images kept present, with their default tags.
    pub declared: Vec<String>,
    /// The most pre-pulls under way at once.
    pub max_parallel: usize,
    /// How often declared pre-pulls that are done look for their image, to pull it again if it
    /// was removed behind our back.
    pub recheck: Duration,
}

impl Default for PrePullConfig {
    fn default() -> Self {
        Self { declared: Vec::new(), max_parallel: 1, recheck: Duration::from_secs(60) }
    }
}

/// One submission over the API.
#[derive(Debug, Default)]
pub struct Submission {
    pub images: Vec<String>,
    pub runtime_handler: String,
    pub priority: i32,
    /// Pulled with these, as a pod's would be (never written down).
    pub pull_secrets: Vec<PullSecret>,
    /// Failed if not done within this.
    pub timeout: Option<Duration>,
    /// Kept from image GC for this long once done.
    pub pin_for: Option<Duration>,
}

/// The pre-pulls and the task running them.
pub struct PrePulls<R> {
    book: Mutex<Book>,
    /// The pull secrets of pre-pulls not yet ended, by id: in memory only.
    secrets: Mutex<HashMap<String, Vec<PullSecret>>>,
    running: Mutex<HashMap<String, AbortHandle>>,
    config: Mutex<PrePullConfig>,
    /// Fingerprints credentials (never kept, never shown), so that a second submission with
    /// other credentials is told apart.
    hasher: RandomState,
    wake: Notify,
    /// Orders writes of the store: each writes the book as it is when its turn comes.
    writing: tokio::sync::Mutex<()>,
    /// A pre-pull was cancelled: the loop ends leases of ended pre-pulls as it comes round.
    cancelled: AtomicBool,
    parts: PrePullParts<R>,
}

/// What pre-pulls work with, built by the composition root.
pub struct PrePullParts<R> {
    pub runtime: Arc<R>,
    pub manager: Arc<Manager<R>>,
    /// Its high threshold holds pre-pulls back.
    pub gc: Arc<ImageGc<R>>,
    pub pinned: Arc<PinnedImages>,
    pub presence: Arc<PresenceCache>,
    pub events: Arc<Events>,
    pub store: PrePullStore,
    pub metrics: Arc<PrePullMetrics>,
}

impl<R> PrePulls<R> {
    /// The pre-pulls kept by the last run (what was under way is queued again), then `config`'s
    /// declared ones.
    pub fn new(parts: PrePullParts<R>, config: PrePullConfig) -> Self {
        let now = SystemTime::now();
        let mut book = match parts.store.load() {
            Ok(book) => book,
            Err(error) => {
                tracing::warn!(%error, "pre-pulls not read; none is resumed");
                Book::default()
            }
        };
        for resumed in book.entries().filter(|entry| entry.state == State::Queued && entry.resumed > 0) {
            tracing::info!(id = %resumed.id, image = %resumed.spec.image, "pre-pull resumed after a restart");
            let message = format!("Pre-pull of {:?} resumed after a restart", resumed.spec.image);
            parts.events.publish(about(resumed, EventType::Normal, reason::PRE_PULL_QUEUED, message));
        }
        book.declare(&config.declared, now);
        Self {
            book: Mutex::new(book),
            secrets: Mutex::default(),
            running: Mutex::default(),
            config: Mutex::new(config),
            hasher: RandomState::new(),
            wake: Notify::new(),
            writing: tokio::sync::Mutex::new(()),
            cancelled: AtomicBool::new(false),
            parts,
        }
    }

    /// Asks for the pre-pulls of `submission`: all of them, or none when one is refused.
    pub fn submit(&self, submission: Submission) -> Result<Vec<PrePull>, BookError> {
        let now = SystemTime::now();
        let images =
            submission.images.iter().map(|image| book::with_default_tag(image)).collect::<Result<Vec<_>, _>>()?;
        let credentials = self.fingerprint(&submission.pull_secrets);
        let deadline = submission.timeout.and_then(|timeout| now.checked_add(timeout));
        let mut book = self.book();
        let mut changed = book.clone();
        let mut ids = Vec::with_capacity(images.len());
        for image in images {
            let spec = Spec {
                image,
                runtime_handler: submission.runtime_handler.clone(),
                priority: submission.priority,
                deadline,
                pin_for: submission.pin_for,
                declared: false,
            };
            ids.push(changed.submit(spec, credentials, now)?.id.clone());
        }
        let submitted: Vec<PrePull> = ids.iter().filter_map(|id| changed.get(id).cloned()).collect();
        for entry in submitted.iter().filter(|entry| entry.state == State::Queued && book.get(&entry.id) != Some(entry))
        {
            tracing::info!(id = %entry.id, image = %entry.spec.image, priority = entry.spec.priority, "pre-pull queued");
            let message = format!("Pre-pull of {:?} queued", entry.spec.image);
            self.parts.events.publish(about(entry, EventType::Normal, reason::PRE_PULL_QUEUED, message));
            if !submission.pull_secrets.is_empty() {
                self.secrets().insert(entry.id.clone(), submission.pull_secrets.clone());
            }
        }
        *book = changed;
        drop(book);
        self.changed();
        Ok(submitted)
    }

    /// Every pre-pull, highest priority first, then oldest.
    pub fn list(&self) -> Vec<PrePull> {
        self.book().list().into_iter().cloned().collect()
    }

    pub fn get(&self, id: &str) -> Result<PrePull, BookError> {
        self.book().get(id).cloned().ok_or_else(|| BookError::NotFound(crate::messages::echo(id).into_owned()))
    }

    /// Cancels a pre-pull: a pull under way for it alone stops, and what it fetched goes (its
    /// lease ends as the loop comes round).
    pub fn cancel(&self, id: &str) -> Result<PrePull, BookError> {
        let cancelled = self.book().cancel(id, SystemTime::now())?.clone();
        self.stop(id);
        self.cancelled.store(true, Ordering::Relaxed);
        self.changed();
        Ok(cancelled)
    }

    /// Runs with `config` from now on (a reload): the declared list is diffed.
    pub fn set_config(&self, config: PrePullConfig) {
        self.book().declare(&config.declared, SystemTime::now());
        *self.config() = config;
        self.changed();
    }

    /// Stops the pull of `id`, if one runs (the pull path cancels the upstream pull when no one
    /// else waits for it).
    fn stop(&self, id: &str) {
        if let Some(task) = self.running().remove(id) {
            task.abort();
        }
        self.secrets().remove(id);
    }

    /// Something changed: the loop starts what can start and writes the book down.
    fn changed(&self) {
        self.wake.notify_one();
    }

    fn fingerprint(&self, secrets: &[PullSecret]) -> Option<u64> {
        if secrets.is_empty() {
            return None;
        }
        let mut hasher = self.hasher.build_hasher();
        for secret in secrets {
            (&secret.coordinates.uid, &secret.coordinates.namespace, &secret.coordinates.name).hash(&mut hasher);
            (&secret.kind, secret.content.expose_secret()).hash(&mut hasher);
        }
        Some(hasher.finish())
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn secrets(&self) -> MutexGuard<'_, HashMap<String, Vec<PullSecret>>> {
        self.secrets.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn running(&self) -> MutexGuard<'_, HashMap<String, AbortHandle>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn config(&self) -> MutexGuard<'_, PrePullConfig> {
        self.config.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<R: ImageRuntime + ContentStore> PrePulls<R> {
    /// Starts what is queued, within the cap, keeps deadlines and pins, and rechecks declared
    /// images, until `shutdown`.
    pub async fn run(self: Arc<Self>, shutdown: Shutdown) {
        let stopping = shutdown.requested();
        tokio::pin!(stopping);
        self.end_leases_of_ended().await;
        let mut recheck = tokio::time::Instant::now();
        loop {
            let now = SystemTime::now();
            let (expired, next_change) = {
                let mut book = self.book();
                let expired = book.expire(now);
                (expired, book.next_change())
            };
            if expired || self.cancelled.swap(false, Ordering::Relaxed) {
                self.stop_ended();
                self.end_leases_of_ended().await;
            }
            self.pin(now);
            self.start_next();
            if tokio::time::Instant::now() >= recheck {
                // Room may have been made since a pre-pull was held: it tries again.
                if self.book().release_held() {
                    self.start_next();
                }
                self.recheck_declared().await;
                recheck = tokio::time::Instant::now() + self.config().recheck;
            }
            self.keep().await;
            let until_change = next_change.and_then(|at| at.duration_since(SystemTime::now()).ok());
            let wait = until_change
                .unwrap_or(Duration::MAX)
                .min(recheck.saturating_duration_since(tokio::time::Instant::now()));
            tokio::select! {
                () = self.wake.notified() => {}
                () = tokio::time::sleep(wait.min(Duration::from_secs(3600))) => {}
                () = &mut stopping => return,
            }
        }
    }

    /// Starts queued pre-pulls, best first, while fewer than the cap run.
    fn start_next(self: &Arc<Self>) {
        let max_parallel = self.config().max_parallel;
        let next: Vec<PrePull> = {
            let mut book = self.book();
            let ids = book.next(max_parallel);
            ids.iter().for_each(|id| book.started(id));
            ids.iter().filter_map(|id| book.get(id).cloned()).collect()
        };
        // Held while spawning: a pull that ends at once takes itself out after it is put in.
        let mut running = self.running();
        for entry in next {
            let this = self.clone();
            let id = entry.id.clone();
            let task = tokio::spawn(async move { this.pull(entry).await });
            running.insert(id, task.abort_handle());
        }
    }

    /// One pre-pull through the manager, as an IfNotPresent pull of a pod-less caller, what it
    /// fetches held by its lease until it is done.
    async fn pull(&self, entry: PrePull) {
        let secrets = self.secrets().get(&entry.id).cloned().unwrap_or_default();
        let lease = lease_of(&entry.id);
        let keep_in = match self.parts.runtime.create_lease(&lease, SystemTime::now() + LEASE_LIFETIME).await {
            Ok(()) => Some(Arc::from(lease.as_str())),
            Err(error) => {
                tracing::debug!(%error, id = %entry.id, "what the pre-pull fetches is not kept; cut short, it starts over");
                None
            }
        };
        let request = EnsureRequest {
            image: entry.spec.image.clone(),
            pull_policy: Some(PullPolicy::IfNotPresent),
            runtime_handler: entry.spec.runtime_handler.clone(),
            pull_secrets: secrets,
            class: PullClass::PrePull,
            keep_in,
            ..EnsureRequest::default()
        };
        let outcome = tokio::select! {
            outcome = self.parts.manager.ensure_image_exists(request) => outcome,
            message = self.no_room(&entry) => {
                // Stopped: what it fetched stays in its lease for when there is room.
                tracing::warn!(id = %entry.id, image = %entry.spec.image, "{message}");
                self.parts.events.publish(about(&entry, EventType::Warning, reason::PRE_PULL_HELD, message.clone()));
                self.book().held(&entry.id, DISK_PRESSURE, message);
                self.running().remove(&entry.id);
                self.changed();
                return;
            }
        };
        let state = match outcome {
            Ok(outcome) => {
                if outcome.pull.is_some() {
                    self.parts.metrics.pre_pulled(outcome.image_size);
                }
                let message = format!("Pre-pulled {:?}: {}", entry.spec.image, outcome.image_ref);
                self.parts.events.publish(about(&entry, EventType::Normal, reason::PRE_PULLED, message));
                State::Done { image_ref: outcome.image_ref }
            }
            Err(error) => {
                let message = format!("Pre-pull of {:?} failed: {}: {error}", entry.spec.image, error.reason());
                self.parts.events.publish(about(&entry, EventType::Warning, reason::PRE_PULL_FAILED, message));
                State::Failed { reason: error.reason().to_owned(), message: error.to_string() }
            }
        };
        // Done, the image holds its blobs; failed, a pull asked again starts afresh.
        self.end_lease(&entry.id).await;
        self.book().ended(&entry.id, state, SystemTime::now());
        self.running().remove(&entry.id);
        self.secrets().remove(&entry.id);
        self.changed();
    }

    /// Resolves, with why, once the pre-pull's pull would take the image filesystem over image
    /// GC's high threshold: its image's bytes still to fetch (known once its manifest is), twice
    /// (the blobs and their unpacked layers), on top of what is used. Never for a pull a pod
    /// joined: pods' pulls are never held.
    async fn no_room(&self, entry: &PrePull) -> String {
        let mut every = tokio::time::interval(ROOM_CHECK);
        loop {
            every.tick().await;
            let in_flight = self.parts.manager.pulls_in_flight();
            let Some(pull) = in_flight.iter().find(|pull| pull.image == entry.spec.image) else { continue };
            let (Some(report), PullClass::PrePull) = (pull.progress, pull.class) else { continue };
            let to_fetch = report.progress.bytes_total.saturating_sub(report.progress.bytes_done);
            let Ok(usage) = self.parts.runtime.image_fs_usage().await else { continue };
            let high = self.parts.gc.config().policy.high_threshold_percent;
            let used_after = usage.capacity.saturating_sub(usage.available).saturating_add(to_fetch.saturating_mul(2));
            let after = DiskUsage { capacity: usage.capacity, available: usage.capacity.saturating_sub(used_after) };
            if high < 100 && after.usage_percent() >= u64::from(high) {
                return format!(
                    "{DISK_PRESSURE}: pre-pull of {:?} held: {to_fetch} bytes still to fetch would take the image filesystem to {}% of its {} bytes, at or over image GC's high threshold ({high}%)",
                    entry.spec.image,
                    after.usage_percent(),
                    usage.capacity
                );
            }
        }
    }

    /// Ends the lease of pre-pull `id`: what only it held goes at containerd's next collection.
    async fn end_lease(&self, id: &str) {
        if let Err(error) = self.parts.runtime.delete_lease(&lease_of(id)).await {
            tracing::debug!(%error, id, "the pre-pull's lease was not ended; it expires by itself");
        }
    }

    /// Ends the leases of pre-pulls that ended or were forgotten while the daemon was down.
    async fn end_leases_of_ended(&self) {
        let Ok(leases) = self.parts.runtime.leases(LEASE_PREFIX).await else { return };
        for lease in leases {
            let id = lease.trim_start_matches(LEASE_PREFIX);
            let wanted = self.book().get(id).is_some_and(|entry| !entry.state.ended());
            if !wanted {
                self.end_lease(id).await;
            }
        }
    }

    /// Stops the pulls of pre-pulls that ended meanwhile (a deadline).
    fn stop_ended(&self) {
        let ended: Vec<String> = {
            let book = self.book();
            let running = self.running();
            running.keys().filter(|id| book.get(id).is_none_or(|entry| entry.state.ended())).cloned().collect()
        };
        for id in ended {
            self.stop(&id);
        }
    }

    /// Pins the images of the pre-pulls pinned now; the presence cache forgets its answers when
    /// that changes what is pinned.
    fn pin(&self, now: SystemTime) {
        let images = self.book().pinned(now);
        if self.parts.pinned.pre_pulled(images) {
            self.parts.presence.image_changed();
        }
    }

    /// Declared pre-pulls that are done and whose image is gone are queued again.
    async fn recheck_declared(&self) {
        let done: Vec<PrePull> = {
            let book = self.book();
            let declared =
                book.entries().filter(|entry| entry.spec.declared && matches!(entry.state, State::Done { .. }));
            declared.cloned().collect()
        };
        for entry in done {
            let spec = ImageSpec {
                image: entry.spec.image.clone(),
                runtime_handler: entry.spec.runtime_handler.clone(),
                ..Default::default()
            };
            if let Ok(None) = self.parts.runtime.image_status(spec).await {
                tracing::info!(id = %entry.id, image = %entry.spec.image, "a declared pre-pull's image is gone; pulling it again");
                self.book().gone(&entry.id, SystemTime::now());
                self.wake.notify_one();
            }
        }
    }

    /// Writes the book down, and counts its states.
    async fn keep(&self) {
        let _turn = self.writing.lock().await;
        let (contents, counts) = {
            let book = self.book();
            (PrePullStore::encode(&book), metrics::count(&book))
        };
        self.parts.metrics.states(counts);
        let store = self.parts.store.clone();
        match tokio::task::spawn_blocking(move || store.write(&contents)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "pre-pulls not kept; a restart would lose them"),
            Err(error) => tracing::warn!(%error, "keeping the pre-pulls stopped"),
        }
    }
}

/// An event about a pre-pull, for no pod.
fn about(entry: &PrePull, kind: EventType, reason: &'static str, message: String) -> Event {
    Event { image: entry.spec.image.clone(), ..Event::new(kind, reason, message) }
}
