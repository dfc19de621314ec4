//! Small pulls do not wait behind big ones, nor share the link with them: a pull whose image turns
//! out big (its layers come to `SchedulerConfig::yield_above` or more) makes way, once, for the
//! pods' pulls that are cheaper: those queued for a slot (unless known to fetch more than a
//! [`CHEAPER`]th of what it has left) and those downloading an image of at most that much. It is cancelled and goes on only once none
//! is left (or after [`YIELD_FOR_AT_MOST`]), taking a slot only while no other pull waits for one.
//!
//! What it fetched is not fetched again: the poller keeps a big pull's downloads in a lease of
//! their own from the moment its manifest shows it big ([`super::super::poller::LEASE_LIFETIME`]),
//! and the pull that goes on names that lease, so containerd resumes each layer where it was. A
//! pull whose downloads could not be held makes way only while it has fetched less than
//! [`YIELD_WITHIN`], since that much is fetched again. A pull that cannot be watched (no content
//! service: CRI-O) is sized from its registry's manifest once others run beside it
//! ([`crate::pull::size`]), and makes way only within [`UNWATCHED_WITHIN`] of its start: nothing
//! keeps what it fetched, nor says how much that is.

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use futures_util::future::BoxFuture;
use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore, watch},
    time::Instant,
};

use super::{Cost, PullState, Shared, Slot};
use crate::pull::{Pull, PullClass, poller::Tracker};

/// A pull whose downloads are not held and that has fetched this much no longer makes way.
pub const YIELD_WITHIN: u64 = 32 << 20;

/// The longest a pull that made way waits for the cheaper pulls to end.
pub const YIELD_FOR_AT_MOST: Duration = Duration::from_secs(60);

/// A pull makes way for a pod's pull of at most this fraction of what it has left to fetch.
pub const CHEAPER: u64 = 4;

/// A pull that cannot be watched makes way only this soon after it started: it then fetches again
/// what it had, which is at most this long of the link.
pub const UNWATCHED_WITHIN: Duration = Duration::from_secs(2);

/// How often a big pull looks at the pulls beside it (their sizes change as the poller finds
/// their manifests).
const LOOK_EVERY: Duration = Duration::from_millis(100);

impl Shared {
    /// Resolves once the pull of `slot`, tracked by `tracker`, should make way (see the module):
    /// never with `above` unset, or once it is known to be under `above` or past what it may have
    /// fetched. A pull that cannot be watched is sized from its registry, once others are beside
    /// it.
    pub(super) async fn makes_way(&self, slot: &Slot, pull: &Pull, above: Option<u64>, tracker: &Tracker) {
        let Some(above) = above else { return std::future::pending().await };
        let (began, watched) = (Instant::now(), tracker.watched());
        let (mut reports, mut queue) = (tracker.reports(), self.queued.subscribe());
        let mut reporting = watched;
        // Asked once: the registry's read while it runs, then `None`.
        let mut sizing: Option<BoxFuture<'static, Option<u64>>> = None;
        loop {
            // Both marked seen each time round, so that neither wakes the loop again for nothing.
            reports.borrow_and_update();
            queue.borrow_and_update();
            let fetched_again_too_much = |cost: &Cost| match watched {
                true => cost.held_in.is_none() && cost.done >= YIELD_WITHIN,
                false => began.elapsed() >= UNWATCHED_WITHIN,
            };
            match slot.cost() {
                // The total is known once the manifest is: it does not grow.
                Some(cost) if cost.total < above || fetched_again_too_much(&cost) => {
                    return std::future::pending().await;
                }
                Some(cost) if self.cheaper_pod_pulls(slot, cost.total.saturating_sub(cost.done) / CHEAPER) => return,
                Some(_) => {}
                None if !watched && began.elapsed() >= UNWATCHED_WITHIN => return std::future::pending().await,
                // Sized from the registry where that is sooner than the poller (a few round trips)
                // and matters: beside others, for a pull nothing else sizes; beside a big one.
                None if !slot.size_asked.load(Ordering::Relaxed)
                    && (!watched && self.in_flight().len() > 1 || self.big_pull_beside(slot, above)) =>
                {
                    slot.size_asked.store(true, Ordering::Relaxed);
                    sizing = self.sizes.get().map(|sizes| sizes.size(pull));
                }
                None => {}
            }
            tokio::select! {
                changed = reports.changed(), if reporting => reporting = changed.is_ok(),
                _ = queue.changed() => {}
                size = async {
                    match sizing.as_mut() {
                        Some(sizing) => sizing.await,
                        None => std::future::pending().await,
                    }
                }, if sizing.is_some() => {
                    sizing = None;
                    slot.sized.store(size.unwrap_or(0), Ordering::Relaxed);
                    if size.is_none() && !watched {
                        return std::future::pending().await;
                    }
                }
                () = tokio::time::sleep(LOOK_EVERY) => {}
            }
        }
    }

