//! Verified digests kept across restarts: one file under `--root-dir` in `signatures/`, written as
//! the pull records are (temporary file, fsync, rename, directory fsync; mode 0600) by one writer
//! off the request path, a second after a verification is added (a burst is one write), and read
//! back once at start, off the request path, as hostile input: a regular file of at most
//! [`FILE_LIMIT`] bytes, parsed strictly (an unknown field, a malformed digest, a duplicate or an
//! entry too many refuses the whole file), and checked against the SHA-256 written with its
//! entries, so that a torn or edited file is read as nothing verified. One that is not whole is
//! set aside (quarantined, counted, logged once) and the daemon verifies again as if it had none.
//!
//! The SHA-256 has no key: it detects corruption, not forgery. Whoever can write the file can
//! write entries with a sum that matches (an unsigned image's digest in a signed one's entry), and
//! the daemon reads them as verified and writes them back. So only root, the daemon's user, can:
//! the directory and the file are refused or set aside if anyone else could write them
//! ([`crate::files::private`]). An HMAC key would add nothing: kept in the same root dir, it is
//! readable by exactly whoever can write the file.
//!
//! An entry names the requirements it met by [`super::requirement`]'s name, never holds a key's
//! bytes or a credential: the digest, the policy and scope that asked, and each key's fingerprint
//! (or certificate's identity) and signature digest that verified it.

use std::{
    collections::HashSet,
    io,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use prometheus_client::metrics::counter::Counter;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{
    Signatures, Under, Verified,
    cache::{KEPT, Stored},
};
use crate::{files::StateDir, messages, policy::PolicySource, shutdown::Shutdown};

/// The largest entry written: a digest, a scope, a namespace and a few keys take a few hundred
/// bytes; one larger (a scope of a kilobyte, dozens of requirements) is kept in memory only.
pub const ENTRY_LIMIT: usize = 2 << 10;

/// The largest file read: [`KEPT`] entries at their limit, and the envelope.
pub const FILE_LIMIT: u64 = (KEPT * (ENTRY_LIMIT + 1) + 1024) as u64;

/// The longest scope read back (a `transports.docker` key: a repository, a tag or a digest).
const SCOPE_LIMIT: usize = 1024;

/// The longest certificate identity read back (an e-mail and an issuer URL, escaped).
const SIGNER_LIMIT: usize = 1024;

/// The most requirements (each a key and a signature) an entry names.
const BY_LIMIT: usize = 64;

/// The one key the file is kept under.
const KEY: &str = "verified";
const KIND: &str = "VerifiedSignatures";
const VERSION: u32 = 1;

/// How long an added verification waits before it is written: a burst of them is one write.
const WRITE_AFTER: Duration = Duration::from_secs(1);

/// Why the verifications kept could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoredError {
    #[error("verified signatures in {path}: {error}")]
    Io { path: PathBuf, error: io::Error },
}

