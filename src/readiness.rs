//! What the image service's health is, for the kubelet's HTTP probes (`/readyz` on the metrics
//! listener): the gRPC health says the same on the unix socket, but a probe reaching that runs in
//! the container, through the runtime the probe is about, and errors once the runtime is gone.

use std::sync::Mutex;

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

/// The image service's health, set by the runtime probes and read by the HTTP endpoint.
#[derive(Debug, Default)]
pub struct Readiness(Mutex<Health>);

impl Readiness {
    pub fn set(&self, health: Health) {
        *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = health;
    }

    pub fn get(&self) -> Health {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// `Ok` with the body of a ready answer, or `Err` with why not.
    pub fn answer(&self) -> Result<&'static str, String> {
        match self.get() {
            Health::Serving => Ok("ok\n"),
            Health::Starting => Err("not ready: the container runtime has not been probed yet\n".to_owned()),
            Health::NotServing(why) => Err(format!("not ready: image service NOT_SERVING: {why}\n")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_while_the_runtime_answers_and_says_why_not() {
        let readiness = Readiness::default();
        assert!(readiness.answer().is_err_and(|why| why.contains("not been probed yet")));
        readiness.set(Health::Serving);
        assert_eq!(readiness.answer(), Ok("ok\n"));
        readiness.set(Health::NotServing("connection refused".into()));
        assert_eq!(readiness.answer(), Err("not ready: image service NOT_SERVING: connection refused\n".into()));
    }
}
