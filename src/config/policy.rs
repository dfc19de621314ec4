//! The image policy's files (and containerd's registry host settings its signatures are read
//! with), read at start and on reload as hostile input: regular files (links
//! followed: a ConfigMap mounts links), each bounded, a bounded number of them, and so are the key
//! files they name; a file that does not read or parse, a key that does not load, or a namespace
//! file's name that is no namespace, refuses the whole policy. What was read is digested, so that
//! GetStatus can say which bytes are in force.

use std::{
    cell::RefCell,
    path::{Path, PathBuf},
    time::SystemTime,
};

use sha2::{Digest as _, Sha256};

use super::ServeArgs;
use crate::{
    files::read::read_named,
    policy::{InForce, Loaded, Policies, PolicyFile, PolicyFileError, sigstore::KEY_FILE_LIMIT},
    registry::HostsConfig,
};

/// The largest policy file read: containers-policy.json files are a few KiB.
pub const POLICY_FILE_BYTES: u64 = 1024 * 1024;

/// The most namespace files read from --signature-policy-dir.
pub const NAMESPACE_FILES: usize = 10_000;

/// Why the image policy was refused.
#[derive(Debug, thiserror::Error)]
pub enum PolicyLoadError {
    /// `setting`: the flag (`--signature-policy`), or where the config file sets it
    /// (`config.yaml:3: signature-policy`); boxed, as small as the `&str` it was.
    #[error("{setting} {}: {source}", path.display())]
    Read { setting: Box<str>, path: PathBuf, source: std::io::Error },
    #[error("{setting} {}: {source}", path.display())]
    Parse { setting: Box<str>, path: PathBuf, source: PolicyFileError },
    #[error(
        "{setting} {}: {name:?} is no namespace's file: a namespace's is <namespace>.json, the namespace a DNS label (lower case, digits and '-', at most 63)",
        dir.display()
    )]
    NotANamespace { setting: Box<str>, dir: PathBuf, name: String },
    #[error("{setting} {}: more than {NAMESPACE_FILES} namespace files", dir.display())]
    TooMany { setting: Box<str>, dir: PathBuf },
}

impl ServeArgs {
    /// The image policy the flags name, its files read now.
    pub fn image_policy(&self) -> Result<InForce, PolicyLoadError> {
        let digest = FilesDigest::default();
        let default = match &self.signature_policy {
            Some(path) => Some(read_policy(&self.origins.setting("signature-policy"), path, "policy.json", &digest)?),
            None => None,
        };
        let namespaces = match &self.signature_policy_dir {
            Some(dir) => namespace_files(&self.origins.setting("signature-policy-dir"), dir, &digest)?,
            None => Default::default(),
        };
        let loaded = Loaded {
            file: self.signature_policy.clone(),
            dir: self.signature_policy_dir.clone(),
            namespace_files: namespaces.len(),
            digest: digest.finish(),
            at: SystemTime::now(),
        };
        let policies = Policies { default, namespaces };
        let audit_namespaces = self.signature_policy_audit_namespace.iter().cloned().collect();
        Ok(InForce { policies, mode: self.signature_policy_mode.into(), audit_namespaces, loaded: Some(loaded) })
    }

    /// containerd's registry host settings the flag names, read now (what does not read is
    /// logged: it stops neither containerd nor us).
    pub fn registry_hosts(&self) -> HostsConfig {
        HostsConfig::load_either(&self.registry_config_path, &self.registries_conf)
    }
}

/// Every file of the policy as read, each framed by its name (`policy.json`, `<namespace>.json`,
/// a key file as the policy names it) and length: nodes whose files hold the same bytes under the
/// same names have the same digest, wherever the files are.
#[derive(Default)]
struct FilesDigest(RefCell<Sha256>);

impl FilesDigest {
    fn add(&self, name: &str, bytes: &[u8]) {
        let mut hasher = self.0.borrow_mut();
        hasher.update(name.as_bytes());
        hasher.update([0]);
        hasher.update(bytes.len().to_string().as_bytes());
        hasher.update([0]);
        hasher.update(bytes);
    }

    fn finish(self) -> String {
        format!("sha256:{}", crate::credentials::hash::hex(&self.0.into_inner().finalize()))
    }
}

fn read_policy(setting: &str, path: &Path, name: &str, digest: &FilesDigest) -> Result<PolicyFile, PolicyLoadError> {
    let text = read_named(path, POLICY_FILE_BYTES).map_err(|source| PolicyLoadError::Read {
        setting: setting.into(),
        path: path.into(),
        source,
    })?;
    digest.add(name, &text);
    let read_key = |key: &Path| {
        let bytes = read_key(key)?;
        digest.add(&key.to_string_lossy(), &bytes);
        Ok(bytes)
    };
    crate::policy::parse_with_keys(&text, &read_key).map_err(|source| PolicyLoadError::Parse {
        setting: setting.into(),
        path: path.into(),
        source,
    })
}

