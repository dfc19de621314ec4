//! The image policy's files, read at start and on reload as hostile input: regular files (links
//! followed: a ConfigMap mounts links), each bounded, a bounded number of them, and so are the key
//! files they name; a file that does not read or parse, a key that does not load, or a namespace
//! file's name that is no namespace, refuses the whole policy.

use std::path::{Path, PathBuf};

use super::ServeArgs;
use crate::{
    files::read::read_named,
    policy::{InForce, Policies, PolicyFile, PolicyFileError, sigstore::KEY_FILE_LIMIT},
};

/// The largest policy file read: containers-policy.json files are a few KiB.
pub const POLICY_FILE_BYTES: u64 = 1024 * 1024;

/// The most namespace files read from --signature-policy-dir.
pub const NAMESPACE_FILES: usize = 10_000;

/// Why the image policy was refused.
#[derive(Debug, thiserror::Error)]
pub enum PolicyLoadError {
    #[error("--{flag} {}: {source}", path.display())]
    Read { flag: &'static str, path: PathBuf, source: std::io::Error },
    #[error("--{flag} {}: {source}", path.display())]
    Parse { flag: &'static str, path: PathBuf, source: PolicyFileError },
    #[error(
        "--signature-policy-dir {}: {name:?} is no namespace's file: a namespace's is <namespace>.json, the namespace a DNS label (lower case, digits and '-', at most 63)",
        dir.display()
    )]
    NotANamespace { dir: PathBuf, name: String },
    #[error("--signature-policy-dir {}: more than {NAMESPACE_FILES} namespace files", dir.display())]
    TooMany { dir: PathBuf },
}

impl ServeArgs {
    /// The image policy the flags name, its files read now.
    pub fn image_policy(&self) -> Result<InForce, PolicyLoadError> {
        let default = match &self.signature_policy {
            Some(path) => Some(read_policy("signature-policy", path)?),
            None => None,
        };
        let namespaces = match &self.signature_policy_dir {
            Some(dir) => namespace_files(dir)?,
            None => Default::default(),
        };
        Ok(InForce { policies: Policies { default, namespaces }, mode: self.signature_policy_mode.into() })
    }
}

fn read_policy(flag: &'static str, path: &Path) -> Result<PolicyFile, PolicyLoadError> {
    let text = read_named(path, POLICY_FILE_BYTES).map_err(|source| PolicyLoadError::Read {
        flag,
        path: path.into(),
        source,
    })?;
    crate::policy::parse_with_keys(&text, &read_key).map_err(|source| PolicyLoadError::Parse {
        flag,
        path: path.into(),
        source,
    })
}

/// A public key file a policy names: a regular file (a link to one followed) of at most
/// [`KEY_FILE_LIMIT`] bytes.
fn read_key(path: &Path) -> Result<Vec<u8>, String> {
    read_named(path, KEY_FILE_LIMIT).map_err(|error| match error.kind() {
        std::io::ErrorKind::NotFound => "no such file".to_owned(),
        _ => error.to_string(),
    })
}

/// Each `<namespace>.json` of `dir`; other names are left alone.
fn namespace_files(dir: &Path) -> Result<std::collections::BTreeMap<String, PolicyFile>, PolicyLoadError> {
    let flag = "signature-policy-dir";
    let read_error = |source| PolicyLoadError::Read { flag, path: dir.into(), source };
    let mut files = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(dir).map_err(read_error)? {
        let entry = entry.map_err(read_error)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(namespace) = name.strip_suffix(".json") else { continue };
        if !is_namespace(namespace) {
            return Err(PolicyLoadError::NotANamespace { dir: dir.into(), name });
        }
        if files.len() == NAMESPACE_FILES {
            return Err(PolicyLoadError::TooMany { dir: dir.into() });
        }
        files.insert(namespace.to_owned(), read_policy(flag, &entry.path())?);
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
        read_policy("signature-policy", &policy).map_err(|error| error.to_string())
    }

    #[test]
    fn a_policys_key_files_are_read_bounded_and_a_bad_one_refuses_it() {
        let key = include_bytes!("../policy/sigstore/testdata/p256.pub");
        assert!(loaded(Some(key)).is_ok());
        let error = loaded(None).expect_err("refused");
        assert!(error.contains("default: keyPath") && error.contains("cannot be read: no such file"), "{error}");
        let mut huge = key.to_vec();
        huge.resize(KEY_FILE_LIMIT as usize + 1, b'\n');
        let error = loaded(Some(&huge)).expect_err("refused");
        assert!(error.contains("cannot be read: larger than 65536 bytes"), "{error}");
    }
}
