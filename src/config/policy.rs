//! The image policy's files, read at start and on reload as hostile input: regular files (links
//! followed: a ConfigMap mounts links), each bounded, a bounded number of them; a file that does
//! not read or parse, or a namespace file's name that is no namespace, refuses the whole policy.

use std::path::{Path, PathBuf};

use super::ServeArgs;
use crate::{
    files::read::read_named,
    policy::{InForce, Policies, PolicyFile, PolicyFileError},
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
    crate::policy::parse(&text).map_err(|source| PolicyLoadError::Parse { flag, path: path.into(), source })
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
