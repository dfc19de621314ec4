//! The kubelet's keyring: which credentials apply to an image.
//!
//! A key is a registry host, optionally with a port and a path (`registry.local:5000/team`),
//! written with or without a scheme. An image matches a key when the ports are equal, the hosts
//! have as many dot-separated labels and each label matches its glob (`*.example.com`), and the
//! key's path is a prefix of the image's. Keys are visited most specific first (reverse lexical
//! order) and every matching key contributes its credentials, in the order they were added.
//! When no key matches and the image is on Docker Hub, the `index.docker.io` credentials apply.

mod glob;
mod url;

use std::{collections::BTreeMap, sync::Arc};

use self::url::SchemelessUrl;
use super::Credential;

/// The key Docker Hub's credentials are stored under (`https://index.docker.io/v1/` becomes it).
const DEFAULT_REGISTRY_KEY: &str = "index.docker.io";

/// Credentials by registry key.
#[derive(Default)]
pub struct Keyring {
    /// Keyed by the normalised key; iterated in reverse, most specific first.
    keys: BTreeMap<String, KeyCredentials>,
    keeps: Keeps,
}

/// Which credentials a keyring keeps.
#[derive(Default)]
enum Keeps {
    #[default]
    Everything,
    /// Only those that can apply to one image (parsed; `None` when it does not parse): keys that
    /// match it, and Docker Hub's for the fallback.
    OnlyFor(Option<SchemelessUrl>),
}

struct KeyCredentials {
    /// The key as a lookup parses it; `None` when it does not parse and so matches nothing.
    parsed: Option<SchemelessUrl>,
    credentials: Vec<Arc<Credential>>,
}

impl Keyring {
    /// A keyring for lookups of `image` alone: whatever cannot apply to it is dropped as it is
    /// added, so a pod's many secrets cost little more than reading them. Its lookup of `image`
    /// answers as a full keyring's would.
    pub fn for_image(image: &str) -> Self {
        Self { keys: BTreeMap::new(), keeps: Keeps::OnlyFor(SchemelessUrl::parse(image)) }
    }

    /// Adds `credential` under the registry key `location` as a docker config writes it. A key
    /// that is not a URL is skipped (the kubelet logs and ignores it too); returns whether it was
    /// added.
    pub fn add(&mut self, location: &str, credential: Arc<Credential>) -> bool {
        let Some(key) = normalise_key(location) else {
            tracing::warn!(key = %location.escape_debug(), "docker config key is not a URL; ignored");
            return false;
        };
        if let Some(entry) = self.keys.get_mut(&key) {
            entry.credentials.push(credential);
            return true;
        }
        let parsed = SchemelessUrl::parse(&key);
        if let Keeps::OnlyFor(image) = &self.keeps {
            let applies = match (&parsed, image) {
                (Some(parsed), Some(image)) => parsed.matches(image),
                _ => false,
            };
            if !applies && key != DEFAULT_REGISTRY_KEY {
                return true;
            }
        }
        self.keys.insert(key, KeyCredentials { parsed, credentials: vec![credential] });
        true
    }

    /// Every credential whose key matches `image` (a repository name such as
    /// `registry.local:5000/team/app`, without tag or digest), most specific key first.
    pub fn lookup(&self, image: &str) -> Vec<Arc<Credential>> {
        let mut found = Vec::new();
        if let Some(target) = SchemelessUrl::parse(image) {
            for entry in self.keys.values().rev() {
                if entry.parsed.as_ref().is_some_and(|key| key.matches(&target)) {
                    found.extend(entry.credentials.iter().cloned());
                }
            }
        }
        if found.is_empty()
            && is_default_registry(image)
            && let Some(docker_hub) = self.keys.get(DEFAULT_REGISTRY_KEY)
        {
            found.extend(docker_hub.credentials.iter().cloned());
        }
        found
    }

    /// How many keys hold credentials.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// The key a docker config location is stored under: host and port, and the path without a
/// leading `/v1/` or `/v2/` (both mean the registry itself, as in docker's own lookup).
pub fn normalise_key(location: &str) -> Option<String> {
    let parsed = if location.starts_with("https://") || location.starts_with("http://") {
        SchemelessUrl::parse_with_scheme(location)?
    } else {
        SchemelessUrl::parse(location)?
    };
    let path = parsed.path();
    let path = if path.starts_with("/v2/") || path.starts_with("/v1/") { &path[3..] } else { path };
    Some(if path.is_empty() || path == "/" { parsed.host().to_owned() } else { format!("{}{path}", parsed.host()) })
}

/// The one host a docker config key can match, when it names one (a key without a glob matches
/// only images on the same host name and port), as `hash` of its name and port. `None` for a
/// glob, a key that is not a URL and Docker Hub's fallback key: any image may need those.
pub fn literal_host(location: &str, hash: impl Fn((&str, &str)) -> u64) -> Option<u64> {
    let key = normalise_key(location)?;
    if key == DEFAULT_REGISTRY_KEY {
        return None;
    }
    SchemelessUrl::parse(&key)?.literal_name_and_port().map(hash)
}

/// `hash` of the host name and port of `image`, as a lookup of it matches keys against them.
pub fn image_host(image: &str, hash: impl Fn((&str, &str)) -> u64) -> Option<u64> {
    SchemelessUrl::parse(image).map(|parsed| hash(parsed.literal_name_and_port().unwrap_or_default()))
}

/// Whether `image` is pulled from Docker Hub, judging by its name as docker does: a single
/// component, `docker.io/…` or `index.docker.io/…`, or a first component without `.` or `:`.
pub fn is_default_registry(image: &str) -> bool {
    let (first, rest) = match image.split_once('/') {
        Some((first, rest)) => (first, Some(rest)),
        None => (image, None),
    };
    if first.is_empty() {
        return false;
    }
    rest.is_none() || first == "docker.io" || first == "index.docker.io" || !first.contains(['.', ':'])
}

/// Whether the key `glob` (which may hold wildcards in its host) matches `target`; both are
/// schemeless. Either failing to parse is no match.
pub fn urls_match(glob: &str, target: &str) -> bool {
    match (SchemelessUrl::parse(glob), SchemelessUrl::parse(target)) {
        (Some(glob), Some(target)) => glob.matches(&target),
        _ => false,
    }
}

#[cfg(test)]
mod tests;