/// Why a file is not whole as this daemon writes one. Names no value from the file but serde's
/// words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("does not decode: {0}")]
    Decode(String),
    #[error("is not a {KIND} file of version {VERSION}")]
    Kind,
    #[error("its entries do not match the SHA-256 written with them")]
    Checksum,
    #[error("holds {0} entries, more than {KEPT}")]
    TooMany(usize),
    #[error("entry {index}: {why}")]
    Entry { index: usize, why: &'static str },
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct File {
    kind: String,
    version: u32,
    entries: Vec<Entry>,
    /// Hex SHA-256 of `entries` as written (serde_json's encoding of the list).
    sha256: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Entry {
    digest: String,
    /// [`super::requirement::requirement_id`] of the requirements met.
    requirement: String,
    policy: Policy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scope: Option<String>,
    by: Vec<By>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum Policy {
    None,
    Default,
    Namespace,
}

/// A requirement met: the key's fingerprint and the signature layer's digest.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct By {
    key: String,
    signature: String,
}

/// The file's contents for `stored` (oldest first): the newest [`KEPT`] entries of at most
/// [`ENTRY_LIMIT`] bytes each.
pub fn encode(stored: &[Stored]) -> Vec<u8> {
    let entries: Vec<Entry> = stored
        .iter()
        .rev()
        .map(Entry::from)
        .filter(|entry| serde_json::to_vec(entry).is_ok_and(|bytes| bytes.len() <= ENTRY_LIMIT))
        .take(KEPT)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let sha256 = checksum(&entries);
    let mut bytes =
        serde_json::to_vec(&File { kind: KIND.into(), version: VERSION, entries, sha256 }).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// The entries of a file whole as this daemon writes one, oldest first; anything else is an
/// error (a forged one with a matching SHA-256 is not: see the module docs).
pub fn decode(bytes: &[u8]) -> Result<Vec<Stored>, FormatError> {
    let file: File = serde_json::from_slice(bytes)
        .map_err(|error| FormatError::Decode(messages::echo(&error.to_string().escape_debug().to_string()).into()))?;
    if file.kind != KIND || file.version != VERSION {
        return Err(FormatError::Kind);
    }
    if file.entries.len() > KEPT {
        return Err(FormatError::TooMany(file.entries.len()));
    }
    if checksum(&file.entries) != file.sha256 {
        return Err(FormatError::Checksum);
    }
    let mut seen = HashSet::new();
    let mut stored = Vec::with_capacity(file.entries.len());
    for (index, entry) in file.entries.into_iter().enumerate() {
        let entry = entry.validated().map_err(|why| FormatError::Entry { index, why })?;
        if !seen.insert((entry.digest.clone(), entry.requirement.clone())) {
            return Err(FormatError::Entry { index, why: "a digest and requirement already listed" });
        }
        stored.push(entry.into());
    }
    Ok(stored)
}

fn checksum(entries: &[Entry]) -> String {
    format!("{:x}", Sha256::digest(serde_json::to_vec(entries).unwrap_or_default()))
}

impl Entry {
    /// The entry, when every field is one this daemon writes.
    fn validated(self) -> Result<Self, &'static str> {
        if !is_sha256_digest(&self.digest) {
            return Err("digest is not sha256: and 64 lowercase hex digits");
        }
        if !is_hex(&self.requirement, 64) {
            return Err("requirement is not 64 lowercase hex digits");
        }
        match (self.policy, &self.namespace) {
            (Policy::Namespace, Some(namespace)) if is_dns_label(namespace) => {}
            (Policy::Namespace, _) => return Err("a namespace's policy without a namespace's name (a DNS label)"),
            (_, Some(_)) => return Err("a namespace named for a policy that is not a namespace's"),
            (_, None) => {}
        }
        if self.scope.as_ref().is_some_and(|scope| scope.len() > SCOPE_LIMIT || scope.chars().any(char::is_control)) {
            return Err("scope is longer than 1024 bytes or holds control characters");
        }
        if self.by.is_empty() || self.by.len() > BY_LIMIT {
            return Err("names no requirement met, or more than 64");
        }
        if !self.by.iter().all(|by| is_signer(&by.key)) {
            return Err("a signer is neither a key fingerprint (lowercase hex) nor a certificate's identity");
        }
        if !self.by.iter().all(|by| is_sha256_digest(&by.signature)) {
            return Err("a signature is not sha256: and 64 lowercase hex digits");
        }
        Ok(self)
    }
}

/// Who verified: a key's fingerprint, or a certificate's identity as verification words it
/// (`certificate for "…" (OIDC issuer "…")`, escaped, so without control characters).
fn is_signer(key: &str) -> bool {
    let fingerprint = (1..=64).contains(&key.len()) && is_hex(key, key.len());
    let certificate =
        key.starts_with("certificate for \"") && key.len() <= SIGNER_LIMIT && !key.chars().any(char::is_control);
    fingerprint || certificate
}

fn is_hex(text: &str, length: usize) -> bool {
    text.len() == length && text.bytes().all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte))
}

fn is_sha256_digest(text: &str) -> bool {
    text.strip_prefix("sha256:").is_some_and(|hex| is_hex(hex, 64))
}

