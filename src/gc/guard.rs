//! What keeps an image from being collected while cri-imaged hands it out or pulls it, without
//! a lock held across any runtime call.
//!
//! A logical clock orders the events. EnsureImageExists takes a ticket before its presence check
//! and completes the hand-out after it: the completion fails if a removal of that image was under
//! way or ended after the ticket (the presence check may have seen the image that was then
//! removed), and the caller treats the image as absent. The collector claims an image before it
//! removes it: the claim fails if the image was handed out since its pass began or is being
//! pulled. Both happen under one short mutex, so an image is either marked before the claim (and
//! kept) or claimed before the completion (which then fails): never handed out and removed at
//! once. A pull names what it pulls while it runs and marks what it pulled before it stops
//! naming it.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use tokio::time::Instant;

use crate::reference::ImageReference;

/// A removal still under way, as its end on the logical clock.
const UNDER_WAY: u64 = u64::MAX;

#[derive(Default)]
struct State {
    /// The logical clock: every mark, claim and end of a removal advances it.
    clock: u64,
    /// When each image id was last handed out or pulled, and on the clock.
    handed_out: HashMap<String, (Instant, u64)>,
    /// Names being pulled (as the runtime lists them), with how many pulls of each run.
    pulling: HashMap<String, u32>,
    /// Removals under way ([`UNDER_WAY`]) or ended, by image id, with their end on the clock;
    /// an ended one is kept while a hand-out that began before its end is under way.
    removals: HashMap<String, u64>,
    /// Tickets of the hand-outs under way, with how many hold each.
    hand_outs: BTreeMap<u64, u32>,
}

impl State {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn mark(&mut self, id: &str, now: Instant) {
        let at = (now, self.tick());
        match self.handed_out.get_mut(id) {
            Some(mark) => *mark = (mark.0.max(now), at.1),
            None => {
                self.handed_out.insert(id.to_owned(), at);
            }
        }
    }

    /// Forgets ended removals no hand-out under way can have overlapped; a removal still under
    /// way is kept whatever the hand-outs, for any hand-out that begins before it ends.
    fn forget_ended_removals(&mut self) {
        let oldest_ticket = self.hand_outs.keys().next().copied().unwrap_or(UNDER_WAY);
        self.removals.retain(|_, end| *end == UNDER_WAY || *end > oldest_ticket);
    }
}

/// Shared by the manager (which hands out and marks) and the collector (which claims).
#[derive(Default)]
pub struct ImageGuard {
    state: Mutex<State>,
}

impl ImageGuard {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Begins a hand-out: take it before the presence check.
    pub fn handing_out(self: &Arc<Self>) -> HandOut {
        let mut state = self.state();
        let ticket = state.clock;
        *state.hand_outs.entry(ticket).or_default() += 1;
        HandOut { guard: self.clone(), ticket }
    }

    /// `id` was pulled at `now`.
    pub fn pulled(&self, id: &str, now: Instant) {
        self.state().mark(id, now);
    }

    /// Names `reference` as being pulled until the returned guard drops.
    pub fn pulling(self: &Arc<Self>, reference: &ImageReference) -> Pulling {
        let mut names = vec![reference.to_string()];
        if let (Some(digest), Some(_)) = (reference.digest(), reference.tag()) {
            names.push(format!("{}@{digest}", reference.name()));
        }
        let mut state = self.state();
        for name in &names {
            *state.pulling.entry(name.clone()).or_default() += 1;
        }
        drop(state);
        Pulling { guard: self.clone(), names }
    }

    /// The clock now: a pass begins here, and marks after it keep their images.
    pub fn now(&self) -> u64 {
        self.state().clock
    }

    /// The images handed out or pulled at or after `since`; older marks are forgotten.
    pub fn handed_out_since(&self, since: Instant) -> HashSet<String> {
        let mut state = self.state();
        state.handed_out.retain(|_, (at, _)| *at >= since);
        state.handed_out.keys().cloned().collect()
    }

    /// Claims `id` (listed under `names`) for removal, unless it was handed out or pulled after
    /// `pass_began` or is being pulled. The claim ends when the returned guard drops: after the
    /// removal, and after the presence cache is emptied.
    pub fn claim(self: &Arc<Self>, id: &str, names: &[String], pass_began: u64) -> Option<Removal> {
        let mut state = self.state();
        let marked = state.handed_out.get(id).is_some_and(|(_, at)| *at > pass_began);
        if marked || names.iter().any(|name| state.pulling.contains_key(name)) {
            return None;
        }
        state.tick();
        state.removals.insert(id.to_owned(), UNDER_WAY);
        Some(Removal { guard: self.clone(), id: id.to_owned() })
    }
}

/// A hand-out under way; see [`ImageGuard::handing_out`].
pub struct HandOut {
    guard: Arc<ImageGuard>,
    ticket: u64,
}

impl HandOut {
    /// Marks `id` handed out at `now`, unless a removal of it was under way or ended since the
    /// ticket was taken: then `false`, and the caller must treat the image as absent.
    pub fn complete(&self, id: &str, now: Instant) -> bool {
        let mut state = self.guard.state();
        if state.removals.get(id).is_some_and(|end| *end > self.ticket) {
            return false;
        }
        state.mark(id, now);
        true
    }
}

