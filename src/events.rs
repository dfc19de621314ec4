//! The node's image events, in the kubelet's reasons and words, for `WatchEvents` subscribers and
//! `ListEvents`.
//!
//! Publishing never waits: events go into one bounded ring shared by every subscriber (a tokio
//! broadcast channel). A subscriber that falls a whole ring behind loses the oldest events it
//! has not read and is told how many, once, then goes on with the rest; the pulls publishing
//! never notice it. Beside it the newest [`KEPT_EVENTS`] are kept whether anyone watches or
//! not, progress aside, for `ListEvents`. Events never carry a credential: they are made from
//! the image, the pod, the runtime's answers and the kubelet's messages only.
//!
//! - `filter`: which events a subscriber wants ([`Filter`], made ready to match as a [`Matcher`]).
//! - [`metrics`]: the events counted by reason and type.

mod filter;
pub mod metrics;

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, SystemTime},
};

use tokio::sync::broadcast;

pub use self::filter::{Filter, Matcher, NormalisedImage};
use self::metrics::EventMetrics;

/// How many events a subscriber may fall behind before it loses the oldest.
pub const SUBSCRIBER_BUFFER: usize = 4096;

/// How many of the newest events are kept for `ListEvents` (progress and lag reports aside).
pub const KEPT_EVENTS: usize = 1024;

/// The kubelet's event reasons for images, and cri-imaged's for garbage collection and registries.
pub mod reason {
    pub const PULLING: &str = "Pulling";
    pub const PULLED: &str = "Pulled";
    pub const FAILED: &str = "Failed";
    pub const BACK_OFF: &str = "BackOff";
    pub const INSPECT_FAILED: &str = "InspectFailed";
    pub const ERR_IMAGE_NEVER_PULL: &str = "ErrImageNeverPull";
    pub const IMAGE_GARBAGE_COLLECTED: &str = "ImageGarbageCollected";
    pub const FREE_DISK_SPACE_FAILED: &str = "FreeDiskSpaceFailed";
    pub const IMAGE_GC_FAILED: &str = "ImageGCFailed";
    pub const INVALID_DISK_CAPACITY: &str = "InvalidDiskCapacity";
    /// Not the kubelet's: how far a pull under way is.
    pub const PULL_PROGRESS: &str = "PullProgress";
    /// Not the kubelet's: a registry's breaker opened (its pulls fail at once for a while).
    pub const REGISTRY_UNAVAILABLE: &str = "RegistryUnavailable";
    /// Not the kubelet's: a registry whose breaker was open answered again.
    pub const REGISTRY_AVAILABLE: &str = "RegistryAvailable";
    /// Not the kubelet's: a registry answered 429, and its pull rate was lowered.
    pub const REGISTRY_THROTTLED: &str = "RegistryThrottled";
    /// Not the kubelet's: this subscriber read too slowly and lost events.
    pub const LAGGED: &str = "Lagged";
    /// Not the kubelet's: a pre-pull was asked for (or resumed after a restart) and waits.
    pub const PRE_PULL_QUEUED: &str = "PrePullQueued";
    /// Not the kubelet's: a pre-pull gave its slot to a pod's pull and waits again.
    pub const PRE_PULL_YIELDED: &str = "PrePullYielded";
    /// Not the kubelet's: a pre-pull waits, its image too big for the image filesystem now.
    pub const PRE_PULL_HELD: &str = "PrePullHeld";
    /// Not the kubelet's: a pre-pull's image is present.
    pub const PRE_PULLED: &str = "PrePulled";
    /// Not the kubelet's: a pre-pull failed, was cancelled or missed its deadline.
    pub const PRE_PULL_FAILED: &str = "PrePullFailed";
    /// Not the kubelet's: a pod's back-off for an image (or every back-off) was cleared.
    pub const BACKOFF_CLEARED: &str = "BackoffCleared";
    /// The node's image policy refused an image (its pull failed with this reason).
    pub const SIGNATURE_VALIDATION_FAILED: &str = "SignatureValidationFailed";
    /// An image's signatures met the policy of the pod that pulled it.
    pub const SIGNATURE_VERIFIED: &str = "SignatureVerified";
    /// The node's image policy would have refused an image audit mode let in.
    pub const POLICY_AUDIT: &str = "PolicyAudit";
}