/// A Kubernetes namespace's name: lower case letters, digits and '-', at most 63, '-' not at
/// either end.
fn is_dns_label(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.bytes().all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

impl From<&Stored> for Entry {
    fn from(Stored { requirement, under, verified }: &Stored) -> Self {
        let (policy, namespace) = match &under.policy {
            PolicySource::None => (Policy::None, None),
            PolicySource::Default => (Policy::Default, None),
            PolicySource::Namespace(namespace) => (Policy::Namespace, Some(namespace.clone())),
        };
        Self {
            digest: verified.digest.clone(),
            requirement: requirement.clone(),
            policy,
            namespace,
            scope: under.scope.clone(),
            by: verified
                .by
                .iter()
                .map(|(key, signature)| By { key: key.clone(), signature: signature.clone() })
                .collect(),
        }
    }
}

impl From<Entry> for Stored {
    fn from(Entry { digest, requirement, policy, namespace, scope, by }: Entry) -> Self {
        let policy = match (policy, namespace) {
            (Policy::Namespace, Some(namespace)) => PolicySource::Namespace(namespace),
            (Policy::None, _) => PolicySource::None,
            (Policy::Default | Policy::Namespace, _) => PolicySource::Default,
        };
        let by = by.into_iter().map(|By { key, signature }| (key, signature)).collect();
        Self { requirement, under: Under { policy, scope }, verified: Verified { digest, by } }
    }
}

/// Where the verifications are kept: `signatures/` under the root dir.
#[derive(Debug, Clone)]
pub struct VerifiedFile {
    root_dir: PathBuf,
    /// Counts a file set aside as unreadable.
    quarantined: Counter,
}

impl VerifiedFile {
    /// Kept under `root_dir`; nothing is touched until the writer starts.
    pub fn at(root_dir: &Path, quarantined: Counter) -> Self {
        Self { root_dir: root_dir.to_owned(), quarantined }
    }

    /// The file the verifications are kept in.
    pub fn path(&self) -> PathBuf {
        self.root_dir.join("signatures").join(StateDir::file_name(KEY))
    }

    /// Opens the directory (mode 0700, removing what a crash left half-written) and reads what it
    /// keeps: a file that is not whole as this daemon writes one, or that others could write, is
    /// set aside and read as none. Blocking.
    fn open(&self) -> Result<(StateDir, Vec<Stored>), StoredError> {
        let path = self.root_dir.join("signatures");
        let (dir, _) = StateDir::open(path.clone()).map_err(|error| StoredError::Io { path, error })?;
        let dir = dir.with_limit(FILE_LIMIT).counting_quarantined(self.quarantined.clone());
        let stored = match dir.read(KEY) {
            Ok(None) => Vec::new(),
            Ok(Some(bytes)) => decode(&bytes).unwrap_or_else(|error| {
                let why = format!("not verified signatures as cri-imaged writes them (it {error})");
                dir.set_aside(&self.path(), &why);
                Vec::new()
            }),
            Err(error) => return Err(StoredError::Io { path: self.path(), error }),
        };
        Ok((dir, stored))
    }
}

impl Signatures {
    /// Reads back what was kept on disk, then keeps what is verified there, until `shutdown` (what
    /// was added before it is written then). Without a file, or when its directory cannot be
    /// opened or read, verifications are kept in memory only (said once).
    pub async fn keep(self: Arc<Self>, shutdown: Shutdown) {
        let Some(file) = self.file.clone() else { return };
        let shown = file.path();
        let dir = match tokio::task::spawn_blocking(move || file.open()).await {
            Ok(Ok((dir, stored))) => {
                tracing::info!(path = %shown.display(), verified = stored.len(), "signature verifications read back");
                self.cache.restore(stored);
                dir
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "signature verifications are kept in memory only");
                return;
            }
            Err(_) => return,
        };
        let mut failing = false;
        loop {
            tokio::select! {
                biased;
                () = self.cache.changed() => {}
                () = shutdown.clone().requested() => return,
            }
            let stopping = tokio::select! {
                () = tokio::time::sleep(WRITE_AFTER) => false,
                () = shutdown.clone().requested() => true,
            };
            let (stored, dir) = (self.cache.stored(), dir.clone());
            let count = stored.len();
            match tokio::task::spawn_blocking(move || dir.write(KEY, &encode(&stored))).await {
                Ok(Ok(_)) => {
                    tracing::debug!(path = %shown.display(), verified = count, "signature verifications written");
                    failing = false;
                }
                Ok(Err(error)) if !failing => {
                    tracing::warn!(path = %shown.display(), %error, "signature verifications cannot be written; kept in memory");
                    failing = true;
                }
                Ok(Err(_)) | Err(_) => {}
            }
            if stopping {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests;
