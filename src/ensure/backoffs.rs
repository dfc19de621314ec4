//! The pods' back-offs as the API shows and clears them: the named pairs backing off now, and a
//! pair (or every pair) forgotten so that its next pull is tried at once.

use std::sync::Arc;

use tokio::time::Instant;

use super::Manager;
use crate::{
    backoff::{BackoffName, Listed},
    events::{Event, EventType, Pod, reason as event_reason},
    messages,
    pull::PullError,
    runtime::ImageRuntime,
};

/// What ClearBackoff forgets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClearBackoff {
    /// One pod's pulls of one image for one runtime handler: the image as the pod wrote it, the
    /// spelling its back-off was kept under.
    Pair { pod_uid: String, image: String, runtime_handler: String },
    /// Every pair.
    All,
}

/// The named pairs backing off now, soonest retry first, and how many pairs the store holds.
pub struct Backoffs {
    pub backing_off: Vec<Listed<Arc<PullError>>>,
    pub total: usize,
}

impl<R: ImageRuntime> Manager<R> {
    /// The pairs the store can name that back off now, and how many it holds in all.
    pub fn backoffs(&self) -> Backoffs {
        let backoff = self.backoff();
        Backoffs { backing_off: backoff.backing_off(Instant::now()), total: backoff.len() }
    }

    /// Forgets what `what` names: its next pull is tried at once. How many pairs were forgotten;
    /// a `BackoffCleared` event says which, when any were.
    pub fn clear_backoff(&self, what: ClearBackoff) -> usize {
        let (cleared, name) = {
            let mut backoff = self.backoff();
            let outcome = match &what {
                ClearBackoff::Pair { pod_uid, image, runtime_handler } => {
                    let key = backoff.key(pod_uid, image, runtime_handler);
                    let name = backoff.name_of(key).cloned();
                    (usize::from(backoff.remove(key)), name)
                }
                ClearBackoff::All => (backoff.clear(), None),
            };
            self.metrics.backoff_size(backoff.len());
            outcome
        };
        if cleared > 0 {
            self.metrics.backoff_cleared(cleared);
            self.events.publish(cleared_event(&what, name, cleared));
        }
        cleared
    }

    /// The pulls of the pair `name` failed with `error`: they back off, and the pair is named
    /// for listing.
    pub(super) fn back_off(&self, name: BackoffName, error: Arc<PullError>) {
        let mut backoff = self.backoff();
        let key = backoff.key(&name.uid, &name.image, &name.runtime_handler);
        backoff.record_failure(key, error, Instant::now());
        backoff.name(key, name);
        self.metrics.backoff_size(backoff.len());
    }
}

/// The event for a clear: about the pod and image of a pair (its namespace and name when the
/// store knew them), or about the node for every pair.
fn cleared_event(what: &ClearBackoff, name: Option<BackoffName>, cleared: usize) -> Event {
    match what {
        ClearBackoff::Pair { pod_uid, image, .. } => {
            let pod = match name {
                Some(name) => Pod { namespace: name.namespace, name: name.name, uid: name.uid },
                None => Pod { uid: messages::echo(pod_uid).into_owned(), ..Pod::default() },
            };
            let image = messages::echo(image).into_owned();
            let message = format!("Back-off pulling image {image:?} cleared: the next pull is tried at once");
            Event { pod: Some(pod), image, ..Event::new(EventType::Normal, event_reason::BACKOFF_CLEARED, message) }
        }
        ClearBackoff::All => {
            let message = format!("Every image pull back-off cleared ({cleared} pod and image pairs)");
            Event::new(EventType::Normal, event_reason::BACKOFF_CLEARED, message)
        }
    }
}
