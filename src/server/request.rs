//! Translation of wire requests into the manager's types; refuses what cannot be translated.

use std::time::Duration;

use secrecy::SecretString;
use zeroize::Zeroize;

use crate::{
    api::{self, PullPolicy as WirePolicy},
    credentials::{
        SecretCoordinates,
        account::{AudienceToken, MAX_ANNOTATIONS, MAX_TOKEN_BYTES, MAX_TOKENS, ServiceAccount},
        secrets::PullSecret,
    },
    ensure::{ClearBackoff, EnsureRequest, PodRef, check::CheckRequest},
    messages,
    prepull::{
        MAX_PULL_SECRETS, MAX_PULL_SECRETS_BYTES, Page, Submission,
        book::{Cursor, MAX_NAMESPACE, MAX_PRE_PULLS, MAX_RUNTIME_HANDLER},
    },
    pull::{Peer, PullClass},
    pull_policy::PullPolicy,
    reference::REFERENCE_LENGTH_MAX,
};

/// A request field that cannot be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("pull_policy {0} is not a known PullPolicy (use ALWAYS, IF_NOT_PRESENT, NEVER or leave it unset)")]
    UnknownPullPolicy(i32),
    #[error(
        "service_account.tokens: the token for audience {audience:?} is {bytes} bytes, more than {MAX_TOKEN_BYTES}"
    )]
    TokenTooLarge { audience: String, bytes: usize },
    #[error("service_account.tokens: {0} tokens, more than {MAX_TOKENS}")]
    TooManyTokens(usize),
    #[error("service_account.annotations: {0} annotations, more than {MAX_ANNOTATIONS}")]
    TooManyAnnotations(usize),
    #[error("service_account.namespace {account:?} is not the pod's namespace {pod:?}")]
    ForeignNamespace { account: String, pod: String },
    #[error("service_account.uid is required with service_account.name")]
    NameWithoutUid,
    #[error("{field}: {reason}")]
    BadDuration { field: &'static str, reason: String },
    #[error("images: none given")]
    NoImages,
    #[error("{field}: {count} given, more than {max}")]
    TooMany { field: &'static str, count: usize, max: usize },
    #[error("images[{index}]: {bytes} bytes, more than {REFERENCE_LENGTH_MAX} (the longest image reference)")]
    ImageTooLong { index: usize, bytes: usize },
    #[error("runtime_handler: {0} bytes, more than {MAX_RUNTIME_HANDLER} (a RuntimeClass's handler is a DNS label)")]
    HandlerTooLong(usize),
    #[error(
        "runtime_handler {0:?} is not a DNS label: lowercase letters, digits and '-', starting and ending with a letter or a digit, as a RuntimeClass's handler"
    )]
    HandlerNotALabel(String),
    #[error("namespace: {0} bytes, more than {MAX_NAMESPACE} (a Kubernetes namespace's name is a DNS label)")]
    NamespaceTooLong(usize),
    #[error(
        "namespace {0:?} is not a DNS label: lowercase letters, digits and '-', starting and ending with a letter or a digit, as a Kubernetes namespace's name"
    )]
    NamespaceNotALabel(String),
    #[error("pull_secrets: {0} bytes in all, more than {MAX_PULL_SECRETS_BYTES}")]
    SecretsTooLarge(usize),
    #[error("page_token: not one ListPrePulls gave")]
    BadPageToken,
    #[error(
        "give pod_uid and image (one pod's back-off for one image) or all (every back-off); the request gave neither"
    )]
    NothingToClear,
    #[error("give pod_uid and image (one pod's back-off for one image) or all (every back-off), not both")]
    PairAndAll,
    #[error("{0} is required with {1}: a back-off is one pod's pulls of one image")]
    HalfAPair(&'static str, &'static str),
}

