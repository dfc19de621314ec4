//! Whether a pull's registry answers, asked of the registry itself where the runtime says nothing
//! of a pull while it runs (CRI-O, which has no content service; containerd with
//! `--pull-progress=false`): the same signal the poller gives from containerd's downloads, so the
//! scheduler treats a silent registry the same way on either runtime (its slot given back after
//! the answer grace, the registry's next pulls waiting, the pull failed at the resolve timeout).
//!
//! One probe per registry serves all its pulls waiting for an answer: `GET /v2/` at the hosts the
//! runtime pulls from ([`crate::registry::ping`]), each attempt bounded, asked again until it
//! answers or no pull waits. A hung registry with ten pulls costs one connection at a time.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError, Weak,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::sync::watch;

use super::poller::{Answer, ProgressPoller, TrackPulls, TrackedPull, Tracker};
use crate::registry::{RegistryHosts, ping};

/// One attempt's bound where no resolve timeout gives one.
pub const LONGEST_ATTEMPT: Duration = Duration::from_secs(10);

/// How long one attempt may wait for an answer: half the resolve timeout (a registry slow to
/// answer one connection is asked on another before the pull fails), within 1 s and
/// [`LONGEST_ATTEMPT`].
pub fn attempt_bound(resolve_timeout: Option<Duration>) -> Duration {
    resolve_timeout.map_or(LONGEST_ATTEMPT, |timeout| (timeout / 2).clamp(Duration::from_secs(1), LONGEST_ATTEMPT))
}

/// The registries being asked, each with the pulls waiting for its answer.
pub struct RegistryProbes {
    hosts: Arc<RegistryHosts>,
    attempt: Duration,
    waiting: Mutex<HashMap<String, HashMap<u64, watch::Sender<bool>>>>,
    next_id: AtomicU64,
    /// Attempts made, for tests.
    attempts: AtomicU64,
}

impl RegistryProbes {
    /// Probes reaching registries as `hosts` says, each attempt bounded by `attempt`.
    pub fn new(hosts: Arc<RegistryHosts>, attempt: Duration) -> Arc<Self> {
        let waiting = Mutex::default();
        Arc::new(Self { hosts, attempt, waiting, next_id: AtomicU64::new(0), attempts: AtomicU64::new(0) })
    }

    fn waiting(&self) -> MutexGuard<'_, HashMap<String, HashMap<u64, watch::Sender<bool>>>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The attempts made so far on every registry.
    pub fn attempts(&self) -> u64 {
        self.attempts.load(Ordering::Relaxed)
    }

    /// A pull of `domain` begins: its answer, once the registry gives one (its probe started if
    /// none runs).
    pub fn answer(self: &Arc<Self>, domain: &str) -> Answer {
        let (sender, answered) = watch::channel(false);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let first = {
            let mut waiting = self.waiting();
            let first = !waiting.contains_key(domain);
            waiting.entry(domain.to_owned()).or_default().insert(id, sender);
            first
        };
        if first {
            tokio::spawn(probe(Arc::downgrade(self), domain.to_owned()));
        }
        Answer::new(answered, Box::new(Waiter { probes: Arc::downgrade(self), domain: domain.to_owned(), id }))
    }
}

/// A pull among those waiting for its registry's answer, until dropped.
struct Waiter {
    probes: Weak<RegistryProbes>,
    domain: String,
    id: u64,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Some(probes) = self.probes.upgrade()
            && let Some(pulls) = probes.waiting().get_mut(&self.domain)
        {
            pulls.remove(&self.id);
        }
    }
}

/// Asks `domain` until it answers (every pull waiting then is answered) or no pull waits.
async fn probe(probes: Weak<RegistryProbes>, domain: String) {
    loop {
        let (hosts, attempt) = {
            let Some(probes) = probes.upgrade() else { return };
            let mut waiting = probes.waiting();
            if waiting.get(&domain).is_none_or(HashMap::is_empty) {
                waiting.remove(&domain);
                return;
            }
            probes.attempts.fetch_add(1, Ordering::Relaxed);
            (probes.hosts.current(), probes.attempt)
        };
        let settled = match tokio::time::timeout(attempt, ping(&hosts, &domain)).await {
            Ok(Ok(status)) => {
                tracing::debug!(registry = %domain, %status, "the registry answered its pulls' probe");
                true
            }
            // Refused, no such host, TLS: no sign of a registry that hangs, and the runtime's own
            // pull fails as fast and says why. Judging those is the runtime's (its view of the
            // network, a proxy, may differ from ours); a probe only finds silence.
            Ok(Err(error)) => {
                tracing::debug!(registry = %domain, %error, "the registry's probe failed at once; the runtime's pull judges");
                true
            }
            Err(_) => {
                tracing::debug!(registry = %domain, ?attempt, "no answer to the registry's probe yet; asked again");
                false
            }
        };
        if settled {
            let Some(probes) = probes.upgrade() else { return };
            // Removed under the lock: a pull coming after starts the next probe.
            if let Some(pulls) = probes.waiting().remove(&domain) {
                for answered in pulls.values() {
                    answered.send_replace(true);
                }
            }
            return;
        }
    }
}

/// Pulls tracked by the poller where the runtime has its content service, by a probe of their
/// registry where it has not (or is not asked: no poller); both until the poller knows which.
pub struct Liveness {
    pub poller: Option<Arc<ProgressPoller>>,
    pub probes: Arc<RegistryProbes>,
}

impl TrackPulls for Liveness {
    fn track(&self, pull: TrackedPull) -> Tracker {
        let domain = pull.reference.domain().to_owned();
        match &self.poller {
            Some(poller) => match poller.supported() {
                Some(true) => poller.track(pull),
                None => poller.track(pull).or_probed(self.probes.answer(&domain)),
                Some(false) => Tracker::probed(self.probes.answer(&domain)),
            },
            None => Tracker::probed(self.probes.answer(&domain)),
        }
    }
}

#[cfg(test)]
mod tests;
