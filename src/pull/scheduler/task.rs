//! A pull's own task: past its registry's breaker, into a slot, the upstream call (bounded,
//! watched, giving its slot away when its registry is silent, when it yields to smaller pulls or,
//! a pre-pull, to a pod's), and its result to every caller.

use std::{
    sync::{Arc, PoisonError, atomic::Ordering},
    time::SystemTime,
};

use tokio::{
    sync::{OwnedSemaphorePermit, watch},
    time::Instant,
};
use tower::ServiceExt;

use super::{
    PullSlot, PullState, RECENT, Shared, Slot,
    admission::{NotAdmitted, admit, silent_registry},
    pods_first::Leaving,
    yielding::{CHEAPER, YIELD_FOR_AT_MOST, last_in_line},
};
use crate::{
    events::{Event, EventType, reason},
    pull::{
        Pull, PullError, PullKey, Pulled,
        breaker::{Pass, state::Stage},
        metrics::PullResult,
        poller::{TrackedPull, Tracker},
    },
    reference::ImageReference,
};

/// How one upstream call ended.
enum Called {
    Ended(Result<Pulled, PullError>),
    /// It gave its slot to the pulls queued behind it.
    Yielded,
    /// A pre-pull, it gave its slot to a pod's pull.
    Preempted,
}

pub(super) async fn run(shared: Arc<Shared>, key: PullKey, mut pull: Pull, slot: Slot) {
    let _leaving = Leaving(&shared, &slot);
    let mut pass = shared.breakers.pass(pull.reference.as_deref().map(ImageReference::domain));
    let mut permit = loop {
        // Told for GetStatus; the wait behind a silent registry, only when there is one.
        slot.set_state(if pass.registry_unanswered() { PullState::Registry } else { PullState::Slot });
        let admitted = tokio::select! {
            admitted = admit(&mut pass) => admitted,
            () = shared.unwanted(&key, &slot) => return,
        };
        if let Err(not_admitted) = admitted {
            return shared.refuse(&key, &slot, pass, not_admitted);
        }
        slot.set_state(PullState::Slot);
        let Some(permit) = shared.acquire_for(&key, &slot, &pull).await else {
            tracing::debug!(image = %key.image, "every caller gave up while the pull was queued; dropped");
            return;
        };
        // The registry went quiet while this pull was queued: wait for it holding no slot.
        if !pass.registry_unanswered() {
            break permit;
        }
    };
    // The breaker may have opened while the pull was queued.
    if let Err(refused) = pass.admit(Stage::Start) {
        drop(permit);
        return shared.refuse(&key, &slot, pass, NotAdmitted::Refused(refused));
    }
    // A full image filesystem is collected before the pull adds to it.
    if let Some(room) = shared.room.get() {
        room.make_room().await;
    }
    // A registry's pull duration counts from the first slot: the queue before it is ours, not
    // the registry's (a yielded pull's wait for its next slot is in: its callers waited it).
    let pulling_since = Instant::now();
    let (mut tracker, mut may_yield) = (shared.start(&pull, &slot), true);
    let result = loop {
        pull.wait_for_rate_limit |= slot.waits_for_rate_limit.load(Ordering::Relaxed);
        let called = tokio::select! {
            // A pull that ended as its last caller left still publishes: its image exists.
            biased;
            called = shared.call(pull.clone(), (&tracker, &slot), &pass, &mut permit, may_yield) => called,
            () = shared.unwanted(&key, &slot) => {
                tracing::info!(image = %key.image, "every caller went away; the pull was cancelled");
                shared.metrics.finished(pass.host(), PullResult::Cancelled);
                return;
            }
        };
        let result = match called {
            Called::Ended(result) => result,
            Called::Yielded => {
                let (left, held_in) =
                    slot.cost().map_or((0, None), |cost| (cost.total.saturating_sub(cost.done), cost.held_in));
                tracing::info!(
                    image = %key.image,
                    left,
                    resumes = held_in.is_some(),
                    "a big pull made way for cheaper pods' pulls"
                );
                shared.metrics.finished(pass.host(), PullResult::Yielded);
                slot.queued_again();
                drop(tracker);
                may_yield = false;
                // Its next call is the same pull: the rate limit that let the first pass waits.
                pull.wait_for_rate_limit = true;
                // It goes on from what its lease holds, if it held any.
                if held_in.is_some() {
                    pull.keep_in = held_in;
                }
                drop(permit.take());
                let until = Instant::now() + YIELD_FOR_AT_MOST;
                let behind_cheaper = async {
                    shared.cheaper_ones_ended(&slot, left / CHEAPER, until).await;
                    last_in_line(shared.slots.as_ref(), &shared.queued, until).await
                };
                let last = tokio::select! {
                    last = behind_cheaper => last,
                    () = shared.unwanted(&key, &slot) => return,
                };
                let next = match last {
                    Some(last) => Some(last),
                    None => match shared.acquire(&key, &slot, &pull).await {
                        Some(next) => next,
                        None => return,
                    },
                };
                (permit, tracker) = (next, shared.start(&pull, &slot));
                continue;
            }
            Called::Preempted => {
                tracing::info!(image = %key.image, "a pre-pull gave its slot to a pod's pull; queued again");
                shared.metrics.finished(pass.host(), PullResult::Preempted);
                let message = format!("Pre-pull of {:?} gave its slot to a pod's pull; queued again", slot.image);
                let event = Event::new(EventType::Normal, reason::PRE_PULL_YIELDED, message);
                shared.events.publish(Event { image: slot.image.clone(), ..event });
                slot.queued_again();
                drop(tracker);
                shared.not_running_pre_pull(&slot);
                drop(permit.take());
                let Some(next) = shared.acquire_for(&key, &slot, &pull).await else { return };
                (permit, tracker) = (next, shared.start(&pull, &slot));
                continue;
            }
        };
        let mut in_flight = shared.in_flight();
        // Refused at once, but a caller who would wait has joined meanwhile: wait for it.
        if matches!(result, Err(PullError::RateLimited))
            && !pull.wait_for_rate_limit
            && slot.waits_for_rate_limit.load(Ordering::Relaxed)
        {
            continue;
        }
        // Forget the key before publishing, so a request arriving later starts a fresh pull,
        // unless it decided to pull before this one ended (see `recent`).
        in_flight.remove(&key);
        if let Ok(pulled) = &result {
            let now = Instant::now();
            let mut recent = shared.recent();
            recent.retain(|_, (ended, _)| now.saturating_duration_since(*ended) < RECENT);
            recent.insert(key.clone(), (now, pulled.clone()));
        }
        break result;
    };
    if result.is_ok() {
        shared.metrics.pulled(pass.host(), pulling_since.elapsed());
    }
    shared.metrics.finished(
        pass.host(),
        match &result {
            Ok(_) => PullResult::Success,
            Err(PullError::RateLimited) => PullResult::RateLimited,
            Err(PullError::TimedOut(_)) => PullResult::TimedOut,
            Err(PullError::Stalled { .. }) => PullResult::Stalled,
            Err(PullError::RegistryUnavailable(_)) => PullResult::RegistryUnavailable,
            Err(_) => PullResult::Failure,
        },
    );
    pass.ended(result.as_ref().err());
    shared.not_running_pre_pull(&slot);
    drop(permit);
    match &result {
        Ok(_) => tracker.completed(),
        Err(_) => drop(tracker),
    }
    slot.result.send_replace(Some(result.map_err(Arc::new)));
}

