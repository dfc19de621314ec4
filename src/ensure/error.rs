//! Why EnsureImageExists fails, each failure one of the kubelet's reasons.

use std::{sync::Arc, time::Duration};

use crate::{
    credentials::secrets::SecretError,
    messages::{self, waiting_reason},
    pull::PullError,
    records::RecordsError,
    reference::ReferenceError,
    runtime::RuntimeError,
};

/// Why EnsureImageExists failed; each variant is one of the kubelet's reasons.
#[derive(Debug, thiserror::Error)]
pub enum EnsureError {
    #[error("{message}")]
    InvalidImageName { message: String, source: ReferenceError },
    #[error("{message}")]
    ImageInspect { message: String, source: RuntimeError },
    #[error("{message}")]
    NeverPull { message: String },
    /// A pull secret that cannot be read; nothing was pulled.
    #[error("{source}")]
    InvalidPullSecret { source: SecretError },
    #[error("{message}")]
    BackOff { message: String, retry_after: Duration },
    #[error("{message}")]
    Pull { message: String, source: Arc<PullError> },
    #[error("{message}")]
    RegistryUnavailable { message: String, source: Arc<PullError> },
    #[error("{message}")]
    SignatureValidationFailed { message: String, source: Arc<PullError> },
    /// The pull's intent could not be recorded, so the pull was not made.
    #[error("{message}")]
    RecordIntent { message: String, source: RecordsError },
}

impl EnsureError {
    /// The kubelet's reason string.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidImageName { .. } => waiting_reason::INVALID_IMAGE_NAME,
            Self::ImageInspect { .. } => waiting_reason::IMAGE_INSPECT_ERROR,
            Self::NeverPull { .. } => waiting_reason::ERR_IMAGE_NEVER_PULL,
            Self::BackOff { .. } => waiting_reason::IMAGE_PULL_BACK_OFF,
            Self::Pull { .. } | Self::InvalidPullSecret { .. } | Self::RecordIntent { .. } => {
                waiting_reason::ERR_IMAGE_PULL
            }
            Self::RegistryUnavailable { .. } => waiting_reason::REGISTRY_UNAVAILABLE,
            Self::SignatureValidationFailed { .. } => waiting_reason::SIGNATURE_VALIDATION_FAILED,
        }
    }
}

/// The kubelet's `evalCRIPullErr`: a runtime message that starts with a CRI error name selects
/// that reason.
///
/// The kubelet's CRI client (since 1.28) hands the prefix test the bare message of an UNKNOWN
/// status only, and the whole Go error (`rpc error: code = … desc = …`) of any other; we test the
/// runtime's own message whatever its code, so that a runtime answering with another code still
/// gets the reason.
pub fn classify_pull_error(image: &str, error: Arc<PullError>) -> EnsureError {
    // Ours (a registry that could not be reached or did not answer, or whose breaker is open)
    // reads as the runtime's.
    if let PullError::RegistryUnavailable(detail) = &*error {
        let message = messages::registry_unavailable(image, &format!(": {detail}"));
        return EnsureError::RegistryUnavailable { message, source: error };
    }
    if let PullError::PolicyRejected(detail) = &*error {
        let message = messages::signature_validation_failed(image, &format!(": {detail}"));
        return EnsureError::SignatureValidationFailed { message, source: error };
    }
    if let PullError::Runtime(runtime) = &*error {
        let runtime_message = runtime.runtime_message();
        if let Some(detail) = runtime_message.strip_prefix(waiting_reason::REGISTRY_UNAVAILABLE) {
            let message = messages::registry_unavailable(image, detail);
            return EnsureError::RegistryUnavailable { message, source: error };
        }
        if let Some(detail) = runtime_message.strip_prefix(waiting_reason::SIGNATURE_VALIDATION_FAILED) {
            let message = messages::signature_validation_failed(image, detail);
            return EnsureError::SignatureValidationFailed { message, source: error };
        }
    }
    EnsureError::Pull { message: error.kubelet_message(), source: error }
}

/// The refusal of an absent image under `Never`.
pub(super) fn never_pull(image: &str) -> EnsureError {
    let message = messages::never_pull(image);
    tracing::warn!("{message}");
    EnsureError::NeverPull { message }
}