impl RequestError {
    /// The offending field's name.
    pub fn field(&self) -> &'static str {
        match self {
            Self::UnknownPullPolicy(_) => "pull_policy",
            Self::TokenTooLarge { .. } | Self::TooManyTokens(_) => "service_account.tokens",
            Self::TooManyAnnotations(_) => "service_account.annotations",
            Self::ForeignNamespace { .. } => "service_account.namespace",
            Self::NameWithoutUid => "service_account.uid",
            Self::BadDuration { field, .. } => field,
            Self::NoImages | Self::ImageTooLong { .. } => "images",
            Self::TooMany { field, .. } => field,
            Self::HandlerTooLong(_) | Self::HandlerNotALabel(_) => "runtime_handler",
            Self::NamespaceTooLong(_) | Self::NamespaceNotALabel(_) => "namespace",
            Self::SecretsTooLarge(_) => "pull_secrets",
            Self::BadPageToken => "page_token",
            Self::NothingToClear | Self::PairAndAll => "all",
            Self::HalfAPair(missing, _) => missing,
        }
    }
}

/// The calling process, from the credentials the kernel took when it connected.
pub fn peer<T>(request: &tonic::Request<T>) -> Option<Peer> {
    let connection = request.extensions().get::<super::peer::ConnectedPeer>()?;
    let credentials = connection.uds.peer_cred?;
    let role = request.extensions().get::<super::roles::Granted>().and_then(|granted| granted.role);
    Some(Peer { uid: credentials.uid(), gid: credentials.gid(), pid: credentials.pid(), role })
}

impl TryFrom<api::EnsureImageExistsRequest> for EnsureRequest {
    type Error = RequestError;

    fn try_from(wire: api::EnsureImageExistsRequest) -> Result<Self, RequestError> {
        let pull_policy = match WirePolicy::try_from(wire.pull_policy) {
            Ok(WirePolicy::Unspecified) => None,
            Ok(WirePolicy::Always) => Some(PullPolicy::Always),
            Ok(WirePolicy::IfNotPresent) => Some(PullPolicy::IfNotPresent),
            Ok(WirePolicy::Never) => Some(PullPolicy::Never),
            Err(_) => return Err(RequestError::UnknownPullPolicy(wire.pull_policy)),
        };
        let pod = wire.pod.unwrap_or_default();
        let service_account =
            wire.service_account.map(|account| service_account(account, &pod.namespace)).transpose()?;
        Ok(Self {
            pull_secrets: wire.pull_secrets.into_iter().map(pull_secret).collect(),
            image: wire.image,
            pull_policy,
            pod: PodRef { namespace: pod.namespace, name: pod.name, uid: pod.uid, annotations: pod.annotations },
            container_name: wire.container_name,
            runtime_handler: wire.runtime_handler,
            sandbox_config: wire.pod_sandbox_config,
            service_account: service_account.flatten(),
            // From the connection, not the message: see [`peer`].
            peer: None,
            class: PullClass::Pod,
            keep_in: None,
        })
    }
}

impl From<api::CheckImagePolicyRequest> for CheckRequest {
    fn from(wire: api::CheckImagePolicyRequest) -> Self {
        let api::CheckImagePolicyRequest { image, namespace, pull_secrets } = wire;
        Self { image, namespace, pull_secrets: pull_secrets.into_iter().map(pull_secret).collect() }
    }
}

impl TryFrom<api::SubmitPrePullRequest> for Submission {
    type Error = RequestError;

    fn try_from(mut wire: api::SubmitPrePullRequest) -> Result<Self, RequestError> {
        if let Err(error) = check_submission(&wire) {
            wire.pull_secrets.iter_mut().for_each(|secret| secret.docker_config_json.zeroize());
            return Err(error);
        }
        Ok(Self {
            timeout: duration("timeout", wire.timeout)?,
            pin_for: duration("pin_for", wire.pin_for)?,
            pull_secrets: wire.pull_secrets.into_iter().map(pull_secret).collect(),
            images: wire.images,
            runtime_handler: wire.runtime_handler,
            namespace: wire.namespace,
            priority: wire.priority,
            // From the connection, not the message: see [`peer`].
            owner: None,
        })
    }
}

