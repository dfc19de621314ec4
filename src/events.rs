//! The node's image events, in the kubelet's reasons and words, for `WatchEvents` subscribers.
//!
//! Publishing never waits: events go into one bounded ring shared by every subscriber (a tokio
//! broadcast channel). A subscriber that falls a whole ring behind loses the oldest events it
//! has not read and is told how many, once, then goes on with the rest; the pulls publishing
//! never notice it. Events never carry a credential: they are made from the image, the pod, the
//! runtime's answers and the kubelet's messages only.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, SystemTime},
};

use tokio::sync::broadcast;

/// How many events a subscriber may fall behind before it loses the oldest.
pub const SUBSCRIBER_BUFFER: usize = 4096;

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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProgressFacts {
    pub bytes_done: u64,
    /// Of the layers the pull fetches (those already stored are not counted).
    pub bytes_total: u64,
    pub layers_done: usize,
    pub layers_total: usize,
    pub bytes_per_second: u64,
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

/// Which events a subscriber wants; an empty field matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    pub pod_uid: String,
    pub namespace: String,
    /// Matches the image as written or its image ref.
    pub image: String,
}

impl Filter {
    /// Whether every event matches.
    pub fn matches_all(&self) -> bool {
        self.pod_uid.is_empty() && self.namespace.is_empty() && self.image.is_empty()
    }

    /// A progress event matches a pod filter through any pod waiting for the pull.
    pub fn matches(&self, event: &Event) -> bool {
        let pod_matches = |pod: &Pod| {
            (self.pod_uid.is_empty() || pod.uid == self.pod_uid)
                && (self.namespace.is_empty() || pod.namespace == self.namespace)
        };
        let any_pod = self.pod_uid.is_empty() && self.namespace.is_empty();
        (any_pod || event.pod.iter().chain(&event.waiting).any(pod_matches))
            && (self.image.is_empty() || event.image == self.image || event.image_ref == self.image)
    }
}

/// Where events are published; cheap to share.
pub struct Events {
    sender: broadcast::Sender<Arc<Event>>,
    /// How many events were sent to subscribers; held while sending, so that a subscriber can
    /// tell which events came after a moment.
    sent: Mutex<u64>,
}

impl Default for Events {
    fn default() -> Self {
        Self::with_buffer(SUBSCRIBER_BUFFER)
    }
}

impl Events {
    pub fn with_buffer(buffer: usize) -> Self {
        Self { sender: broadcast::channel(buffer.max(1)).0, sent: Mutex::new(0) }
    }

    /// Whether anyone subscribes: without, an event need not even be made.
    pub fn watched(&self) -> bool {
        self.sender.receiver_count() > 0
    }

    /// Publishes `event` to every subscriber; without any, it goes nowhere. Never waits.
    pub fn publish(&self, event: Event) {
        if self.watched() {
            let mut sent = self.sent.lock().unwrap_or_else(PoisonError::into_inner);
            if self.sender.send(Arc::new(event)).is_ok() {
                *sent += 1;
            }
        }
    }

    /// Events from now on that `filter` matches.
    pub fn subscribe(&self, filter: Filter) -> Subscription {
        Subscription { receiver: self.sender.subscribe(), filter }
    }

    /// Events from now on that `filter` matches, and how many were sent before them.
    pub fn subscribe_counted(&self, filter: Filter) -> (Subscription, u64) {
        let sent = self.sent.lock().unwrap_or_else(PoisonError::into_inner);
        (self.subscribe(filter), *sent)
    }