/// The kubelet's event types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

/// The pod an event is about.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// What a successful pull took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PullFacts {
    pub pull: Duration,
    /// Waiting (queue, rate limit, a shared pull) included.
    pub total: Duration,
    pub image_size: u64,
}

/// How far a pull under way is, as its runtime's downloads show it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProgressFacts {
    pub bytes_done: u64,
    /// Of the layers the pull fetches (those already stored are not counted).
    pub bytes_total: u64,
    pub layers_done: usize,
    pub layers_total: usize,
    pub bytes_per_second: u64,
    /// The layers it fetches, in the manifest's order (the first [`MOST_LAYERS`]); shared, so
    /// that a report and its events copy none of it.
    pub layers: Arc<[LayerFacts]>,
}

/// The most layers a pull's progress names one by one.
pub const MOST_LAYERS: usize = 64;

/// One layer of a pull under way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerFacts {
    pub digest: Arc<str>,
    pub size: u64,
    pub bytes_done: u64,
    pub done: bool,
}

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub time: SystemTime,
    pub kind: EventType,
    pub reason: &'static str,
    pub message: String,
    /// `None` for the node's own events (garbage collection) and pod-less callers.
    pub pod: Option<Pod>,
    pub container: String,
    /// The image as the caller wrote it; empty for events about an image id only.
    pub image: String,
    /// The runtime's image ref, when known.
    pub image_ref: String,
    pub pull: Option<PullFacts>,
    pub progress: Option<ProgressFacts>,
    /// Every pod waiting for the pull a progress event is about (`pod` is the first of them).
    pub waiting: Vec<Pod>,
    /// `image` normalised, once a filter needs it.
    pub normalised_image: NormalisedImage,
}

impl Event {
    /// An event about `image` for `pod`'s `container`, now.
    pub fn new(kind: EventType, reason: &'static str, message: String) -> Self {
        Self {
            time: SystemTime::now(),
            kind,
            reason,
            message,
            pod: None,
            container: String::new(),
            image: String::new(),
            image_ref: String::new(),
            pull: None,
            progress: None,
            waiting: Vec::new(),
            normalised_image: NormalisedImage::default(),
        }
    }
}

/// Who and what a request's events are about: its pod, container and image as the caller wrote
/// them (bounded).
#[derive(Debug, Clone, Default)]
pub struct Subject {
    pub pod: Option<Pod>,
    pub container: String,
    pub image: String,
}

impl Subject {
    /// An event about this subject, now.
    pub fn event(&self, kind: EventType, reason: &'static str, message: String) -> Event {
        Event {
            pod: self.pod.clone(),
            container: self.container.clone(),
            image: self.image.clone(),
            ..Event::new(kind, reason, message)
        }
    }
}

/// Where events are published; cheap to share.
pub struct Events {
    sender: broadcast::Sender<Arc<Event>>,
    /// Held while sending, so that a subscriber can tell which events came after a moment.
    state: Mutex<State>,
    metrics: Arc<EventMetrics>,
}

#[derive(Default)]
struct State {
    /// How many events were sent to subscribers.
    sent: u64,
    /// The newest events worth telling later, oldest first.
    kept: VecDeque<Arc<Event>>,
}

impl Default for Events {
    fn default() -> Self {
        Self::with_buffer(SUBSCRIBER_BUFFER)
    }
}

impl Events {
    pub fn with_buffer(buffer: usize) -> Self {
        Self { sender: broadcast::channel(buffer.max(1)).0, state: Mutex::default(), metrics: Arc::default() }
    }

