//! What the daemon keeps, on the wire: the node's images as image GC sees them, the images a
//! pass left, the pods' back-offs.

use std::time::SystemTime;

use crate::{
    api,
    backoff::Listed,
    gc::{KeptImage, NodeImage},
    pull::PullError,
};

fn timestamp(time: SystemTime) -> Option<prost_types::Timestamp> {
    Some(prost_types::Timestamp::from(time))
}

/// Repo digests are `name@digest`; every other name is a repo tag.
fn is_digest(name: &str) -> bool {
    name.contains('@')
}

/// An image as listed; `verifications` are filled by the caller, which has the signatures.
pub fn node_image(image: NodeImage) -> api::NodeImage {
    let (repo_digests, repo_tags) = image.names.into_iter().partition(|name| is_digest(name));
    api::NodeImage {
        image_id: image.id,
        repo_tags,
        repo_digests,
        size_bytes: image.size,
        runtime_handler: image.runtime_handler,
        pinned: image.pinned,
        in_use: image.in_use,
        first_detected: image.first_detected.and_then(timestamp),
        last_used: image.last_used.and_then(timestamp),
        verifications: Vec::new(),
    }
}

pub fn kept_image(image: KeptImage) -> api::KeptImage {
    api::KeptImage {
        image_id: image.id,
        names: image.names,
        runtime_handler: image.runtime_handler,
        size_bytes: image.size,
        reason: image.reason.as_str().to_owned(),
        first_detected: timestamp(image.first_detected),
        last_used: image.last_used.and_then(timestamp),
    }
}

pub fn backoff_entry(entry: Listed<std::sync::Arc<PullError>>) -> api::BackoffEntry {
    let duration = |duration: std::time::Duration| prost_types::Duration::try_from(duration).ok();
    let name = entry.name;
    api::BackoffEntry {
        pod: Some(api::PodRef { namespace: name.namespace, name: name.name, uid: name.uid, ..Default::default() }),
        image: name.image,
        runtime_handler: name.runtime_handler,
        retry_after: duration(entry.remaining),
        delay: duration(entry.delay),
        last_error: entry.last_error.to_string(),
    }
}
