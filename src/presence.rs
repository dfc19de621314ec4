//! The presence cache: images the runtime said it has, remembered only while a change signal is
//! watched ([`image_events`]: containerd's image events; [`image_store`]: CRI-O's image store
//! under inotify; [`signal`] picks one), so that asking about a present image again costs no
//! runtime call.
//!
//! Correctness rests on three rules. Any image event forgets everything: events are rare, and
//! forgetting all needs no agreement between our names and the runtime's normalised ones. An
//! answer is remembered only if no event came between asking and remembering (a [`Ticket`] of the
//! generation); otherwise a deletion racing the question could be undone by a stale answer. And a
//! remembered answer is trusted only while the cache is proven current: events reach us after
//! the removal that caused them has returned, so the watcher publishes a marker event and waits
//! for it to come back (a barrier); containerd delivers events in order, so every event published
//! before the marker has been applied by then. A hit is trusted while the newest barrier that came
//! back started at most `max_staleness` ago; with zero, every hit waits for a barrier that
//! started after it was asked (strict). The image store's barrier is reading its inotify queue dry
//! (see [`image_store`]): the same contract, without a round trip. Last, containerd's CRI plugin
//! applies each image event to its own image store (what ImageStatus reads) on its own schedule,
//! so the watcher forgets everything once more [`SETTLE`] after the last event: an answer the
//! plugin gave before it had caught up is not kept longer than that (the image store's watcher
//! does the same, though CRI-O reads its store directly).
//!
//! The same rules keep the CRI answers the pass-through remembers ([`answers`]): ImageStatus and
//! ListImages by their request bytes, and the image filesystem's snapshot.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use crate::cri::ImageSpec;
use tokio::{
    sync::{Notify, watch},
    time::Instant,
};

pub mod answers;
pub mod image_events;
pub mod image_store;
pub mod metrics;
pub mod signal;

use self::{
    answers::Remembered,
    metrics::{Answered, PresenceMetrics},
};
use crate::runtime::PresentImage;

/// The most images remembered; past it the cache starts over. Nodes hold far fewer.
pub const CAPACITY: usize = 4096;
/// The default of `--presence-cache-max-staleness`.
pub const DEFAULT_MAX_STALENESS: Duration = Duration::from_millis(100);
/// After the last image event, when the cache is emptied once more: by then the runtime's CRI
/// layer has applied the same event to the store its ImageStatus answers from.
pub const SETTLE: Duration = Duration::from_secs(1);
/// How long a hit waits for a barrier before asking the runtime instead.
pub const PROOF_WAIT: Duration = Duration::from_secs(1);

/// Proof of which generation an answer was asked in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(u64);

/// What tells the cache that the runtime's images changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Signal {
    /// Nothing: every presence check asks the runtime.
    #[default]
    None,
    /// containerd's image events.
    ContainerdEvents,
    /// inotify on a containers/storage image store's `images.json` (CRI-O), in this directory.
    ImageStore(std::path::PathBuf),
}

impl std::fmt::Display for Signal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => f.write_str("none"),
            Self::ContainerdEvents => f.write_str("containerd image events"),
            Self::ImageStore(dir) => write!(f, "image store {}", dir.display()),
        }
    }
}

/// What the cache can say about an image (or a remembered answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup<T = PresentImage> {
    /// Present, and the cache is proven current within the allowed staleness.
    Fresh(T),
    /// Remembered, but not proven current recently enough: prove it, or ask the runtime.
    Unproven,
    /// Not remembered: ask the runtime.
    Miss,
}

/// What the runtime said is present, while a change signal is watched.
pub struct PresenceCache {
    state: Mutex<State>,
    metrics: Arc<PresenceMetrics>,
    max_staleness: Duration,
    /// How long an image filesystem snapshot is served (see [`answers`]).
    fs_info_max_age: Duration,
    /// Asks the watcher for a barrier; many asks before it starts one make one barrier.
    barrier_wanted: Notify,
    /// Moves on whenever `current_as_of` or `watching` changes, to wake those waiting for proof.
    proofs: watch::Sender<()>,
}

#[derive(Default)]
struct State {
    /// Whether the change signal is known to be live (a subscription to the runtime's image
    /// events, a watch on its image store).
    watching: bool,
    /// The signal the watcher in charge follows.
    signal: Signal,
    /// Moves on at every event and every change of `watching`.
    generation: u64,
    /// When the newest barrier that came back was started: every image event published before
    /// then has been applied. Kept under the same lock as `images`, so that a lookup never pairs
    /// an image from before an event with a proof from after it.
    current_as_of: Option<Instant>,
    /// By runtime handler, then image (as sent to the runtime); annotations do not change
    /// presence. Nested so that a lookup on the hot path allocates nothing.
    images: HashMap<String, HashMap<String, PresentImage>>,
    /// CRI answers by call and request bytes, and the image filesystem's snapshot.
    answers: Remembered,
}

impl State {
    fn len(&self) -> usize {
        self.images.values().map(HashMap::len).sum()
    }

    fn forget(&mut self) {
        self.generation += 1;
        self.images.clear();
        self.answers.clear();
    }
}

impl PresenceCache {
    /// A cache that trusts a hit while it was proven current at most `max_staleness` ago.
    pub fn new(metrics: Arc<PresenceMetrics>, max_staleness: Duration) -> Self {
        Self {
            state: Mutex::new(State::default()),
            metrics,
            max_staleness,
            fs_info_max_age: answers::DEFAULT_FS_INFO_MAX_AGE,
            barrier_wanted: Notify::new(),
            proofs: watch::Sender::new(()),
        }
    }

