//! What the image service's health is, for the kubelet's HTTP probes (`/readyz` and `/livez` on
//! the metrics listener): the gRPC health says the same on the unix socket, but a probe reaching
//! that runs in the container, through the runtime the probe is about, and errors once the runtime
//! is gone.

use std::{sync::Mutex, time::Duration};

use tokio::time::Instant;

/// The image service's health as the runtime probes last found it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Health {
    /// Before the first probe has answered.
    #[default]
    Starting,
    /// The runtime answered the last probe: the image service is SERVING.
    Serving,
    /// The runtime did not: NOT_SERVING, and why.
    NotServing(String),
}

/// The image service's health, set by the runtime probes and read by the HTTP endpoints.
#[derive(Debug, Default)]
pub struct Readiness(Mutex<State>);

#[derive(Debug, Default)]
struct State {
    health: Health,
    /// Since when the runtime has not answered, through every probe since.
    unreachable_since: Option<Instant>,
}

impl Readiness {
    /// The health a probe found at `now`.
    pub fn set(&self, health: Health, now: Instant) {
        let mut state = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        state.unreachable_since = match health {
            Health::NotServing(_) => Some(state.unreachable_since.unwrap_or(now)),
            Health::Starting | Health::Serving => None,
        };
        state.health = health;
    }

    pub fn get(&self) -> Health {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).health.clone()
    }

    /// `Ok` with the body of a ready answer, or `Err` with why not.
    pub fn answer(&self) -> Result<&'static str, String> {
        match self.get() {
            Health::Serving => Ok("ok\n"),
            Health::Starting => Err("not ready: the container runtime has not been probed yet\n".to_owned()),
            Health::NotServing(why) => Err(format!("not ready: image service NOT_SERVING: {why}\n")),
        }
    }

    /// The liveness answer at `now`: `Err` once the runtime has been unreachable for `limit` or
    /// longer (with no limit, never). A runtime socket mounted as a file (the DaemonSet) is the
    /// inode of the runtime's socket when the container started: a restarted runtime makes a new
    /// one, which only a new container, with a new mount, reaches.
    pub fn live(&self, limit: Option<Duration>, now: Instant) -> Result<&'static str, String> {
        let since = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).unreachable_since;
        match (limit, since) {
            (Some(limit), Some(since)) if now.saturating_duration_since(since) >= limit => Err(format!(
                "not live: the container runtime has been unreachable for {}s (--liveness-runtime-timeout={}s); \
                 a new container reaches a runtime that made its socket again\n",
                now.saturating_duration_since(since).as_secs(),
                limit.as_secs()
            )),
            _ => Ok("ok\n"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_while_the_runtime_answers_and_says_why_not() {
        let (readiness, now) = (Readiness::default(), Instant::now());
        assert!(readiness.answer().is_err_and(|why| why.contains("not been probed yet")));
        readiness.set(Health::Serving, now);
        assert_eq!(readiness.answer(), Ok("ok\n"));
        readiness.set(Health::NotServing("connection refused".into()), now);
        assert_eq!(readiness.answer(), Err("not ready: image service NOT_SERVING: connection refused\n".into()));
    }

    #[test]
    fn live_until_the_runtime_has_been_unreachable_for_the_limit() {
        let (readiness, start, limit) = (Readiness::default(), Instant::now(), Some(Duration::from_secs(60)));
        let at = |secs| start + Duration::from_secs(secs);
        assert_eq!(readiness.live(limit, at(0)), Ok("ok\n"), "live before the first probe");
        readiness.set(Health::Serving, at(0));
        readiness.set(Health::NotServing("connection refused".into()), at(10));
        // Every failed probe since the first counts from the first.
        readiness.set(Health::NotServing("connection refused".into()), at(40));
        assert_eq!(readiness.live(limit, at(69)), Ok("ok\n"));
        let dead = readiness.live(limit, at(70)).expect_err("unreachable for 60 s");
        assert!(dead.contains("unreachable for 60s (--liveness-runtime-timeout=60s)"), "{dead}");
        assert!(readiness.live(None, at(3600)).is_ok(), "no limit: live whatever the runtime does");

        // One answer starts the count again.
        readiness.set(Health::Serving, at(71));
        readiness.set(Health::NotServing("connection refused".into()), at(72));
        assert_eq!(readiness.live(limit, at(131)), Ok("ok\n"));
        assert!(readiness.live(limit, at(132)).is_err());
    }
}
