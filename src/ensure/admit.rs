//! The node's image policy where EnsureImageExists lets an image in: refused early, audited, or
//! its signatures verified (a present image at its own digest, from memory when that digest met
//! the requirement before); and the pod's credentials, which a check or a pull reads with.

use std::sync::Arc;

use super::{EnsureError, EnsureRequest, Manager, backoff_name, request::subject_of};
use crate::{
    credentials::{self, Credential},
    events::{EventType, Subject, reason as event_reason},
    policy::{Admission, Pending, Refusal},
    pull::PullError,
    reference::ImageReference,
    runtime::ImageRuntime,
};

impl<R: ImageRuntime> Manager<R> {
    /// The policy's word on the image for this pod: a refusal audit mode lets in is evented
    /// (`PolicyAudit`) and let in; signatures it requires are to be verified.
    pub(super) fn admit(
        &self,
        request: &EnsureRequest,
        reference: &ImageReference,
    ) -> Result<Option<Pending>, Refusal> {
        let namespace = Some(request.pod.namespace.as_str()).filter(|namespace| !namespace.is_empty());
        match self.policy.check(reference, namespace)? {
            Admission::Admit => Ok(None),
            Admission::Audited(audited) => {
                let about = subject_of(request);
                self.events.publish(about.event(EventType::Warning, event_reason::POLICY_AUDIT, audited.message));
                Ok(None)
            }
            Admission::Verify(pending) => Ok(Some(pending)),
        }
    }

    /// A present image's signatures, at its own digest: from memory when that digest met these
    /// requirements before (no credential is looked up), else read with the pod's credentials.
    pub(super) async fn verify_present(
        &self,
        request: &EnsureRequest,
        (reference, digest): (&ImageReference, Option<String>),
        pending: Pending,
        about: &Subject,
    ) -> Result<(), EnsureError> {
        let signed = self.pulls.signed();
        let Some(digest) = digest else {
            let why = format!(
                "the present image has no digest in {} (it was not pulled from there), so its signatures cannot be checked",
                reference.name()
            );
            return match signed.settle_unverifiable(reference, pending, &why, about) {
                Ok(()) => Ok(()),
                Err(refused) => Err(self.refused(request, refused)),
            };
        };
        let credentials = match signed.is_verified(&digest, &pending.requirements) {
            true => Vec::new(),
            false => self.credentials(request, &reference.name()).await?,
        };
        match signed.verify(reference, pending, Some(&digest), &credentials, about).await {
            Ok(_) => Ok(()),
            Err(refused) => Err(self.refused(request, refused)),
        }
    }

    /// The pull credentials for the pod: its secrets, then the node's.
    pub(super) async fn credentials(
        &self,
        request: &EnsureRequest,
        repository: &str,
    ) -> Result<Vec<Arc<Credential>>, EnsureError> {
        let pod_keyring = self.prepared_secrets.keyring_for(repository, &request.pull_secrets).map_err(|source| {
            tracing::warn!(error = %source, "pull secret refused");
            EnsureError::InvalidPullSecret { source }
        })?;
        Ok(credentials::for_pull(repository, &pod_keyring, &self.node_credentials, request.service_account.as_ref())
            .await)
    }

    /// The policy refused the image for this pod: a failed pull, backed off.
    pub(super) fn refused(&self, request: &EnsureRequest, refused: PullError) -> EnsureError {
        let backs_off = match self.check_backoff(&request.pod.uid, &request.image, &request.runtime_handler) {
            Ok(backs_off) => backs_off,
            Err(backing_off) => return backing_off,
        };
        let pair = backs_off.then(|| backoff_name(request));
        self.record_failed(&request.image, Arc::new(refused), pair)
    }
}