/// A public key file a policy names: a regular file (a link to one followed) of at most
/// [`KEY_FILE_LIMIT`] bytes.
fn read_key(path: &Path) -> Result<Vec<u8>, String> {
    read_named(path, KEY_FILE_LIMIT).map_err(|error| error.to_string())
}

/// Each `<namespace>.json` of `dir`; other names are left alone.
fn namespace_files(
    setting: &str,
    dir: &Path,
    digest: &FilesDigest,
) -> Result<std::collections::BTreeMap<String, PolicyFile>, PolicyLoadError> {
    let read_error = |source: std::io::Error| {
        // std's words for a missing directory carry an OS error number; these say it plainly.
        let source = match source.kind() {
            std::io::ErrorKind::NotFound => std::io::Error::new(source.kind(), "the directory does not exist"),
            _ => source,
        };
        PolicyLoadError::Read { setting: setting.into(), path: dir.into(), source }
    };
    let mut named = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read_error)? {
        let entry = entry.map_err(read_error)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(namespace) = name.strip_suffix(".json") else { continue };
        if !is_namespace(namespace) {
            return Err(PolicyLoadError::NotANamespace { setting: setting.into(), dir: dir.into(), name });
        }
        if named.len() == NAMESPACE_FILES {
            return Err(PolicyLoadError::TooMany { setting: setting.into(), dir: dir.into() });
        }
        named.push((namespace.to_owned(), entry.path()));
    }
    // In name order, whatever order the directory lists them in: the digest depends on it.
    named.sort();
    let mut files = std::collections::BTreeMap::new();
    for (namespace, path) in named {
        let policy = read_policy(setting, &path, &format!("{namespace}.json"), digest)?;
        files.insert(namespace, policy);
    }
    Ok(files)
}

/// A Kubernetes namespace's name: a DNS label.
fn is_namespace(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.bytes().all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A policy naming `key`, the key file written as `contents` (none: no file).
    fn loaded(contents: Option<&[u8]>) -> Result<PolicyFile, String> {
        let dir = tempfile::tempdir().expect("tempdir");
        let key = dir.path().join("cosign.pub");
        if let Some(contents) = contents {
            std::fs::write(&key, contents).expect("written");
        }
        let policy = dir.path().join("policy.json");
        let json = format!(r#"{{"default": [{{"type": "sigstoreSigned", "keyPath": {:?}}}]}}"#, key.display());
        std::fs::write(&policy, json).expect("written");
        read_policy("signature-policy", &policy, "policy.json", &FilesDigest::default())
            .map_err(|error| error.to_string())
    }

    /// The digest of a policy written in a new directory as `files` (`policy.json`, and
    /// `ns/<namespace>.json` in the namespace dir).
    fn digest_of(files: &[(&str, &str)]) -> (String, usize) {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("ns")).expect("dir");
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).expect("written");
        }
        let digest = FilesDigest::default();
        let namespaces = namespace_files("--signature-policy-dir", &dir.path().join("ns"), &digest).expect("read");
        read_policy("signature-policy", &dir.path().join("policy.json"), "policy.json", &digest).expect("read");
        (digest.finish(), namespaces.len())
    }

    #[test]
    fn the_policy_digest_is_of_the_bytes_in_force_wherever_they_are() {
        let open = r#"{"default": [{"type": "insecureAcceptAnything"}]}"#;
        let closed = r#"{"default": [{"type": "reject"}]}"#;
        let (one, files) = digest_of(&[("policy.json", open), ("ns/team.json", closed)]);
        assert_eq!(files, 1);
        assert!(one.starts_with("sha256:") && one.len() == 71, "{one}");
        assert_eq!(digest_of(&[("policy.json", open), ("ns/team.json", closed)]).0, one, "another directory, the same");
        assert_ne!(digest_of(&[("policy.json", open), ("ns/team.json", open)]).0, one, "another namespace file");
        assert_ne!(digest_of(&[("policy.json", open), ("ns/other.json", closed)]).0, one, "another namespace");
        assert_ne!(digest_of(&[("policy.json", closed), ("ns/team.json", closed)]).0, one, "another policy");
    }

    #[test]
    fn a_policys_key_files_are_read_bounded_and_a_bad_one_refuses_it() {
        let key = include_bytes!("../policy/sigstore/testdata/p256.pub");
        assert!(loaded(Some(key)).is_ok());
        let error = loaded(None).expect_err("refused");
        assert!(
            error.contains("default: keyPath") && error.contains("cannot be read: the file does not exist"),
            "{error}"
        );
        let mut huge = key.to_vec();
        huge.resize(KEY_FILE_LIMIT as usize + 1, b'\n');
        let error = loaded(Some(&huge)).expect_err("refused");
        assert!(error.contains("cannot be read: larger than 65536 bytes"), "{error}");
    }
}