    /// The same cache, serving an image filesystem snapshot for at most `max_age` (zero: never).
    pub fn with_fs_info_max_age(self, max_age: Duration) -> Self {
        Self { fs_info_max_age: max_age, ..self }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The image, if the runtime said it has it, nothing has changed since, and the cache is
    /// proven current within the allowed staleness as of `now`.
    pub fn lookup(&self, spec: &ImageSpec, now: Instant) -> Lookup {
        let state = self.state();
        let found = state.images.get(&spec.runtime_handler).and_then(|images| images.get(&spec.image));
        self.judge(&state, found, now, Answered::Presence)
    }

    /// `found` (remembered under `state`) as fresh only while the cache is proven current
    /// within the allowed staleness as of `now`; a hit counted as `answered`.
    fn judge<T: Clone>(&self, state: &State, found: Option<&T>, now: Instant, answered: Answered) -> Lookup<T> {
        let Some(found) = found else {
            return Lookup::Miss;
        };
        let Some(age) = state.current_as_of.map(|as_of| now.saturating_duration_since(as_of)) else {
            return Lookup::Unproven;
        };
        if age > self.max_staleness {
            return Lookup::Unproven;
        }
        // Half way to stale: prove it again now, so that steady traffic never waits.
        if age * 2 > self.max_staleness {
            self.barrier_wanted.notify_one();
        }
        self.metrics.hit(answered);
        Lookup::Fresh(found.clone())
    }

    /// What `lookup` finds, waiting for a proof when the cache has not been proven current
    /// recently enough; `None`: ask the runtime.
    async fn recall<T: Clone>(&self, asked_at: Instant, lookup: impl Fn(&Self) -> Lookup<T>) -> Option<T> {
        match lookup(self) {
            Lookup::Fresh(found) => Some(found),
            Lookup::Unproven if self.prove_current_since(asked_at).await => match lookup(self) {
                Lookup::Fresh(found) => Some(found),
                Lookup::Unproven | Lookup::Miss => None,
            },
            Lookup::Unproven | Lookup::Miss => None,
        }
    }

    /// The image as [`Self::lookup`] finds it asked at `asked_at`, proven current first when it
    /// must be; `None`: ask the runtime.
    pub async fn recall_image(&self, spec: &ImageSpec, asked_at: Instant) -> Option<PresentImage> {
        self.recall(asked_at, |cache| cache.lookup(spec, asked_at)).await
    }

    /// Waits until a barrier started at or after `since` has come back, asking the watcher for
    /// one; false when events are not watched or no proof came within [`PROOF_WAIT`].
    pub async fn prove_current_since(&self, since: Instant) -> bool {
        let mut proofs = self.proofs.subscribe();
        let proven = async {
            loop {
                {
                    let state = self.state();
                    if state.current_as_of.is_some_and(|as_of| as_of >= since) {
                        return true;
                    }
                    if !state.watching {
                        return false;
                    }
                }
                self.barrier_wanted.notify_one();
                if proofs.changed().await.is_err() {
                    return false;
                }
            }
        };
        tokio::time::timeout(PROOF_WAIT, proven).await.unwrap_or(false)
    }

    /// The metrics the cache and its watcher keep.
    pub fn metrics(&self) -> &PresenceMetrics {
        &self.metrics
    }

    /// For the watcher: resolves when someone wants the cache proven current.
    pub async fn barrier_wanted(&self) {
        self.barrier_wanted.notified().await;
    }

    /// For the watcher: a barrier started at `started` came back, so every event published
    /// before then has been applied.
    pub fn proven_current_as_of(&self, started: Instant) {
        let mut state = self.state();
        if state.watching && state.current_as_of.is_none_or(|as_of| as_of < started) {
            state.current_as_of = Some(started);
        }
        drop(state);
        self.proofs.send_replace(());
    }

    /// A ticket to remember an answer about to be asked for; `None` while events are not watched.
    pub fn ticket(&self) -> Option<Ticket> {
        let state = self.state();
        state.watching.then_some(Ticket(state.generation))
    }

    /// Remembers that the runtime has `image`, unless something changed since `ticket`.
    pub fn remember(&self, ticket: Ticket, spec: &ImageSpec, image: PresentImage) {
        let mut state = self.state();
        if !state.watching || state.generation != ticket.0 {
            return;
        }
        if state.len() >= CAPACITY {
            state.images.clear();
        }
        state.images.entry(spec.runtime_handler.clone()).or_default().insert(spec.image.clone(), image);
    }

    /// An image changed, by an event or by a removal that went through us: forget everything.
    pub fn image_changed(&self) {
        self.state().forget();
        self.metrics.invalidated();
    }

    /// The change signal (a subscription to image events, a watch on the image store) became
    /// live or was lost; either way, start empty and unproven.
    pub fn set_watching(&self, watching: bool) {
        let mut state = self.state();
        state.watching = watching;
        state.current_as_of = None;
        state.forget();
        drop(state);
        self.metrics.watching(watching);
        self.proofs.send_replace(());
    }

    /// For the watcher in charge: the signal it follows, from now on.
    pub fn set_signal(&self, signal: Signal) {
        self.state().signal = signal;
    }

    /// The signal that keeps the cache current: [`Signal::None`] while none is live.
    pub fn signal(&self) -> Signal {
        let state = self.state();
        if state.watching { state.signal.clone() } else { Signal::None }
    }

    /// Whether answers are being remembered.
    pub fn is_watching(&self) -> bool {
        self.state().watching
    }

    /// How many images are remembered.
    pub fn len(&self) -> usize {
        self.state().len()
    }

    /// Whether no image is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests;