    /// How many events were sent to subscribers so far (those published with none are not).
    pub fn sent(&self) -> u64 {
        *self.sent.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One subscriber's events.
pub struct Subscription {
    receiver: broadcast::Receiver<Arc<Event>>,
    filter: Filter,
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
mod tests {
    use super::*;

    fn for_pod(uid: &str, namespace: &str, image: &str) -> Event {
        let pod = Pod { namespace: namespace.into(), name: "web".into(), uid: uid.into() };
        Event {
            pod: Some(pod),
            image: image.into(),
            ..Event::new(EventType::Normal, reason::PULLING, format!("Pulling image {image:?}"))
        }
    }

    /// Every event until publishing ends.
    async fn read(mut subscription: Subscription) -> Vec<Event> {
        let mut seen = Vec::new();
        while let Some(Next::Event(event)) = subscription.next().await {
            seen.push((*event).clone());
        }
        seen
    }

    #[tokio::test]
    async fn a_subscriber_gets_the_events_its_filter_matches_in_order() {
        let events = Events::default();
        let all = events.subscribe(Filter::default());
        let pod = events.subscribe(Filter { pod_uid: "u1".into(), ..Filter::default() });
        let namespace = events.subscribe(Filter { namespace: "kube-system".into(), ..Filter::default() });
        let image = events.subscribe(Filter { image: "busybox:1.36".into(), ..Filter::default() });
        let published = [
            for_pod("u1", "default", "busybox:1.36"),
            for_pod("u2", "kube-system", "nginx:1.25"),
            Event {
                image_ref: "busybox:1.36".into(),
                ..Event::new(EventType::Normal, reason::IMAGE_GARBAGE_COLLECTED, "gone".into())
            },
        ];
        for event in &published {
            events.publish(event.clone());
        }
        drop(events);
        assert_eq!(read(all).await, published);
        assert_eq!(read(pod).await, [published[0].clone()]);
        assert_eq!(read(namespace).await, [published[1].clone()]);
        assert_eq!(read(image).await, [published[0].clone(), published[2].clone()], "as written or as a ref");
    }

    #[test]
    fn a_progress_event_matches_every_pod_waiting_for_the_pull() {
        let first = Pod { namespace: "default".into(), name: "a".into(), uid: "u1".into() };
        let joined = Pod { namespace: "batch".into(), name: "b".into(), uid: "u2".into() };
        let progress = Event {
            pod: Some(first.clone()),
            waiting: vec![first, joined],
            ..Event::new(EventType::Normal, reason::PULL_PROGRESS, "half".into())
        };
        let filter = |uid: &str, namespace: &str| Filter {
            pod_uid: uid.into(),
            namespace: namespace.into(),
            ..Filter::default()
        };
        assert!(filter("u2", "").matches(&progress), "a pod that joined the pull");
        assert!(filter("", "batch").matches(&progress));
        assert!(filter("u2", "batch").matches(&progress));
        assert!(!filter("u3", "").matches(&progress));
        assert!(!filter("u1", "batch").matches(&progress), "one pod must match both");
        assert!(!filter("", "kube-system").matches(&progress));
    }

    #[tokio::test]
    async fn a_slow_subscriber_is_told_once_how_many_it_lost_and_goes_on() {
        let events = Events::with_buffer(4);
        let mut slow = events.subscribe(Filter::default());
        for n in 0..10 {
            events.publish(Event::new(EventType::Normal, reason::PULLING, format!("{n}")));
        }
        assert_eq!(slow.next().await, Some(Next::Lagged(6)));
        let mut rest = Vec::new();
        for _ in 0..4 {
            let Some(Next::Event(event)) = slow.next().await else { panic!("an event") };
            rest.push(event.message.clone());
        }
        assert_eq!(rest, ["6", "7", "8", "9"], "the newest, in order");
    }

    #[test]
    fn a_counted_subscription_starts_after_every_event_sent_before_it() {
        let events = Events::with_buffer(8);
        events.publish(Event::new(EventType::Normal, reason::PULLING, "unwatched".into()));
        let (_first, sent) = events.subscribe_counted(Filter::default());
        assert_eq!(sent, 0, "an event no one watched is not counted");
        events.publish(Event::new(EventType::Normal, reason::PULLING, "a".into()));
        events.publish(Event::new(EventType::Normal, reason::PULLED, "b".into()));
        let (mut second, sent) = events.subscribe_counted(Filter::default());
        assert_eq!((sent, events.sent()), (2, 2));
        events.publish(Event::new(EventType::Normal, reason::PULLING, "c".into()));
        assert!(matches!(second.try_next(), Some(Next::Event(event)) if event.message == "c"));
        assert_eq!(events.sent(), 3);
    }

    #[test]
    fn without_subscribers_publishing_keeps_nothing() {
        let events = Events::with_buffer(4);
        events.publish(Event::new(EventType::Normal, reason::PULLING, "x".into()));
        let mut late = events.subscribe(Filter::default());
        events.publish(Event::new(EventType::Normal, reason::PULLED, "y".into()));
        assert!(matches!(late.receiver.try_recv(), Ok(event) if event.message == "y"));
    }
}
