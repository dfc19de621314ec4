//! The kubelet's event for a request's outcome.

use super::{EnsureError, EnsureOutcome};
use crate::{
    events::{Event, EventType, Subject, reason as event_reason},
    messages,
    pull::PullError,
};

/// The kubelet's event for a request's outcome, when it records one and the pull's task has not
/// (see [`crate::pull::path`]): `Pulled` for an image already present, `InspectFailed` for a name that does
/// not parse or a failed ImageStatus, `ErrImageNeverPull`, and `BackOff` (Normal, as the
/// kubelet's), and `SignatureValidationFailed` for an image the node's policy refused. Like the
/// kubelet, none for a pull secret that does not parse or an intent that
/// cannot be recorded: those are only in the answer.
pub(super) fn outcome_event(about: &Subject, result: &Result<EnsureOutcome, EnsureError>) -> Option<Event> {
    use EventType::{Normal, Warning};
    let (kind, reason, message) = match result {
        Ok(outcome) if outcome.pull.is_none() => (Normal, event_reason::PULLED, outcome.message.clone()),
        Ok(_) => return None,
        Err(EnsureError::InvalidImageName { message, .. } | EnsureError::ImageInspect { message, .. }) => {
            (Warning, event_reason::INSPECT_FAILED, message.clone())
        }
        Err(EnsureError::NeverPull { message }) => (Warning, event_reason::ERR_IMAGE_NEVER_PULL, message.clone()),
        Err(EnsureError::BackOff { .. }) => (Normal, event_reason::BACK_OFF, messages::back_off_event(&about.image)),
        // No pull was made: the policy's refusal is the request's own event.
        Err(EnsureError::SignatureValidationFailed { message, source })
            if matches!(**source, PullError::PolicyRejected(_)) =>
        {
            (Warning, event_reason::SIGNATURE_VALIDATION_FAILED, message.clone())
        }
        Err(
            EnsureError::InvalidPullSecret { .. }
            | EnsureError::RecordIntent { .. }
            | EnsureError::Pull { .. }
            | EnsureError::RegistryUnavailable { .. }
            | EnsureError::SignatureValidationFailed { .. },
        ) => return None,
    };
    let event = about.event(kind, reason, message);
    Some(match result {
        Ok(outcome) => Event { image_ref: outcome.image_ref.clone(), ..event },
        Err(_) => event,
    })
}
