//! The scopes of containers-policy.json(5)'s `docker` transport: which keys a policy may have, and
//! the keys an image is looked up under, most specific first, as containers/image looks them up.

use crate::{messages, reference::ImageReference};

/// Why a scope cannot be a key of `transports.docker`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScopeError {
    #[error("scope {0}: a wildcard is `*.` and a domain (`*.example.com`), with no port, path, tag or digest")]
    Wildcard(String),
    #[error("scope {scope} names no registry: scopes are full names, as images are looked up (here {suggested})")]
    NotFullName { scope: String, suggested: String },
    #[error("scope {0} is not an image reference, a namespace or a registry")]
    Invalid(String),
}

/// Checks a key of `transports.docker`: `""` (the transport's default), a wildcard domain
/// (`*.example.com`), a registry (`registry.example.com[:port]`), a namespace or repository under
/// it, or a repository with a tag or a digest.
pub fn validate(scope: &str) -> Result<(), ScopeError> {
    if scope.is_empty() {
        return Ok(());
    }
    if let Some(domain) = scope.strip_prefix("*.") {
        let labels_ok = !domain.is_empty()
            && domain.split('.').all(|label| {
                !label.is_empty() && label.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'-')
            });
        return if labels_ok { Ok(()) } else { Err(ScopeError::Wildcard(shown(scope))) };
    }
    let host = scope.split('/').next().unwrap_or_default();
    if !looks_like_registry(host) {
        let suggested = ImageReference::parse_normalized(scope)
            .map(|reference| reference.name())
            .unwrap_or_else(|_| format!("docker.io/{scope}"));
        return Err(ScopeError::NotFullName { scope: shown(scope), suggested: shown(&suggested) });
    }
    if !scope.contains('/') {
        return valid_host(host).then_some(()).ok_or_else(|| ScopeError::Invalid(shown(scope)));
    }
    // A namespace or a repository, with a tag or a digest or neither: the reference grammar's.
    match ImageReference::parse(scope) {
        Ok(reference) if reference.domain() == host => Ok(()),
        _ => Err(ScopeError::Invalid(shown(scope))),
    }
}

/// A value as an error quotes it: escaped, then bounded (an escape may take 10 characters a byte).
pub(super) fn shown(value: &str) -> String {
    messages::echo(&format!("{value:?}")).into_owned()
}

/// Whether the first component of a name is a registry, as the reference grammar decides it: a
/// dot, a port, or `localhost`.
fn looks_like_registry(host: &str) -> bool {
    host.contains('.') || host.contains(':') || host == "localhost"
}

fn valid_host(host: &str) -> bool {
    let (name, port) = match host.rsplit_once(':') {
        Some((name, port)) => (name, Some(port)),
        None => (host, None),
    };
    let port_ok =
        port.is_none_or(|port| !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit()));
    let name_ok = !name.is_empty()
        && name
            .split('.')
            .all(|label| !label.is_empty() && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
    port_ok && name_ok
}

/// The keys `reference` is looked up under, most specific first: the whole reference (with its
/// tag or digest), the repository, each namespace above it, the registry (with its port), then
/// wildcards of the registry's domain (without the port), as containers/image's
/// `PolicyConfigurationNamespaces` lists them. The transport's `""` and the policy's `default`
/// come after these.
pub fn lookups(reference: &ImageReference) -> Vec<String> {
    let name = reference.name();
    let mut keys = Vec::new();
    match (reference.tag(), reference.digest()) {
        (_, Some(digest)) => keys.push(format!("{name}@{digest}")),
        (Some(tag), None) => keys.push(format!("{name}:{tag}")),
        (None, None) => {}
    }
    let mut namespace = name.as_str();
    loop {
        keys.push(namespace.to_owned());
        match namespace.rfind('/') {
            Some(slash) => namespace = &namespace[..slash],
            None => break,
        }
    }
    let mut domain = namespace.split(':').next().unwrap_or_default();
    while let Some(dot) = domain.find('.') {
        domain = &domain[dot + 1..];
        keys.push(format!("*.{domain}"));
    }
    keys
}
