//! The daemon's one stop signal: requested once (SIGTERM, SIGINT, a test), observed by every
//! loop and server, so that each stops by itself instead of being aborted.

use tokio::sync::watch;

/// Requests the stop; dropping it requests it too.
#[derive(Debug)]
pub struct ShutdownTrigger(watch::Sender<bool>);

/// Observes the stop; cheap to clone.
#[derive(Debug, Clone)]
pub struct Shutdown(watch::Receiver<bool>);

/// A new, not yet requested, stop signal.
pub fn channel() -> (ShutdownTrigger, Shutdown) {
    let (trigger, observed) = watch::channel(false);
    (ShutdownTrigger(trigger), Shutdown(observed))
}

impl ShutdownTrigger {
    /// Asks every observer to stop.
    pub fn request(&self) {
        self.0.send_replace(true);
    }
}

impl Shutdown {
    /// Resolves once the stop is requested (or its trigger is gone).
    pub async fn requested(mut self) {
        let _ = self.0.wait_for(|requested| *requested).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_observer_sees_one_request() {
        let (trigger, shutdown) = channel();
        let observers = [shutdown.clone(), shutdown].map(|shutdown| tokio::spawn(shutdown.requested()));
        trigger.request();
        for observer in observers {
            observer.await.expect("stopped");
        }
    }

    #[tokio::test]
    async fn a_dropped_trigger_stops_everyone() {
        let (trigger, shutdown) = channel();
        drop(trigger);
        shutdown.requested().await;
    }
}