impl Shared {
    /// One upstream pull, bounded by the pull timeout and cut short when `tracker` finds it
    /// stalled or its registry silent, or when it yields; dropping the call cancels the
    /// runtime's pull. Silent for the answer grace, it gives its `permit` back.
    async fn call(
        &self,
        pull: Pull,
        (tracker, slot): (&Tracker, &Slot),
        pass: &Pass,
        permit: &mut Option<OwnedSemaphorePermit>,
        may_yield: bool,
    ) -> Called {
        let host = pull.reference.as_deref().map(ImageReference::domain).unwrap_or_default().to_owned();
        let mut pull = pull;
        let cleared = Arc::new(watch::Sender::new(Some(Instant::now())));
        pull.cleared = Some(cleared.clone());
        *slot.cleared.lock().unwrap_or_else(PoisonError::into_inner) = Some(cleared.clone());
        let sized = Pull { cleared: None, ..pull.clone() };
        let call = self.service.clone().oneshot(pull);
        let bounded = async {
            match self.config.pull_timeout {
                Some(limit) => tokio::time::timeout(limit, call).await.unwrap_or(Err(PullError::TimedOut(limit))),
                None => call.await,
            }
        };
        let unanswered = silent_registry(&self.config, &host, tracker, pass, &cleared, permit);
        let answered = async {
            tracker.answered().await;
            pass.answered();
            std::future::pending::<std::convert::Infallible>().await
        };
        let above = self.config.yield_above.filter(|_| may_yield);
        tokio::select! {
            result = bounded => Called::Ended(result),
            report = tracker.stalled() => Called::Ended(Err(PullError::Stalled {
                timeout: report.stalled.unwrap_or_default(),
                bytes_done: report.progress.bytes_done,
                bytes_total: report.progress.bytes_total,
            })),
            error = unanswered => Called::Ended(Err(error)),
            never = answered => match never {},
            () = self.makes_way(slot, &sized, above, tracker) => Called::Yielded,
            () = self.preempted(slot) => Called::Preempted,
        }
    }

    /// The upstream pull of `slot` starts: counted, and watched when it can be.
    fn start(&self, pull: &Pull, slot: &Slot) -> Tracker {
        self.metrics.started();
        *slot.started_at.lock().unwrap_or_else(PoisonError::into_inner) = Some(SystemTime::now());
        slot.set_state(PullState::Pulling);
        self.track(pull, slot)
    }

    /// Starts watching the pull of `slot`, when it can be watched.
    fn track(&self, pull: &Pull, slot: &Slot) -> Tracker {
        let (Some(progress), Some(reference)) = (&self.progress, &pull.reference) else {
            return Tracker::untracked();
        };
        // A pull that may make way for smaller ones keeps what it fetches, to go on from there.
        let lease_above = match (&pull.keep_in, self.config.yield_above) {
            (None, Some(above)) => Some((self.resume_lease(), above)),
            _ => None,
        };
        let tracker = progress.track(TrackedPull {
            image: slot.image.clone(),
            reference: reference.clone(),
            started_at: SystemTime::now(),
            waiting: slot.waiting.clone(),
            keep_in: pull.keep_in.clone(),
            lease_above,
        });
        *slot.progress.lock().unwrap_or_else(PoisonError::into_inner) = Some(tracker.reports());
        tracker
    }
}

impl PullSlot {
    /// Its upstream call ended without a result (it gave its slot away): it waits for a slot again.
    fn queued_again(&self) {
        *self.started_at.lock().unwrap_or_else(PoisonError::into_inner) = None;
        *self.progress.lock().unwrap_or_else(PoisonError::into_inner) = None;
        *self.cleared.lock().unwrap_or_else(PoisonError::into_inner) = None;
        self.set_state(PullState::Slot);
    }
}
