//! Which events a subscriber or a `ListEvents` caller wants: by pod, namespace and image, any
//! spelling of the image's reference matching (`busybox` is `docker.io/library/busybox:latest`).

use std::sync::OnceLock;

use super::{Event, Pod};
use crate::reference;

/// Which events a subscriber wants; an empty field matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    pub pod_uid: String,
    pub namespace: String,
    /// Matches the image as written, any spelling of the same reference, or its image ref.
    pub image: String,
}

impl Filter {
    /// The filter ready to match, its image normalised once here rather than at every event.
    pub fn prepare(self) -> Matcher {
        let normalised = normalise(&self.image);
        Matcher { filter: self, normalised }
    }
}

/// A [`Filter`] with its image normalised.
#[derive(Debug, Clone, Default)]
pub struct Matcher {
    filter: Filter,
    /// The filter's image as a full reference with the default tag; `None` when it does not
    /// parse (an image id, say): then only the exact spelling matches.
    normalised: Option<String>,
}

impl Matcher {
    /// Whether every event matches.
    pub fn matches_all(&self) -> bool {
        let filter = &self.filter;
        filter.pod_uid.is_empty() && filter.namespace.is_empty() && filter.image.is_empty()
    }

    /// A progress event matches a pod filter through any pod waiting for the pull.
    pub fn matches(&self, event: &Event) -> bool {
        let filter = &self.filter;
        let pod_matches = |pod: &Pod| {
            (filter.pod_uid.is_empty() || pod.uid == filter.pod_uid)
                && (filter.namespace.is_empty() || pod.namespace == filter.namespace)
        };
        let any_pod = filter.pod_uid.is_empty() && filter.namespace.is_empty();
        (any_pod || event.pod.iter().chain(&event.waiting).any(pod_matches)) && self.image_matches(event)
    }

    fn image_matches(&self, event: &Event) -> bool {
        let wanted = &self.filter.image;
        if wanted.is_empty() || event.image == *wanted || event.image_ref == *wanted {
            return true;
        }
        let Some(normalised) = &self.normalised else { return false };
        event.normalised_image.of(&event.image) == Some(normalised.as_str())
    }
}

/// An event's image normalised, worked out the first time a filter needs it and then shared by
/// every subscriber (events are shared behind an `Arc`). A cache, not part of the event's value:
/// any two compare equal.
#[derive(Debug, Clone, Default)]
pub struct NormalisedImage(OnceLock<Option<Box<str>>>);

impl NormalisedImage {
    /// `image` (the event's own) normalised; `None` when it does not parse.
    fn of(&self, image: &str) -> Option<&str> {
        self.0.get_or_init(|| normalise(image).map(String::into_boxed_str)).as_deref()
    }
}

impl PartialEq for NormalisedImage {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for NormalisedImage {}

/// `image` as a full reference with the default tag: `busybox` is
/// `docker.io/library/busybox:latest`. `None` for nothing, or what does not parse.
fn normalise(image: &str) -> Option<String> {
    if image.is_empty() {
        return None;
    }
    reference::normalized(image)
}