impl Drop for HandOut {
    fn drop(&mut self) {
        let mut state = self.guard.state();
        if let Some(count) = state.hand_outs.get_mut(&self.ticket) {
            *count -= 1;
            if *count == 0 {
                state.hand_outs.remove(&self.ticket);
            }
        }
        state.forget_ended_removals();
    }
}

/// A removal under way; see [`ImageGuard::claim`].
pub struct Removal {
    guard: Arc<ImageGuard>,
    id: String,
}

impl Drop for Removal {
    fn drop(&mut self) {
        let mut state = self.guard.state();
        let end = state.tick();
        state.removals.insert(self.id.clone(), end);
        state.forget_ended_removals();
    }
}

/// A pull under way; see [`ImageGuard::pulling`].
pub struct Pulling {
    guard: Arc<ImageGuard>,
    names: Vec<String>,
}

impl Drop for Pulling {
    fn drop(&mut self) {
        let mut state = self.guard.state();
        for name in &self.names {
            if let Some(count) = state.pulling.get_mut(name) {
                *count -= 1;
                if *count == 0 {
                    state.pulling.remove(name);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn guard() -> Arc<ImageGuard> {
        Arc::new(ImageGuard::default())
    }

    #[test]
    fn an_image_handed_out_after_a_pass_began_cannot_be_claimed() {
        let guard = guard();
        let now = Instant::now();
        let before = guard.handing_out();
        assert!(before.complete("sha256:a", now));
        let pass_began = guard.now();
        assert!(guard.claim("sha256:a", &[], pass_began).is_some(), "handed out before the pass: the plan decides");
        let pass_began = guard.now();
        let after = guard.handing_out();
        assert!(after.complete("sha256:b", now));
        assert!(guard.claim("sha256:b", &[], pass_began).is_none(), "handed out during the pass");
    }

    #[test]
    fn a_hand_out_that_overlapped_a_removal_of_its_image_fails() {
        let guard = guard();
        let now = Instant::now();
        // Under way when the hand-out completes.
        let hand_out = guard.handing_out();
        let removal = guard.claim("sha256:a", &[], guard.now()).expect("claimed");
        assert!(!hand_out.complete("sha256:a", now));
        assert!(hand_out.complete("sha256:b", now), "another image is unaffected");
        // Ended after the ticket was taken: the presence check may have seen it.
        drop(removal);
        assert!(!hand_out.complete("sha256:a", now));
        drop(hand_out);
        // Ended before a new ticket: the new presence check saw the truth.
        assert!(guard.handing_out().complete("sha256:a", now));
        assert!(guard.state().removals.is_empty(), "no hand-out under way needs the ended removal");
    }

    #[test]
    fn a_removal_under_way_is_remembered_when_every_hand_out_before_it_has_ended() {
        let guard = guard();
        let now = Instant::now();
        let removal = guard.claim("sha256:a", &[], guard.now()).expect("claimed");
        // A hand-out of another image begins and ends while the removal runs.
        let other = guard.handing_out();
        assert!(other.complete("sha256:b", now));
        drop(other);
        // A hand-out begun now may see the image the runtime is still removing.
        let late = guard.handing_out();
        assert!(!late.complete("sha256:a", now), "the removal under way fails the hand-out");
        drop(removal);
        assert!(!late.complete("sha256:a", now), "it ended after the ticket");
    }

    #[test]
    fn an_image_is_kept_while_any_pull_of_one_of_its_names_runs() {
        let guard = guard();
        let reference = ImageReference::parse_normalized("busybox:1.36").expect("parses");
        let names = ["docker.io/library/busybox:1.36".to_owned()];
        let first = guard.pulling(&reference);
        let second = guard.pulling(&reference);
        assert!(guard.claim("sha256:c", &names, guard.now()).is_none());
        drop(first);
        assert!(guard.claim("sha256:c", &names, guard.now()).is_none(), "one pull still runs");
        drop(second);
        assert!(guard.claim("sha256:c", &names, guard.now()).is_some());
        let pinned =
            ImageReference::parse_normalized(&format!("busybox:1.36@sha256:{}", "a".repeat(64))).expect("parses");
        let _digest = guard.pulling(&pinned);
        let by_digest = [format!("docker.io/library/busybox@sha256:{}", "a".repeat(64))];
        assert!(
            guard.claim("sha256:d", &by_digest, guard.now()).is_none(),
            "a tag and digest pull names its digest too"
        );
    }

    #[test]
    fn old_marks_are_forgotten() {
        let guard = guard();
        let start = Instant::now();
        guard.pulled("sha256:a", start);
        guard.pulled("sha256:b", start + Duration::from_secs(60));
        assert_eq!(guard.handed_out_since(start + Duration::from_secs(30)), HashSet::from(["sha256:b".to_owned()]));
        assert!(!guard.state().handed_out.contains_key("sha256:a"));
    }
}