    /// Counts what it publishes in `metrics`.
    pub fn counted(self, metrics: Arc<EventMetrics>) -> Self {
        Self { metrics, ..self }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether anyone subscribes. Only a progress event and an image already present may go
    /// unmade without: every other one is kept for `ListEvents`.
    pub fn watched(&self) -> bool {
        self.sender.receiver_count() > 0
    }

    /// Publishes `event` to every subscriber, and keeps it (progress aside) among the newest.
    /// Never waits.
    pub fn publish(&self, event: Event) {
        let keep = worth_keeping(event.reason);
        // Counted as kept: progress reports are made only for watchers, so their count would
        // say how many watched, not what happened.
        if keep {
            self.metrics.published(event.kind, event.reason);
        }
        self.send(event, keep);
    }

    /// Publishes `event` to every subscriber without keeping it: what every container start says
    /// (an image already present) would push the failures out of the history.
    pub fn publish_unkept(&self, event: Event) {
        self.send(event, false);
    }

    fn send(&self, event: Event, keep: bool) {
        let watched = self.watched();
        if !keep && !watched {
            return;
        }
        let event = Arc::new(event);
        let mut state = self.state();
        if keep {
            if state.kept.len() >= KEPT_EVENTS {
                state.kept.pop_front();
            }
            state.kept.push_back(event.clone());
        }
        if watched && self.sender.send(event).is_ok() {
            state.sent += 1;
        }
    }

    /// Events from now on that `filter` matches.
    pub fn subscribe(&self, filter: Filter) -> Subscription {
        Subscription { receiver: self.sender.subscribe(), filter: filter.prepare() }
    }

    /// Events from now on that `filter` matches, and how many were sent before them.
    pub fn subscribe_counted(&self, filter: Filter) -> (Subscription, u64) {
        let state = self.state();
        (self.subscribe(filter), state.sent)
    }

    /// How many events were sent to subscribers so far (those published with none are not).
    pub fn sent(&self) -> u64 {
        self.state().sent
    }

    /// The kept events `matcher` matches, oldest first: the newest `limit` of them (all for 0).
    pub fn recent(&self, matcher: &Matcher, limit: usize) -> Vec<Arc<Event>> {
        let limit = if limit == 0 { KEPT_EVENTS } else { limit };
        // Matched outside the lock (a filter may parse each image): publishing never waits on it.
        let kept: Vec<Arc<Event>> = self.state().kept.iter().cloned().collect();
        let mut found: Vec<Arc<Event>> =
            kept.into_iter().rev().filter(|event| matcher.matches(event)).take(limit).collect();
        found.reverse();
        found
    }
}

/// Whether an event tells the node's story: a progress report or a watcher's lag is noise once
/// it is past.
fn worth_keeping(reason: &str) -> bool {
    reason != reason::PULL_PROGRESS && reason != reason::LAGGED
}

/// One subscriber's events.
pub struct Subscription {
    receiver: broadcast::Receiver<Arc<Event>>,
    filter: Matcher,
}

/// What a subscriber reads next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    Event(Arc<Event>),
    /// It read too slowly: this many events (matching or not) were lost.
    Lagged(u64),
}

impl Subscription {
    /// The next matching event, or word of lost ones; `None` once publishing has ended.
    pub async fn next(&mut self) -> Option<Next> {
        loop {
            match self.receiver.recv().await {
                Ok(event) if self.filter.matches(&event) => return Some(Next::Event(event)),
                Ok(_) => continue,
                Err(broadcast::error::RecvError::Lagged(lost)) => return Some(Next::Lagged(lost)),
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

impl Subscription {
    /// The next matching event already published, or word of lost ones; `None` when there is
    /// none yet (or publishing has ended). Never waits.
    pub fn try_next(&mut self) -> Option<Next> {
        loop {
            match self.receiver.try_recv() {
                Ok(event) if self.filter.matches(&event) => return Some(Next::Event(event)),
                Ok(_) => continue,
                Err(broadcast::error::TryRecvError::Lagged(lost)) => return Some(Next::Lagged(lost)),
                Err(broadcast::error::TryRecvError::Empty | broadcast::error::TryRecvError::Closed) => return None,
            }
        }
    }
}

/// The event that tells a subscriber it lost `lost` events.
pub fn lagged(lost: u64) -> Event {
    let message = format!("{lost} events dropped: this watcher read more slowly than events came");
    Event::new(EventType::Warning, reason::LAGGED, message)
}

#[cfg(test)]
mod tests;
