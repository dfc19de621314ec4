//! A pull's way to the runtime past its registry: the breaker's admission, the wait behind a
//! quiet registry, and the end of a pull that never got there.

use std::sync::Arc;

use super::{Shared, Slot};
use crate::pull::{
    PullError, PullKey,
    breaker::{Pass, state::Stage},
    metrics::PullResult,
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
        let error = match not_admitted {
            NotAdmitted::Refused(error) => error,
            NotAdmitted::Failed(error) => {
                pass.ended(Some(&error));
                error
            }
        };
        tracing::info!(image = %key.image, %error, "the pull did not start");
        self.in_flight().remove(key);
        self.metrics.refused(PullResult::RegistryUnavailable);
        slot.result.send_replace(Some(Err(Arc::new(error))));
    }
}
