//! A pod's pull secrets as a keyring, read as the kubelet reads them.

use std::{fmt, sync::Arc};

use secrecy::{ExposeSecret, SecretString};

use super::{
    Credential, CredentialSource, Keyring, SecretCoordinates,
    dockercfg::{self, DockerConfigError, Shape},
};

/// The secret type whose content is `{"auths": {...}}`.
pub const DOCKER_CONFIG_JSON: &str = "kubernetes.io/dockerconfigjson";
/// The older secret type whose content is the bare registry map.
pub const DOCKERCFG: &str = "kubernetes.io/dockercfg";

/// One pull secret as the caller sent it.
#[derive(Clone, Default)]
pub struct PullSecret {
    pub coordinates: SecretCoordinates,
    /// The secret's `type`; empty means [`DOCKER_CONFIG_JSON`].
    pub kind: String,
    /// `.dockerconfigjson` or `.dockercfg`, by `kind`.
    pub content: SecretString,
}

impl fmt::Debug for PullSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PullSecret")
            .field("coordinates", &self.coordinates)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

/// A pull secret whose content cannot be read. Names the secret and what is wrong, never what
/// it holds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pull secret {namespace}/{name}: its {data_key} {error}")]
pub struct SecretError {
    pub namespace: String,
    pub name: String,
    pub data_key: &'static str,
    pub error: DockerConfigError,
}

/// The pod's keyring: every entry of every secret of a docker config type, each under its key,
/// in secret order. Secrets of other types, and empty ones, are skipped as the kubelet skips
/// them (a pod may name any secret); one that does not parse fails the whole keyring.
pub fn keyring(secrets: &[PullSecret]) -> Result<Keyring, SecretError> {
    let mut keyring = Keyring::default();
    for secret in secrets {
        let (shape, data_key) = match secret.kind.as_str() {
            "" | DOCKER_CONFIG_JSON => (Shape::ConfigJson, ".dockerconfigjson"),
            DOCKERCFG => (Shape::Dockercfg, ".dockercfg"),
            other => {
                tracing::debug!(secret = %CredentialSource::Secret(secret.coordinates.clone()), kind = other, "not a docker config secret; skipped");
                continue;
            }
        };
        let content = secret.content.expose_secret();
        if content.is_empty() {
            continue;
        }
        let entries = dockercfg::parse(content.as_bytes(), shape).map_err(|error| SecretError {
            namespace: secret.coordinates.namespace.clone(),
            name: secret.coordinates.name.clone(),
            data_key,
            error,
        })?;
        for entry in entries {
            let source = CredentialSource::Secret(secret.coordinates.clone());
            keyring.add(&entry.key, Arc::new(Credential { auth: Arc::new(entry.auth), source }));
        }
    }
    Ok(keyring)
}