    /// Whether a pod's pull other than `own` waits for a slot (unless it is known to fetch more
    /// than `bytes`), or downloads an image of at most `bytes` that it has not finished.
    pub(super) fn cheaper_pod_pulls(&self, own: &Slot, bytes: u64) -> bool {
        let queued = *self.queued.borrow() > 0;
        self.in_flight().values().any(|slot| {
            let cost = slot.cost();
            !Arc::ptr_eq(slot, own)
                && *slot.class.borrow() == PullClass::Pod
                && match slot.state() {
                    PullState::Slot => queued && cost.is_none_or(|cost| cost.total.saturating_sub(cost.done) <= bytes),
                    PullState::Pulling => cost.is_some_and(|cost| cost.total <= bytes && cost.done < cost.total),
                    _ => false,
                }
        })
    }

    /// Whether a pull other than `own` is known to fetch `above` bytes or more.
    fn big_pull_beside(&self, own: &Slot, above: u64) -> bool {
        let in_flight = self.in_flight();
        in_flight.values().any(|slot| !Arc::ptr_eq(slot, own) && slot.cost().is_some_and(|cost| cost.total >= above))
    }

    /// Resolves once no pod's pull cheaper than `bytes` is under way beside `own`, or at `until`.
    pub(super) async fn cheaper_ones_ended(&self, own: &Slot, bytes: u64, until: Instant) {
        while Instant::now() < until && self.cheaper_pod_pulls(own, bytes) {
            tokio::time::sleep(LOOK_EVERY.min(until.saturating_duration_since(Instant::now()))).await;
        }
    }
}

/// A slot taken only while no other pull waits for one, until `until`: a pull that made way lets
/// every pull that queues meanwhile go first. `None` once that time is up (it then queues as any
/// pull does), or without a cap on slots.
pub(super) async fn last_in_line(
    slots: Option<&Arc<Semaphore>>,
    queued: &watch::Sender<usize>,
    until: Instant,
) -> Option<OwnedSemaphorePermit> {
    let slots = slots?;
    let mut queue = queued.subscribe();
    loop {
        let nobody_waits = queue.wait_for(|&waiting| waiting == 0);
        tokio::time::timeout_at(until, nobody_waits).await.ok()?.ok()?;
        tokio::select! {
            permit = slots.clone().acquire_owned() => return permit.ok(),
            // Another pull queued first: it goes before this one, which leaves its place.
            _ = queue.wait_for(|&waiting| waiting > 0) => {}
            () = tokio::time::sleep_until(until) => return None,
        }
    }
}

/// Counts a pull waiting for a slot while it lives.
pub(super) struct Queued<'a>(&'a watch::Sender<usize>);

impl<'a> Queued<'a> {
    pub(super) fn new(queued: &'a watch::Sender<usize>) -> Self {
        queued.send_modify(|count| *count += 1);
        Self(queued)
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|count| *count = count.saturating_sub(1));
    }
}