/// Refuses a submission with a field out of its bounds: what is kept (images, the runtime handler)
/// is kept for a month at most, and shown in every list.
fn check_submission(wire: &api::SubmitPrePullRequest) -> Result<(), RequestError> {
    if wire.images.is_empty() {
        return Err(RequestError::NoImages);
    }
    if wire.images.len() > MAX_PRE_PULLS {
        return Err(RequestError::TooMany { field: "images", count: wire.images.len(), max: MAX_PRE_PULLS });
    }
    if let Some((index, image)) = wire.images.iter().enumerate().find(|(_, image)| image.len() > REFERENCE_LENGTH_MAX) {
        return Err(RequestError::ImageTooLong { index, bytes: image.len() });
    }
    check_runtime_handler(&wire.runtime_handler)?;
    check_namespace(&wire.namespace)?;
    if wire.pull_secrets.len() > MAX_PULL_SECRETS {
        let count = wire.pull_secrets.len();
        return Err(RequestError::TooMany { field: "pull_secrets", count, max: MAX_PULL_SECRETS });
    }
    let secrets_bytes: usize = wire
        .pull_secrets
        .iter()
        .map(|secret| {
            let api::PullSecret { name, namespace, docker_config_json, uid, r#type } = secret;
            [name, namespace, docker_config_json, uid, r#type].iter().map(|field| field.len()).sum::<usize>()
        })
        .sum();
    if secrets_bytes > MAX_PULL_SECRETS_BYTES {
        return Err(RequestError::SecretsTooLarge(secrets_bytes));
    }
    Ok(())
}

/// Refuses a runtime handler that is not a DNS label (RFC 1123), as Kubernetes refuses a
/// RuntimeClass's; empty is the runtime's default.
fn check_runtime_handler(handler: &str) -> Result<(), RequestError> {
    if handler.len() > MAX_RUNTIME_HANDLER {
        return Err(RequestError::HandlerTooLong(handler.len()));
    }
    if !is_dns_label_or_empty(handler) {
        return Err(RequestError::HandlerNotALabel(messages::echo(handler).into_owned()));
    }
    Ok(())
}

/// Refuses a namespace that is not a DNS label (RFC 1123), as Kubernetes refuses a namespace's
/// name; empty is none (the node's default policy).
fn check_namespace(namespace: &str) -> Result<(), RequestError> {
    if namespace.len() > MAX_NAMESPACE {
        return Err(RequestError::NamespaceTooLong(namespace.len()));
    }
    if !is_dns_label_or_empty(namespace) {
        return Err(RequestError::NamespaceNotALabel(messages::echo(namespace).into_owned()));
    }
    Ok(())
}

/// Lowercase letters, digits and '-', neither first nor last (the length is the caller's).
fn is_dns_label_or_empty(text: &str) -> bool {
    let bytes = text.as_bytes();
    let inner = |byte: &u8| byte.is_ascii_lowercase() || byte.is_ascii_digit() || *byte == b'-';
    let end = |byte: Option<&u8>| byte.is_none_or(|byte| *byte != b'-');
    bytes.iter().all(inner) && end(bytes.first()) && end(bytes.last())
}

impl TryFrom<api::ListPrePullsRequest> for Page {
    type Error = RequestError;

    fn try_from(wire: api::ListPrePullsRequest) -> Result<Self, RequestError> {
        let after = match wire.page_token.as_str() {
            "" => None,
            token => Some(Cursor::parse(token).ok_or(RequestError::BadPageToken)?),
        };
        let size = usize::try_from(wire.page_size).unwrap_or(usize::MAX);
        Ok(Self { size: if size == 0 { Page::MAX_SIZE } else { size.min(Page::MAX_SIZE) }, after })
    }
}

impl TryFrom<api::ClearBackoffRequest> for ClearBackoff {
    type Error = RequestError;

    fn try_from(wire: api::ClearBackoffRequest) -> Result<Self, RequestError> {
        let api::ClearBackoffRequest { pod_uid, image, runtime_handler, all } = wire;
        let pair_given = !(pod_uid.is_empty() && image.is_empty() && runtime_handler.is_empty());
        match (all, pair_given) {
            (true, true) => Err(RequestError::PairAndAll),
            (true, false) => Ok(ClearBackoff::All),
            (false, false) => Err(RequestError::NothingToClear),
            (false, true) if pod_uid.is_empty() => Err(RequestError::HalfAPair("pod_uid", "image")),
            (false, true) if image.is_empty() => Err(RequestError::HalfAPair("image", "pod_uid")),
            (false, true) => Ok(ClearBackoff::Pair { pod_uid, image, runtime_handler }),
        }
    }
}

/// A wire duration, refusing a negative or unnormalised one.
fn duration(field: &'static str, wire: Option<prost_types::Duration>) -> Result<Option<Duration>, RequestError> {
    wire.map(|wire| {
        Duration::try_from(wire).map_err(|error| RequestError::BadDuration { field, reason: error.to_string() })
    })
    .transpose()
}

/// `text` moved into a secret string (wiped when dropped). Moved, not copied, when the string
/// holds no spare capacity (as decoded, it does not): a copy would be wiped too, and wiping costs
/// as much as copying again.
fn into_secret(text: &mut String) -> SecretString {
    if text.capacity() == text.len() {
        SecretString::from(std::mem::take(text))
    } else {
        let copied = SecretString::from(text.as_str());
        text.zeroize();
        copied
    }
}

/// A wire pull secret, its content moved into a secret string.
fn pull_secret(mut wire: api::PullSecret) -> PullSecret {
    let content = into_secret(&mut wire.docker_config_json);
    PullSecret {
        coordinates: SecretCoordinates { uid: wire.uid, namespace: wire.namespace, name: wire.name },
        kind: wire.r#type,
        content,
    }
}

/// The pod's service account, bounded, its tokens moved into secret strings; `None` when it has
/// no name (the pod runs without one). Tokens are named by audience only, never quoted; those not
/// kept are wiped.
fn service_account(mut wire: api::ServiceAccount, pod_namespace: &str) -> Result<Option<ServiceAccount>, RequestError> {
    let checked = check_account(&wire, pod_namespace);
    if !matches!(checked, Ok(true)) {
        wire.tokens.iter_mut().for_each(|token| token.token.zeroize());
        return checked.map(|_| None);
    }
    let tokens = wire
        .tokens
        .into_iter()
        .map(|mut token| AudienceToken { token: into_secret(&mut token.token), audience: token.audience })
        .collect();
    Ok(Some(ServiceAccount {
        namespace: wire.namespace,
        name: wire.name,
        uid: wire.uid,
        annotations: wire.annotations.into_iter().collect(),
        tokens,
    }))
}

/// Whether `wire` is a service account (it has a name), refusing one out of bounds or
/// inconsistent with the pod.
fn check_account(wire: &api::ServiceAccount, pod_namespace: &str) -> Result<bool, RequestError> {
    if wire.tokens.len() > MAX_TOKENS {
        return Err(RequestError::TooManyTokens(wire.tokens.len()));
    }
    if let Some(large) = wire.tokens.iter().find(|token| token.token.len() > MAX_TOKEN_BYTES) {
        let audience = messages::echo(&large.audience).into_owned();
        return Err(RequestError::TokenTooLarge { audience, bytes: large.token.len() });
    }
    if wire.annotations.len() > MAX_ANNOTATIONS {
        return Err(RequestError::TooManyAnnotations(wire.annotations.len()));
    }
    if wire.name.is_empty() {
        return Ok(false);
    }
    if wire.namespace != pod_namespace {
        let echo = |text: &str| messages::echo(text).into_owned();
        return Err(RequestError::ForeignNamespace { account: echo(&wire.namespace), pod: echo(pod_namespace) });
    }
    if wire.uid.is_empty() {
        return Err(RequestError::NameWithoutUid);
    }
    Ok(true)
}

#[cfg(test)]
mod tests;
