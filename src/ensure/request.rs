//! One EnsureImageExists request as the manager reads it, and its answer: the image validated
//! and given its default tag, the events' subject.

use std::{collections::HashMap, time::Duration};

use crate::cri::{ImageSpec, PodSandboxConfig};

use super::EnsureError;
use crate::{
    credentials::{account::ServiceAccount, secrets::PullSecret},
    events::{Pod, Subject},
    messages,
    pull::{Peer, PullClass},
    pull_policy::PullPolicy,
    reference::{self, ImageReference},
};

/// The pod an image is for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Passed to the runtime in the image spec.
    pub annotations: HashMap<String, String>,
}

/// One EnsureImageExists request, already translated from the wire.
#[derive(Debug, Clone, Default)]
pub struct EnsureRequest {
    /// The image as written in the pod spec.
    pub image: String,
    /// `None` when the caller left the policy unspecified.
    pub pull_policy: Option<PullPolicy>,
    pub pod: PodRef,
    pub container_name: String,
    pub runtime_handler: String,
    pub sandbox_config: Option<PodSandboxConfig>,
    /// The pod's image pull secrets, read only when a pull is needed (as the kubelet does).
    pub pull_secrets: Vec<PullSecret>,
    /// The pod's service account and its tokens, for credential-provider plugins (KEP-4412).
    pub service_account: Option<ServiceAccount>,
    /// Who called: not on the wire, from the connection.
    pub peer: Option<Peer>,
    /// A pod's pull, or a pre-pull that yields to pods' (not on the wire).
    pub class: PullClass,
    /// The lease that keeps what the pull fetched (a pre-pull's; not on the wire).
    pub keep_in: Option<std::sync::Arc<str>>,
}

/// A successful answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnsureOutcome {
    /// The runtime's image ref.
    pub image_ref: String,
    /// The kubelet's event message.
    pub message: String,
    /// Set when this request pulled the image.
    pub pull: Option<PullTimes>,
    /// The image size the runtime reports; 0 when unknown.
    pub image_size: u64,
}

/// How long a pull took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PullTimes {
    /// The upstream PullImage call alone.
    pub pull: Duration,
    /// From the decision to pull until the result, waiting included.
    pub total: Duration,
}

/// Who and what the request's events are about, as the caller wrote them (bounded).
pub(super) fn subject_of(request: &EnsureRequest) -> Subject {
    let pod = &request.pod;
    let known = !(pod.uid.is_empty() && pod.name.is_empty() && pod.namespace.is_empty());
    // Events repeat what the caller wrote: bounded, however much it wrote.
    let echo = |value: &str| messages::echo(value).into_owned();
    Subject {
        pod: known.then(|| Pod { namespace: echo(&pod.namespace), name: echo(&pod.name), uid: echo(&pod.uid) }),
        container: echo(&request.container_name),
        image: echo(&request.image),
    }
}

/// Validates the image and applies the default tag: the parsed reference (default tag
/// included) and the spec for the runtime (the image as written, tagged; the pod's annotations
/// and runtime handler).
pub(super) fn with_default_tag(request: &EnsureRequest) -> Result<(ImageReference, ImageSpec), EnsureError> {
    let (reference, tagged) = reference::parse_with_default_tag(&request.image).map_err(|source| {
        let error =
            EnsureError::InvalidImageName { message: messages::invalid_image_name(&request.image, &source), source };
        tracing::warn!("{error}");
        error
    })?;
    let spec = ImageSpec {
        image: tagged,
        annotations: request.pod.annotations.clone(),
        runtime_handler: request.runtime_handler.clone(),
        ..Default::default()
    };
    Ok((reference, spec))
}
