//! Pre-pulls: images fetched ahead of need, asked for over the API (`SubmitPrePull`) or declared
//! with `--pre-pull`, run through the same pull path as pods' pulls but behind them (a pre-pull
//! never holds a slot a pod's pull waits for, see [`crate::pull::scheduler`]), kept across
//! restarts, and optionally pinned from image GC for a while once done. What a pre-pull fetched
//! is held by a containerd lease of its own until it is done, so that one cut short (by a
//! restart, or by a pod's pull taking its slot) goes on from there rather than from zero.
//!
//! - `book`: the pre-pulls and their states, which go next, deadlines and pins (pure).
//! - `runner`: the task that starts pre-pulls, holds what they fetch in leases, keeps their
//!   deadlines, pins and room, and writes them down.
//! - `store`: the pre-pulls kept across restarts, one file each, without their credentials.
//! - `metrics`: pre-pulls by state, bytes pre-pulled.

pub mod book;
pub mod metrics;
mod runner;
pub mod store;

use std::{
    collections::{BTreeMap, HashMap},
    hash::{BuildHasher, Hash, Hasher, RandomState},
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, SystemTime},
};

use secrecy::ExposeSecret;
use tokio::{sync::Notify, task::AbortHandle};

use self::{
    book::{Book, BookError, Cursor, PrePull, Spec, State},
    metrics::PrePullMetrics,
    store::{PrePullStore, StoreError, Written},
};
use crate::{
    credentials::secrets::PullSecret,
    ensure::Manager,
    events::{Event, EventType, Events, reason},
    gc::ImageGc,
    pinned::PinnedImages,
    presence::PresenceCache,
};

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

/// Why a submission or a cancellation was not done, or not kept.
#[derive(Debug, thiserror::Error)]
pub enum PrePullError {
    #[error(transparent)]
    Refused(#[from] BookError),
    /// Done in memory, but not written down: a restart would undo it.
    #[error("{0}; done, but not written down: a restart would undo it")]
    NotKept(#[from] StoreError),
}

/// The most pull secrets a submission carries; they are kept in memory until its pre-pulls end.
pub const MAX_PULL_SECRETS: usize = 16;

/// The most bytes of a submission's pull secrets, in all (a node's docker config is a few KiB).
pub const MAX_PULL_SECRETS_BYTES: usize = 64 << 10;

/// A page of the list asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// The most pre-pulls in it, at most [`Page::MAX_SIZE`].
    pub size: usize,
    /// Where the page before ended; `None` for the first.
    pub after: Option<Cursor>,
}

impl Page {
    /// The most pre-pulls a page holds: a page of the largest stays far under gRPC's 4 MiB
    /// default for an answer (see `server::pre_pulls`).
    pub const MAX_SIZE: usize = 500;
}

/// One submission over the API.
#[derive(Debug, Default)]
pub struct Submission {
    pub images: Vec<String>,
    pub runtime_handler: String,
    /// Whose image policy admits them; empty: the node's default policy.
    pub namespace: String,
    pub priority: i32,
    /// Pulled with these, as a pod's would be (never written down).
    pub pull_secrets: Vec<PullSecret>,
    /// Failed if not done within this.
    pub timeout: Option<Duration>,
    /// Kept from image GC for this long once done.
    pub pin_for: Option<Duration>,
    /// The uid asking (see [`book::Spec::owner`]).
    pub owner: Option<u32>,
}

/// The pre-pulls and the task running them.
pub struct PrePulls<R> {
    book: Mutex<Book>,
    /// The pull secrets of pre-pulls not yet ended, by id (one copy for a submission's images):
    /// in memory only.
    secrets: Mutex<HashMap<String, Arc<Vec<PullSecret>>>>,
    running: Mutex<HashMap<String, AbortHandle>>,
    config: Mutex<PrePullConfig>,
    /// Fingerprints credentials (never kept, never shown), so that a second submission with
    /// other credentials is told apart.
    hasher: RandomState,
    wake: Notify,
    /// Orders writes of the store, each of the book as it is when its turn comes, and holds what
    /// is written of each pre-pull: one that did not change is not written again.
    writing: tokio::sync::Mutex<Written>,
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
        let (mut book, written) = match parts.store.load(now) {
            Ok(loaded) => loaded,
            Err(error) => {
                tracing::warn!(%error, "pre-pulls not read; none is resumed");
                (Book::default(), Written::new())
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
            writing: tokio::sync::Mutex::new(written),
            cancelled: AtomicBool::new(false),
            parts,
        }
    }

    /// Asks for the pre-pulls of `submission`: all of them, or none when one is refused. Returns
    /// once they are written down (a restart finds them), or says they are not.
    pub async fn submit(&self, submission: Submission) -> Result<Vec<PrePull>, PrePullError> {
        let submitted = self.take(submission)?;
        self.keep().await?;
        Ok(submitted)
    }

