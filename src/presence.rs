//! The presence cache: images the runtime said it has, remembered only while the runtime's image
//! events are watched (see [`crate::runtime_events`]), so that asking about a present image again
//! costs no runtime call.
//!
//! Correctness rests on two rules. Any image event forgets everything: events are rare, and
//! forgetting all needs no agreement between our names and the runtime's normalised ones. And an
//! answer is remembered only if no event came between asking and remembering (a [`Ticket`] of the
//! generation); otherwise a deletion racing the question could be undone by a stale answer.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use k8s_cri::v1::ImageSpec;

use crate::{cri::PresentImage, metrics::Metrics};

/// The most images remembered; past it the cache starts over. Nodes hold far fewer.
pub const CAPACITY: usize = 4096;

/// Proof of which generation an answer was asked in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(u64);

/// What the runtime said is present, while its events are watched.
pub struct PresenceCache {
    state: Mutex<State>,
    metrics: Arc<Metrics>,
}

#[derive(Default)]
struct State {
    /// Whether a subscription to the runtime's image events is known to be live.
    watching: bool,
    /// Moves on at every event and every change of `watching`.
    generation: u64,
    /// By runtime handler, then image (as sent to the runtime); annotations do not change
    /// presence. Nested so that a lookup on the hot path allocates nothing.
    images: HashMap<String, HashMap<String, PresentImage>>,
}

impl State {
    fn len(&self) -> usize {
        self.images.values().map(HashMap::len).sum()
    }
}

impl PresenceCache {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { state: Mutex::new(State::default()), metrics }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The image, if the runtime said it has it and nothing has changed since.
    pub fn get(&self, spec: &ImageSpec) -> Option<PresentImage> {
        let state = self.state();
        let found = state.images.get(&spec.runtime_handler).and_then(|images| images.get(&spec.image)).cloned();
        if found.is_some() {
            self.metrics.presence_hit();
        }
        found
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

    /// An image event: forget everything.
    pub fn image_changed(&self) {
        let mut state = self.state();
        state.generation += 1;
        state.images.clear();
        self.metrics.presence_invalidated();
    }

    /// The subscription to image events became live or was lost; either way, start empty.
    pub fn set_watching(&self, watching: bool) {
        let mut state = self.state();
        state.watching = watching;
        state.generation += 1;
        state.images.clear();
        self.metrics.presence_watching(watching);
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
mod tests {
    use super::*;

    fn spec(image: &str) -> ImageSpec {
        ImageSpec { image: image.into(), ..Default::default() }
    }

    fn present(id: &str) -> PresentImage {
        PresentImage { id: id.into(), size: 1 }
    }

    fn watching_cache() -> PresenceCache {
        let cache = PresenceCache::new(Arc::default());
        cache.set_watching(true);
        cache
    }

    #[test]
    fn nothing_is_remembered_until_events_are_watched() {
        let cache = PresenceCache::new(Arc::default());
        assert_eq!(cache.ticket(), None, "no ticket, so callers ask the runtime every time");
        cache.set_watching(true);
        let ticket = cache.ticket().expect("watching");
        cache.remember(ticket, &spec("busybox:1"), present("sha256:a"));
        assert_eq!(cache.get(&spec("busybox:1")), Some(present("sha256:a")));
    }

    #[test]
    fn any_image_event_forgets_every_image() {
        let cache = watching_cache();
        for image in ["busybox:1", "nginx:1"] {
            cache.remember(cache.ticket().expect("watching"), &spec(image), present(image));
        }
        cache.image_changed();
        assert!(cache.is_empty());
        assert_eq!(cache.get(&spec("nginx:1")), None);
    }

    #[test]
    fn an_answer_asked_before_an_event_is_not_remembered_after_it() {
        let cache = watching_cache();
        let ticket = cache.ticket().expect("watching");
        // The image is deleted while the runtime's (now stale) answer is on its way.
        cache.image_changed();
        cache.remember(ticket, &spec("busybox:1"), present("sha256:a"));
        assert_eq!(cache.get(&spec("busybox:1")), None);
    }

    #[test]
    fn losing_the_event_stream_forgets_everything_and_stops_remembering() {
        let cache = watching_cache();
        let ticket = cache.ticket().expect("watching");
        cache.remember(ticket, &spec("busybox:1"), present("sha256:a"));
        cache.set_watching(false);
        assert!(cache.is_empty());
        assert_eq!(cache.ticket(), None);
        cache.remember(ticket, &spec("busybox:1"), present("sha256:a"));
        assert!(cache.is_empty(), "a ticket from before the loss is void");
    }

    #[test]
    fn runtime_handlers_are_told_apart() {
        let cache = watching_cache();
        let gvisor = ImageSpec { runtime_handler: "runsc".into(), ..spec("busybox:1") };
        cache.remember(cache.ticket().expect("watching"), &gvisor, present("sha256:a"));
        assert_eq!(cache.get(&spec("busybox:1")), None);
        assert_eq!(cache.get(&gvisor), Some(present("sha256:a")));
    }

    #[test]
    fn a_full_cache_starts_over_instead_of_growing() {
        let cache = watching_cache();
        for index in 0..=CAPACITY {
            cache.remember(cache.ticket().expect("watching"), &spec(&format!("image-{index}:1")), present("id"));
        }
        assert_eq!(cache.len(), 1, "the image after the full cache is the only one kept");
    }
}
