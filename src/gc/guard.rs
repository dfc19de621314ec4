//! What keeps an image from being collected while cri-imaged hands it out or pulls it.
//!
//! EnsureImageExists holds the gate shared from its presence check until it has marked the image
//! it answers with; the collector holds it alone while it checks one image and removes it. So an
//! image is either marked before the collector looks (and kept), or removed before the presence
//! check (which then finds it absent and pulls): never handed out and removed in the same breath.
//! A pull names what it pulls while it runs and marks what it pulled before it stops naming it.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::SystemTime,
};

use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::reference::ImageReference;

#[derive(Default)]
struct State {
    /// When each image id was last handed out or pulled.
    handed_out: HashMap<String, SystemTime>,
    /// Names being pulled (as the runtime lists them), with how many pulls of each run.
    pulling: HashMap<String, u32>,
}

/// Shared by the manager (which marks) and the collector (which checks).
#[derive(Default)]
pub struct ImageGuard {
    gate: RwLock<()>,
    state: Mutex<State>,
}

impl ImageGuard {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Held from a presence check until the present image found is marked (or not used).
    pub async fn handing_out(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read().await
    }

    /// Held by the collector while it checks one image and removes it.
    pub async fn removing(&self) -> RwLockWriteGuard<'_, ()> {
        self.gate.write().await
    }

    /// `id` was handed out or pulled at `now`.
    pub fn handed_out(&self, id: &str, now: SystemTime) {
        let mut state = self.state();
        match state.handed_out.get_mut(id) {
            Some(at) => *at = (*at).max(now),
            None => {
                state.handed_out.insert(id.to_owned(), now);
            }
        }
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

    /// The images handed out or pulled at or after `since`; older marks are forgotten.
    pub fn handed_out_since(&self, since: SystemTime) -> HashSet<String> {
        let mut state = self.state();
        state.handed_out.retain(|_, at| *at >= since);
        state.handed_out.keys().cloned().collect()
    }

    /// Whether `id` (listed under `names`) was handed out at or after `since`, or is being pulled.
    pub fn busy(&self, id: &str, names: &[String], since: SystemTime) -> bool {
        let state = self.state();
        state.handed_out.get(id).is_some_and(|at| *at >= since)
            || names.iter().any(|name| state.pulling.contains_key(name))
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
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    #[test]
    fn an_image_handed_out_after_a_pass_began_is_busy_and_old_marks_are_forgotten() {
        let guard = ImageGuard::default();
        guard.handed_out("sha256:a", at(10));
        guard.handed_out("sha256:a", at(5));
        assert!(guard.busy("sha256:a", &[], at(10)), "the later mark is kept");
        assert!(!guard.busy("sha256:a", &[], at(11)));
        assert!(!guard.busy("sha256:b", &[], at(0)));
        guard.handed_out("sha256:b", at(20));
        assert_eq!(guard.handed_out_since(at(15)), HashSet::from(["sha256:b".to_owned()]));
        assert!(!guard.busy("sha256:a", &[], at(0)), "forgotten");
    }

    #[test]
    fn an_image_is_busy_while_any_pull_of_one_of_its_names_runs() {
        let guard = Arc::new(ImageGuard::default());
        let reference = ImageReference::parse_normalized("busybox:1.36").expect("parses");
        let names = ["docker.io/library/busybox:1.36".to_owned()];
        let first = guard.pulling(&reference);
        let second = guard.pulling(&reference);
        assert!(guard.busy("sha256:c", &names, at(0)));
        drop(first);
        assert!(guard.busy("sha256:c", &names, at(0)), "one pull still runs");
        drop(second);
        assert!(!guard.busy("sha256:c", &names, at(0)));
        let pinned =
            ImageReference::parse_normalized(&format!("busybox:1.36@sha256:{}", "a".repeat(64))).expect("parses");
        let _digest = guard.pulling(&pinned);
        let by_digest = [format!("docker.io/library/busybox@sha256:{}", "a".repeat(64))];
        assert!(guard.busy("sha256:c", &by_digest, at(0)), "a tag and digest pull names its digest too");
    }

    #[tokio::test]
    async fn a_removal_waits_for_a_hand_out_under_way() {
        let guard = Arc::new(ImageGuard::default());
        let handing_out = guard.handing_out().await;
        let removal = tokio::spawn({
            let guard = guard.clone();
            async move {
                let _removing = guard.removing().await;
                guard.busy("sha256:a", &[], at(0))
            }
        });
        tokio::task::yield_now().await;
        assert!(!removal.is_finished(), "the removal waits for the gate");
        guard.handed_out("sha256:a", at(1));
        drop(handing_out);
        assert!(removal.await.expect("joins"), "it then sees the mark");
    }
}
