//! Cheapest first: pods' pulls waiting for a slot take one in the order of what they have left to
//! fetch, the smallest first, so that the pods that can start soonest do while the big pulls keep
//! the link busy. A pull that waits beside others is sized from its registry's manifest before
//! any layer moves ([`crate::pull::size`]); one whose size is not known ranks as a pull of
//! `SchedulerConfig::yield_above` (after the known small ones, before the known big ones), and
//! equals go in the order they came. A pull that has waited [`YIELD_FOR_AT_MOST`] goes first, so
//! that no big pull is starved. With `yield_above` unset, the line is first come, first served.
//!
//! Only the first in that order waits on the slots' semaphore, so the semaphore's own order
//! (arrival) never decides; it steps back when a cheaper pull comes.

use std::{
    collections::BTreeSet,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
};

use futures_util::future::BoxFuture;
use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore, watch},
    time::Instant,
};

use super::{Slot, yielding::YIELD_FOR_AT_MOST};

/// A waiting pull's place: its rank (bytes left to fetch, as known), then its arrival.
type Place = (u64, u64);

/// The pulls waiting for a slot, in the order they will get one.
pub(super) struct Line {
    waiting: Mutex<BTreeSet<Place>>,
    /// Sent at each change of the line, waking those in it.
    changed: watch::Sender<()>,
    arrivals: AtomicU64,
}

impl Default for Line {
    fn default() -> Self {
        Self { waiting: Mutex::default(), changed: watch::Sender::new(()), arrivals: AtomicU64::new(0) }
    }
}

/// How a pull in the line is ranked.
pub(super) struct Ranking<F> {
    /// The rank of a pull whose size is not known; `None`: every pull ranks the same.
    pub unknown: Option<u64>,
    /// Reads the pull's size from its registry (called once others wait beside it).
    pub sizing: F,
}

impl Line {
    fn waiting(&self) -> MutexGuard<'_, BTreeSet<Place>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot from `slots` for `slot`'s pull, once it is first in the line.
    pub(super) async fn take<F>(&self, slots: &Arc<Semaphore>, slot: &Slot, ranking: Ranking<F>) -> OwnedSemaphorePermit
    where
        F: FnOnce() -> Option<BoxFuture<'static, Option<u64>>>,
    {
        let Ranking { unknown, sizing: size } = ranking;
        let rank = |slot: &Slot| match unknown {
            Some(unknown) => slot.cost().map_or(unknown, |cost| cost.total.saturating_sub(cost.done)),
            None => 0,
        };
        let (aged, mut aged_out) = (Instant::now() + YIELD_FOR_AT_MOST, false);
        let mut place = InLine::enter(self, rank(slot));
        let mut changes = self.changed.subscribe();
        // Sized only beside others, and only once: it costs the registry a manifest read.
        let mut size = Some(size)
            .filter(|_| unknown.is_some() && slot.cost().is_none() && !slot.size_asked.load(Ordering::Relaxed));
        let mut sizing = None;
        loop {
            changes.borrow_and_update();
            let first = {
                let waiting = self.waiting();
                if waiting.len() > 1
                    && let Some(size) = size.take()
                {
                    slot.size_asked.store(true, Ordering::Relaxed);
                    sizing = size();
                }
                waiting.first() == Some(&place.place)
            };
            let sized = async {
                match sizing.as_mut() {
                    Some(sizing) => sizing.await,
                    None => std::future::pending().await,
                }
            };
            let permit = async {
                match first {
                    // The semaphore is never closed.
                    true => slots.clone().acquire_owned().await.ok(),
                    false => std::future::pending().await,
                }
            };
            tokio::select! {
                Some(permit) = permit => return permit,
                _ = changes.changed() => {}
                size = sized => {
                    sizing = None;
                    slot.sized.store(size.unwrap_or(0), Ordering::Relaxed);
                    if !aged_out {
                        place.rerank(rank(slot));
                    }
                }
                () = tokio::time::sleep_until(aged), if !aged_out => {
                    aged_out = true;
                    place.rerank(0);
                }
            }
        }
    }
}

/// A place in the line, left on drop.
struct InLine<'a> {
    line: &'a Line,
    place: Place,
}

impl<'a> InLine<'a> {
    fn enter(line: &'a Line, rank: u64) -> Self {
        let place = (rank, line.arrivals.fetch_add(1, Ordering::Relaxed));
        line.waiting().insert(place);
        line.changed.send_replace(());
        Self { line, place }
    }

    fn rerank(&mut self, rank: u64) {
        if rank == self.place.0 {
            return;
        }
        let mut waiting = self.line.waiting();
        waiting.remove(&self.place);
        self.place.0 = rank;
        waiting.insert(self.place);
        drop(waiting);
        self.line.changed.send_replace(());
    }
}

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        self.line.waiting().remove(&self.place);
        self.line.changed.send_replace(());
    }
}
