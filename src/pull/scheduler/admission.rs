//! A pull's way to the runtime past its registry: the breaker's admission, the wait behind a
//! quiet registry, the end of a pull that never got there, and a registry gone silent.

use std::{sync::Arc, time::Duration};

use tokio::{
    sync::{OwnedSemaphorePermit, watch},
    time::Instant,
};

use super::{SchedulerConfig, Shared, Slot};
use crate::{
    messages,
    pull::{
        PullError, PullKey,
        breaker::{Pass, state::Stage},
        metrics::PullResult,
        poller::Tracker,
    },
};

/// Why a pull never reached the runtime.
pub(super) enum NotAdmitted {
    /// Its registry's breaker refused it: that says nothing new about the registry.
    Refused(PullError),
    /// The unanswered pull of its registry it waited for failed: it fails too, and counts.
    Failed(PullError),
}

/// A pull's way past its registry's breaker and its wait behind an unanswered pull.
pub(super) async fn admit(pass: &mut Pass) -> Result<(), NotAdmitted> {
    pass.admit(Stage::Queue).map_err(NotAdmitted::Refused)?;
    pass.wait_while_unanswered().await.map_err(NotAdmitted::Failed)
}

impl Shared {
    /// Ends a pull that never reached the runtime: its callers get the error.
    pub(super) fn refuse(&self, key: &PullKey, slot: &Slot, pass: Pass, not_admitted: NotAdmitted) {
        self.metrics.refused(pass.host(), PullResult::RegistryUnavailable);
        let error = match not_admitted {
            NotAdmitted::Refused(error) => error,
            NotAdmitted::Failed(error) => {
                pass.ended(Some(&error));
                error
            }
        };
        tracing::info!(image = %key.image, %error, "the pull did not start");
        self.in_flight().remove(key);
        slot.result.send_replace(Some(Err(Arc::new(error))));
    }
}

/// Resolves once the pull's registry has been silent for the resolve timeout, counted from when
/// the pull got past the rate limit (`cleared`: a wait for a token is ours, not the registry's);
/// on the way, silent for the answer grace, the pull gives its `permit` back and the registry's
/// next pulls wait for it. Never, with no resolve timeout.
pub(super) async fn silent_registry(
    config: &SchedulerConfig,
    host: &str,
    tracker: &Tracker,
    pass: &Pass,
    cleared: &watch::Sender<Option<Instant>>,
    permit: &mut Option<OwnedSemaphorePermit>,
) -> PullError {
    let unanswered_for = |quiet: Duration| {
        let mut cleared = cleared.subscribe();
        async move {
            loop {
                let Ok(since) = cleared.wait_for(Option::is_some).await.map(|since| *since) else {
                    return std::future::pending().await;
                };
                let since = since.unwrap_or_else(Instant::now);
                tokio::select! {
                    () = tracker.unanswered_for(quiet, since) => return,
                    _ = cleared.changed() => {}
                }
            }
        }
    };
    unanswered_for(config.answer_grace).await;
    if permit.take().is_some() {
        tracing::info!(registry = %host, "no answer from the registry yet: the pull gives its slot back");
    }
    pass.unanswered();
    let Some(timeout) = config.resolve_timeout else { return std::future::pending().await };
    unanswered_for(timeout).await;
    PullError::RegistryUnavailable(format!(
        "registry {host:?} did not answer within {} (--registry-resolve-timeout); the pull was cancelled",
        messages::go_duration_millis(timeout)
    ))
}
