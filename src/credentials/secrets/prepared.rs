//! Pull secrets read once. A pod sends its secrets with every request, and a node's pods share a
//! few: each secret is read the first time it is seen and kept, with its content, by its
//! coordinates and type. Later, the same secret costs a comparison of its bytes, and its entries
//! are found by the image's host in an index, rather than thousands of keys parsed and matched.
//! A secret whose content changed (a rotated password) is read again.

use std::{
    collections::HashMap,
    hash::{BuildHasher, RandomState},
    sync::{Arc, Mutex, PoisonError},
};

use secrecy::{ExposeSecret, SecretString};

use super::{PullSecret, SecretError};
use crate::credentials::{
    Credential, CredentialSource, SecretCoordinates,
    dockercfg::{self, DockerConfigError, Shape},
    keyring::{self, Keyring},
};

/// The most secrets kept; past it, they start over. A node's pods name far fewer.
pub const SECRETS: usize = 4096;
/// The most bytes of secret content kept; past it, they start over.
pub const SECRET_BYTES: usize = 64 << 20;

/// The secrets read so far.
#[derive(Default)]
pub struct PreparedSecrets {
    kept: Mutex<Kept>,
    /// Hashes a secret's coordinates and type; random, so callers cannot aim at one slot.
    hasher: RandomState,
}

#[derive(Default)]
struct Kept {
    by_secret: HashMap<u64, Arc<Prepared>>,
    bytes: usize,
}

/// One secret as read.
struct Prepared {
    coordinates: SecretCoordinates,
    kind: String,
    /// The content it was read from.
    content: SecretString,
    read: Result<Entries, DockerConfigError>,
}

/// A secret's entries, indexed by the one host each can match.
struct Entries {
    /// Every entry, in the order read: its key as written and its credential.
    all: Vec<(String, Arc<Credential>)>,
    /// Entries whose key names one host: a hash of that host's name and port and the entry, in
    /// that order (two hosts of one hash only make more candidates: the keyring matches each).
    by_host: Vec<(u64, usize)>,
    /// The rest: keys with a glob, keys that are not URLs (the keyring warns of them), Docker
    /// Hub's fallback.
    others: Vec<usize>,
}

impl Entries {
    fn index(entries: Vec<dockercfg::Entry>, coordinates: &SecretCoordinates, hasher: &RandomState) -> Self {
        let source = CredentialSource::Secret(Arc::new(coordinates.clone()));
        let mut indexed = Self { all: Vec::with_capacity(entries.len()), by_host: Vec::new(), others: Vec::new() };
        for entry in entries {
            let at = indexed.all.len();
            match keyring::literal_host(&entry.key, |host| hasher.hash_one(host)) {
                Some(host) => indexed.by_host.push((host, at)),
                None => indexed.others.push(at),
            }
            let credential = Credential { auth: Arc::new(entry.auth), source: source.clone() };
            indexed.all.push((entry.key, Arc::new(credential)));
        }
        indexed.by_host.sort_unstable();
        indexed
    }

    /// The entries that may match an image on `host`, in the order read.
    fn candidates(&self, host: Option<u64>) -> impl Iterator<Item = &(String, Arc<Credential>)> {
        let same_host = host.map_or(&[][..], |host| {
            let start = self.by_host.partition_point(|&(hash, _)| hash < host);
            let end = start + self.by_host[start..].partition_point(|&(hash, _)| hash == host);
            &self.by_host[start..end]
        });
        let same_host = same_host.iter().map(|(_, at)| at);
        let (mut same_host, mut others) = (same_host.peekable(), self.others.iter().peekable());
        // Both lists are in the order read: merged, so is the result.
        std::iter::from_fn(move || match (same_host.peek(), others.peek()) {
            (Some(a), Some(b)) if a < b => same_host.next(),
            (Some(_), None) => same_host.next(),
            _ => others.next(),
        })
        .map(|&at| &self.all[at])
    }
}

impl PreparedSecrets {
    /// The pod's keyring for `image`, as [`super::keyring_for`] defines it, each secret read
    /// only if it was not read before with the same content.
    pub fn keyring_for(&self, image: &str, secrets: &[PullSecret]) -> Result<Keyring, SecretError> {
        let mut keyring = Keyring::for_image(image);
        let host = keyring::image_host(image, |host| self.hasher.hash_one(host));
        for secret in secrets {
            let Some((shape, data_key)) = super::shape_of(secret) else { continue };
            if secret.content.expose_secret().is_empty() {
                continue;
            }
            let prepared = self.prepared(secret, shape);
            let entries = prepared.read.as_ref().map_err(|error| SecretError {
                namespace: secret.coordinates.namespace.clone(),
                name: secret.coordinates.name.clone(),
                data_key,
                error: error.clone(),
            })?;
            for (key, credential) in entries.candidates(host) {
                keyring.add(key, credential.clone());
            }
        }
        Ok(keyring)
    }

    /// `secret` as read before, or read now and kept.
    fn prepared(&self, secret: &PullSecret, shape: Shape) -> Arc<Prepared> {
        let coordinates = &secret.coordinates;
        let slot = self.hasher.hash_one((&coordinates.uid, &coordinates.namespace, &coordinates.name, &secret.kind));
        let content = secret.content.expose_secret();
        let kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner).by_secret.get(&slot).cloned();
        if let Some(prepared) = kept
            && prepared.coordinates == *coordinates
            && prepared.kind == secret.kind
            && prepared.content.expose_secret() == content
        {
            return prepared;
        }
        let read = dockercfg::parse(content.as_bytes(), shape)
            .map(|entries| Entries::index(entries, coordinates, &self.hasher));
        let prepared = Arc::new(Prepared {
            coordinates: coordinates.clone(),
            kind: secret.kind.clone(),
            content: secret.content.clone(),
            read,
        });
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.by_secret.len() >= SECRETS || kept.bytes + content.len() > SECRET_BYTES {
            kept.by_secret.clear();
            kept.bytes = 0;
        }
        if let Some(replaced) = kept.by_secret.insert(slot, prepared.clone()) {
            kept.bytes -= replaced.content.expose_secret().len();
        }
        kept.bytes += content.len();
        prepared
    }

    /// How many secrets are kept.
    pub fn len(&self) -> usize {
        self.kept.lock().unwrap_or_else(PoisonError::into_inner).by_secret.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
