//! Registry credentials for pulls, found the kubelet's way: the pod's pull secrets first, then
//! the node's own (its docker config and credential-provider plugins).
//!
//! - [`account`]: the pod's service account and its tokens, for plugins (KEP-4412).
//! - [`auth`]: a credential's fields, redacted and wiped on drop.
//! - [`dockercfg`]: docker config documents (`config.json`, `.dockercfg`, pull secrets).
//! - [`keyring`]: which credentials apply to an image (pure).
//! - [`secrets`]: a pod's pull secrets as a keyring.
//! - [`node`]: the node's docker config file, re-read when it changes.
//! - [`plugin`]: the kubelet's credential-provider plugins: config, exec and cache.

pub mod account;
pub mod auth;
pub mod dockercfg;
pub mod hash;
pub mod keyring;
pub mod node;
pub mod plugin;
pub mod secrets;

use std::sync::Arc;

pub use self::{account::ServiceAccount, auth::RegistryAuth, keyring::Keyring};

/// Where a credential came from: logged by name, and recorded for pulls it made.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CredentialSource {
    /// A pod's pull secret, shared by every credential it holds.
    Secret(Arc<SecretCoordinates>),
    /// The node's docker config file.
    NodeConfig,
    /// A credential-provider plugin, by its name in the config; with the service account it was
    /// asked for, when it was given the pod's token (KEP-4412).
    Plugin { name: String, account: Option<Arc<AccountCoordinates>> },
}

/// Which service account a plugin's credential was given for: what a pull record names.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct AccountCoordinates {
    pub uid: String,
    pub namespace: String,
    pub name: String,
}

/// Which secret a credential came from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct SecretCoordinates {
    pub uid: String,
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for CredentialSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Secret(secret) => write!(f, "pull secret {}/{}", secret.namespace, secret.name),
            Self::NodeConfig => f.write_str("the node's docker config"),
            Self::Plugin { name, account: None } => write!(f, "credential provider {name:?}"),
            Self::Plugin { name, account: Some(account) } => {
                write!(f, "credential provider {name:?} for service account {}/{}", account.namespace, account.name)
            }
        }
    }
}

/// One credential to try, and where it came from.
#[derive(Debug)]
pub struct Credential {
    pub auth: Arc<RegistryAuth>,
    pub source: CredentialSource,
}

/// The node's own credentials: its docker config and its credential-provider plugins, replaced
/// whole when the configuration is reloaded.
pub struct NodeCredentials {
    sources: std::sync::RwLock<Arc<NodeSources>>,
}

struct NodeSources {
    docker_config: node::NodeDockerConfig,
    plugins: plugin::Plugins,
}

impl NodeCredentials {
    pub fn new(docker_config: node::NodeDockerConfig, plugins: plugin::Plugins) -> Self {
        Self { sources: std::sync::RwLock::new(Arc::new(NodeSources { docker_config, plugins })) }
    }

    /// Takes `other`'s docker config and plugins (with their caches) for lookups from now on; a
    /// lookup under way finishes with the old ones.
    pub fn replace(&self, other: NodeCredentials) {
        let sources = other.sources.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
        *self.sources.write().unwrap_or_else(std::sync::PoisonError::into_inner) = sources;
    }

    /// No docker config, no plugins: every pull without a pod secret is anonymous.
    pub fn none() -> Self {
        Self::new(node::NodeDockerConfig::none(), plugin::Plugins::none())
    }

    /// The node's credentials for `image` (a repository name without tag or digest), as the
    /// kubelet orders them: the docker config's matches, then the plugins'. Each is a keyring of
    /// its own (most specific key first, Docker Hub's fallback applied apart); the plugins' answers
    /// share one, in config order. Plugins with `tokenAttributes` are asked with `account`.
    pub async fn lookup(&self, image: &str, account: Option<&ServiceAccount>) -> Vec<Arc<Credential>> {
        let sources = self.sources.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let mut docker_config = Keyring::for_image(image);
        for (key, credential) in sources.docker_config.current().iter() {
            docker_config.add(key, credential.clone());
        }
        let mut plugins = Keyring::for_image(image);
        for (key, credential) in sources.plugins.provide(image, account).await {
            plugins.add(&key, credential);
        }
        let mut found = docker_config.lookup(image);
        found.extend(plugins.lookup(image));
        found
    }
}

/// Everything to try for `image`, in order: the pod's keyring, then the node's (its plugins asked
/// with the pod's service `account`). Unlike the
/// kubelet, a login found twice (under two keys, or in two sources) is tried once: a second try
/// could only fail as the first did, and would cost the registry a request.
pub async fn for_pull(
    image: &str,
    pod: &Keyring,
    node: &NodeCredentials,
    account: Option<&ServiceAccount>,
) -> Vec<Arc<Credential>> {
    let mut found = pod.lookup(image);
    found.extend(node.lookup(image, account).await);
    let mut seen: Vec<[&str; 6]> = Vec::with_capacity(found.len());
    let mut unique = Vec::with_capacity(found.len());
    for credential in &found {
        let fields = credential.auth.fields();
        if !seen.contains(&fields) {
            seen.push(fields);
            unique.push(credential.clone());
        }
    }
    unique
}

#[cfg(test)]
mod tests;