    /// Puts the pre-pulls of `submission` in the book, all or none.
    fn take(&self, submission: Submission) -> Result<Vec<PrePull>, BookError> {
        let now = SystemTime::now();
        let images =
            submission.images.iter().map(|image| book::with_default_tag(image)).collect::<Result<Vec<_>, _>>()?;
        let credentials = self.fingerprint(&submission.pull_secrets);
        let secrets = Arc::new(submission.pull_secrets);
        let deadline = submission.timeout.and_then(|timeout| now.checked_add(timeout));
        let mut book = self.book();
        let mut changed = book.clone();
        let mut ids = Vec::with_capacity(images.len());
        for image in images {
            let spec = Spec {
                image,
                runtime_handler: submission.runtime_handler.clone(),
                namespace: submission.namespace.clone(),
                priority: submission.priority,
                deadline,
                pin_for: submission.pin_for,
                declared: false,
                owner: submission.owner,
            };
            ids.push(changed.submit(spec, credentials, now)?.id.clone());
        }
        let submitted: Vec<PrePull> = ids.iter().filter_map(|id| changed.get(id).cloned()).collect();
        for entry in submitted.iter().filter(|entry| entry.state == State::Queued && book.get(&entry.id) != Some(entry))
        {
            tracing::info!(id = %entry.id, image = %entry.spec.image, priority = entry.spec.priority, "pre-pull queued");
            let message = format!("Pre-pull of {:?} queued", entry.spec.image);
            self.parts.events.publish(about(entry, EventType::Normal, reason::PRE_PULL_QUEUED, message));
            if !secrets.is_empty() {
                self.secrets().insert(entry.id.clone(), secrets.clone());
            }
        }
        *book = changed;
        drop(book);
        self.changed();
        Ok(submitted)
    }

    /// At most `size` pre-pulls after `after` in the list's order (highest priority first, then
    /// oldest), and where the next page starts when there are more.
    pub fn page(&self, after: Option<&Cursor>, size: usize) -> (Vec<PrePull>, Option<Cursor>) {
        let book = self.book();
        let (page, next) = book.page(after, size);
        (page.into_iter().cloned().collect(), next)
    }

    /// How many pre-pulls are in each state, every state named.
    pub fn count_by_state(&self) -> [(&'static str, usize); 6] {
        self.book().count_by_state()
    }

    pub fn get(&self, id: &str) -> Result<PrePull, BookError> {
        self.book().get(id).cloned().ok_or_else(|| BookError::NotFound(crate::messages::echo(id).into_owned()))
    }

    /// Cancels a pre-pull: a pull under way for it alone stops, and what it fetched goes (its
    /// lease ends as the loop comes round); one done and pinned is no longer pinned (image GC
    /// sees it before this returns). Returns once that is written down, or says it is not.
    /// `may_cancel` is asked first, with the book held, whose the pre-pull is (`None`: no such
    /// pre-pull; `Some(None)`: one kept before pre-pulls had owners): no submission can change
    /// that between the question and the cancel.
    pub async fn cancel<E>(
        &self,
        id: &str,
        may_cancel: impl FnOnce(Option<Option<u32>>) -> Result<(), E>,
    ) -> Result<Result<PrePull, PrePullError>, E> {
        let now = SystemTime::now();
        let cancelled = {
            let mut book = self.book();
            may_cancel(book.get(id).map(|entry| entry.spec.owner))?;
            book.cancel(id, now)
        };
        Ok(self.cancelled(id, cancelled, now).await)
    }

    /// What follows a cancel in the book: the pull stops, the pin goes, the book is written down.
    async fn cancelled(
        &self,
        id: &str,
        cancelled: Result<PrePull, BookError>,
        now: SystemTime,
    ) -> Result<PrePull, PrePullError> {
        let cancelled = cancelled?;
        self.stop(id);
        self.pin(now);
        self.cancelled.store(true, Ordering::Relaxed);
        self.changed();
        self.keep().await?;
        Ok(cancelled)
    }

    /// Pins the images of the pre-pulls pinned now; the presence cache forgets its answers when
    /// that changes what is pinned.
    fn pin(&self, now: SystemTime) {
        let images = self.book().pinned(now);
        if self.parts.pinned.pre_pulled(images) {
            self.parts.presence.image_changed();
        }
    }

    /// Writes down what changed in the book, and counts its states.
    async fn keep(&self) -> Result<(), StoreError> {
        let mut written = self.writing.lock().await;
        let (wanted, counts) = {
            let book = self.book();
            let wanted: BTreeMap<String, Vec<u8>> =
                book.entries().map(|entry| (entry.id.clone(), store::encode(entry))).collect();
            (wanted, book.count_by_state())
        };
        self.parts.metrics.states(counts);
        let unchanged = wanted.len() == written.len() && wanted.iter().all(|(id, new)| written.get(id) == Some(new));
        if unchanged {
            return Ok(());
        }
        let store = self.parts.store.clone();
        let mut kept = std::mem::take(&mut *written);
        let (kept, outcome) = tokio::task::spawn_blocking(move || {
            let outcome = store.write_changes(&wanted, &mut kept);
            (kept, outcome)
        })
        .await
        .map_err(|error| StoreError::Interrupted(error.to_string()))?;
        *written = kept;
        outcome
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

    fn secrets(&self) -> MutexGuard<'_, HashMap<String, Arc<Vec<PullSecret>>>> {
        self.secrets.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn running(&self) -> MutexGuard<'_, HashMap<String, AbortHandle>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn config(&self) -> MutexGuard<'_, PrePullConfig> {
        self.config.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// An event about a pre-pull, for no pod.
fn about(entry: &PrePull, kind: EventType, reason: &'static str, message: String) -> Event {
    Event { image: entry.spec.image.clone(), ..Event::new(kind, reason, message) }
}
