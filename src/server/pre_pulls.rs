//! Pre-pulls on the wire: a pre-pull as `imagemanager.v1.PrePull`, with the progress of its pull
//! while it runs; how many are in each state. Every field of a pre-pull is bounded (see
//! [`crate::prepull::book`]), so a page of them ([`crate::prepull::Page::MAX_SIZE`]) stays far
//! under gRPC's 4 MiB default for an answer.

use std::time::SystemTime;

use crate::{
    api,
    prepull::book::{PrePull, State},
    pull::{PullClass, scheduler::InFlight},
};

/// How many pre-pulls GetStatus shows (its counts count them all).
pub const IN_STATUS: usize = 100;

/// Counts by state (as [`crate::prepull::book::Book::count_by_state`] gives them) on the wire.
pub fn wire_counts(counts: [(&'static str, usize); 6]) -> api::PrePullCounts {
    let count = |name: &str| {
        let found = counts.iter().find(|(state, _)| *state == name).map_or(0, |(_, count)| *count);
        u32::try_from(found).unwrap_or(u32::MAX)
    };
    api::PrePullCounts {
        queued: count("queued"),
        pulling: count("pulling"),
        held: count("held"),
        done: count("done"),
        failed: count("failed"),
        cancelled: count("cancelled"),
    }
}

/// `pre_pulls` on the wire, each with its pull's progress from `in_flight`.
pub fn wire_all(pre_pulls: Vec<PrePull>, in_flight: &[InFlight]) -> Vec<api::PrePull> {
    pre_pulls.into_iter().map(|pre_pull| wire(pre_pull, in_flight)).collect()
}

/// One pre-pull on the wire.
pub fn wire(pre_pull: PrePull, in_flight: &[InFlight]) -> api::PrePull {
    let timestamp = |time: SystemTime| prost_types::Timestamp::from(time);
    let progress = (pre_pull.state == State::Pulling)
        .then(|| in_flight.iter().find(|pull| pull.image == pre_pull.spec.image && pull.class == PullClass::PrePull))
        .flatten()
        .and_then(|pull| pull.progress.as_ref())
        .map(|report| super::watch::wire_progress(&report.facts()));
    let pinned_until = pre_pull.pinned_until().filter(|until| *until > SystemTime::now()).map(timestamp);
    let (state, resumed) = (pre_pull.state.as_str().to_owned(), pre_pull.resumed);
    let (image_ref, reason, message) = match pre_pull.state {
        State::Done { image_ref } => (image_ref, String::new(), String::new()),
        State::Failed { reason, message } | State::Held { reason, message } => (String::new(), reason, message),
        _ => Default::default(),
    };
    api::PrePull {
        id: pre_pull.id,
        image: pre_pull.spec.image,
        runtime_handler: pre_pull.spec.runtime_handler,
        namespace: pre_pull.spec.namespace,
        priority: pre_pull.spec.priority,
        state,
        image_ref,
        reason,
        message,
        submitted: Some(timestamp(pre_pull.submitted)),
        finished: pre_pull.finished.map(timestamp),
        deadline: pre_pull.spec.deadline.map(timestamp),
        pinned_until,
        declared: pre_pull.spec.declared,
        resumed,
        progress,
    }
}

#[cfg(test)]
mod tests;
