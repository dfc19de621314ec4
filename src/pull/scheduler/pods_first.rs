//! Pods first: a pre-pull ([`PullClass::PrePull`]) takes a slot only while the pods' pulls in
//! flight (holding a slot, waiting for one, or waiting for a silent registry) leave one to
//! spare, and a pod's pull that finds every slot taken takes one back from a running pre-pull
//! (the most recently started, which has fetched least): the pre-pull is cancelled and queued
//! again behind the pods. A pod's pull that joins a pre-pull makes it a pod's pull: it is then
//! neither held back nor taken from.

use std::{num::NonZeroUsize, sync::PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use super::{Shared, Slot, yielding::Queued};
use crate::pull::{Pull, PullClass, PullKey, metrics::PullMetrics};

impl Shared {
    /// Waits for a slot as the pull's class does; `None` when every caller went away first.
    pub(super) async fn acquire_for(
        &self,
        key: &PullKey,
        slot: &Slot,
        pull: &Pull,
    ) -> Option<Option<OwnedSemaphorePermit>> {
        let class = *slot.class.borrow();
        match class {
            PullClass::Pod => self.acquire(key, slot, pull).await,
            PullClass::PrePull => self.acquire_behind_pods(key, slot, pull).await,
        }
    }

    /// A pre-pull's slot, taken while the pods' pulls leave one to spare; as a pod's pull waits
    /// once a pod joins it.
    async fn acquire_behind_pods(
        &self,
        key: &PullKey,
        slot: &Slot,
        pull: &Pull,
    ) -> Option<Option<OwnedSemaphorePermit>> {
        let Some(slots) = &self.slots else { return Some(None) };
        let capacity = self.capacity();
        let (mut class, mut pods) = (slot.class.subscribe(), self.pods_in_flight.subscribe());
        {
            let _waiting = Queued::new(&self.pre_pulls_queued);
            let _counted = Waiting::new(&self.metrics);
            while *class.borrow_and_update() == PullClass::PrePull {
                let permit = tokio::select! {
                    permit = spare_slot(slots, &mut pods, capacity) => permit,
                    _ = class.changed() => continue,
                    () = self.unwanted(key, slot) => return None,
                };
                if self.runs_pre_pull(slot, capacity) {
                    return Some(Some(permit));
                }
            }
        }
        self.acquire(key, slot, pull).await
    }

    /// The most pulls at once.
    fn capacity(&self) -> usize {
        self.config.max_parallel.map_or(usize::MAX, NonZeroUsize::get)
    }

    /// Counts `slot` among the pre-pulls holding a slot, unless the pods' pulls took every slot
    /// meanwhile: checked under the same lock a pod's pull that waits for a slot looks for a
    /// pre-pull to take from, so one of the two always sees the other.
    fn runs_pre_pull(&self, slot: &Slot, capacity: usize) -> bool {
        let mut running = self.running_pre_pulls();
        if *self.pods_in_flight.borrow() >= capacity {
            return false;
        }
        running.push(slot.clone());
        true
    }

    /// A pod's pull is now in flight (new, or a pre-pull a pod joined).
    pub(super) fn pod_in_flight(&self) {
        self.pods_in_flight.send_modify(|pods| *pods += 1);
    }

    /// A pod's pull is about to wait for a slot: when none is free, the most recently started
    /// pre-pull is told to give its slot back.
    pub(super) fn take_slot_from_pre_pull(&self) {
        let Some(slots) = &self.slots else { return };
        if slots.available_permits() > 0 {
            return;
        }
        if let Some(pre_pull) = self.running_pre_pulls().pop() {
            pre_pull.preempt.notify_one();
        }
    }

    /// `slot` no longer holds a slot as a pre-pull (it ended, gave way or became a pod's pull).
    pub(super) fn not_running_pre_pull(&self, slot: &Slot) {
        self.running_pre_pulls().retain(|running| !std::sync::Arc::ptr_eq(running, slot));
    }

    /// A pod's pull joined `slot`: it is a pod's pull from now on.
    pub(super) fn promote(&self, slot: &Slot) {
        if slot.class.send_replace(PullClass::Pod) == PullClass::PrePull {
            self.not_running_pre_pull(slot);
            self.pod_in_flight();
        }
    }

    /// Resolves when a pod's pull takes the slot of `slot`'s pre-pull. Told after it became a
    /// pod's pull, it passes the word on to another pre-pull and keeps its slot.
    pub(super) async fn preempted(&self, slot: &Slot) {
        loop {
            slot.preempt.notified().await;
            let class = *slot.class.borrow();
            if class == PullClass::PrePull {
                return;
            }
            self.take_slot_from_pre_pull();
        }
    }

    fn running_pre_pulls(&self) -> std::sync::MutexGuard<'_, Vec<Slot>> {
        self.running_pre_pulls.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Counts a pre-pull waiting for a slot while it lives.
struct Waiting<'a>(&'a PullMetrics);

impl<'a> Waiting<'a> {
    fn new(metrics: &'a PullMetrics) -> Self {
        metrics.pre_pull_waiting(true);
        Self(metrics)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.pre_pull_waiting(false);
    }
}

/// A slot taken while the pods' pulls in flight (`pods`) leave one to spare.
async fn spare_slot(
    slots: &std::sync::Arc<Semaphore>,
    pods: &mut watch::Receiver<usize>,
    capacity: usize,
) -> OwnedSemaphorePermit {
    // The semaphore is never closed, and the sender lives as long as the scheduler.
    let acquire = || async {
        match slots.clone().acquire_owned().await {
            Ok(permit) => permit,
            Err(_) => std::future::pending().await,
        }
    };
    loop {
        let _ = pods.wait_for(|&pods| pods < capacity).await.map(drop);
        tokio::select! {
            permit = acquire() => return permit,
            _ = async { pods.wait_for(|&pods| pods >= capacity).await.map(drop) } => {}
        }
    }
}

/// Takes a pull out of the pulls in flight by class however its task ends: out of the running
/// pre-pulls, or no longer counted among the pods' pulls.
pub(super) struct Leaving<'a>(pub &'a Shared, pub &'a Slot);

impl Drop for Leaving<'_> {
    fn drop(&mut self) {
        let Self(shared, slot) = self;
        match *slot.class.borrow() {
            PullClass::PrePull => shared.not_running_pre_pull(slot),
            PullClass::Pod => shared.pods_in_flight.send_modify(|pods| *pods = pods.saturating_sub(1)),
        }
    }
}
