//! Small pulls do not wait behind big ones: a pull whose image turns out big (its layers to fetch
//! come to `SchedulerConfig::yield_above` or more) gives its slot to the pulls queued behind it,
//! once, if it has fetched less than [`YIELD_WITHIN`] when they are there. It is cancelled and
//! takes a slot again only while no other pull waits for one, for up to [`YIELD_FOR_AT_MOST`]
//! (then it queues as any pull does); what it fetched is fetched again (containerd 1.6 drops a
//! cancelled pull's partial downloads), so that is bounded and small next to the image.

use std::{sync::Arc, time::Duration};

use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore, watch},
    time::Instant,
};

use crate::pull::poller::Tracker;

/// A pull that has fetched this much no longer gives its slot away.
pub const YIELD_WITHIN: u64 = 32 << 20;

/// The longest a pull that gave its slot away lets the pulls that come after it go first.
pub const YIELD_FOR_AT_MOST: Duration = Duration::from_secs(60);

/// Resolves once the pull tracked by `tracker` should give its slot to the pulls waiting for one
/// (`queued` counts them): its image is at least `above` bytes to fetch and it has fetched less
/// than [`YIELD_WITHIN`]. Never, with `above` unset, for a pull not watched, or once it is past
/// that.
pub(super) async fn big_pull_yields(above: Option<u64>, tracker: &Tracker, queued: &watch::Sender<usize>) {
    let Some(above) = above else { return std::future::pending().await };
    let (mut reports, mut queue) = (tracker.reports(), queued.subscribe());
    loop {
        // Both marked seen each time round, so that neither wakes the loop again for nothing.
        let (progress, waiting) =
            (reports.borrow_and_update().as_ref().map(|report| report.progress), *queue.borrow_and_update() > 0);
        if let Some(progress) = progress {
            if progress.bytes_done >= YIELD_WITHIN || progress.bytes_total < above {
                // The total is known once the manifest is: it does not grow.
                return std::future::pending().await;
            }
            if waiting {
                return;
            }
        }
        tokio::select! {
            changed = reports.changed() => if changed.is_err() { return std::future::pending().await },
            _ = queue.changed() => {}
        }
    }
}

/// A slot taken only while no other pull waits for one, for up to [`YIELD_FOR_AT_MOST`]: a pull
/// that gave its slot away lets every pull that queues meanwhile go first. `None` once that time
/// is up (it then queues as any pull does), or without a cap on slots.
pub(super) async fn last_in_line(
    slots: Option<&Arc<Semaphore>>,
    queued: &watch::Sender<usize>,
) -> Option<OwnedSemaphorePermit> {
    let slots = slots?;
    let (mut queue, until) = (queued.subscribe(), Instant::now() + YIELD_FOR_AT_MOST);
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
