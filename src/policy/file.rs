//! containers-policy.json(5), read strictly: a field the format does not have is an error, as in
//! containers/image, and so is what cri-imaged cannot honour (a GPG `signedBy`), naming the
//! requirement and the scope, so that an operator never runs a policy that says more than is done.

use std::{collections::BTreeMap, sync::Arc};

use serde::Deserialize;

use super::{
    scope::{self, ScopeError, shown},
    sigstore::{KeyLoadError, KeyReader, PublicKey, load_keys},
};
use crate::messages;

/// Why a policy file was refused.
#[derive(Debug, thiserror::Error)]
pub enum PolicyFileError {
    /// serde's words, escaped and bounded: they may quote an unknown field of any size.
    #[error("not a containers-policy.json document: {0}")]
    Parse(String),
    #[error("{where_}: a list of requirements must not be empty")]
    NoRequirements { where_: String },
    #[error(
        "{where_}: signedBy (GPG signatures) is not supported by cri-imaged; use sigstoreSigned, or verify GPG signatures elsewhere"
    )]
    SignedBy { where_: String },
    #[error(
        "{where_}: sigstoreSigned needs exactly one of keyPath, keyPaths, keyData, keyDatas and fulcio (found {found})"
    )]
    KeySources { where_: String, found: usize },
    #[error("{where_}: fulcio needs caPath or caData (one), oidcIssuer and subjectEmail")]
    Fulcio { where_: String },
    #[error(
        "{where_}: fulcio signatures need rekorPublicKeyPath, rekorPublicKeyPaths, rekorPublicKeyData or rekorPublicKeyDatas"
    )]
    FulcioWithoutRekor { where_: String },
    #[error("{where_}: {what} must not be empty")]
    Empty { where_: String, what: &'static str },
    /// A key that cannot be read, is no public key, or is of an algorithm not verified.
    #[error("{where_}: {source}")]
    Key { where_: String, source: KeyLoadError },
    #[error(transparent)]
    Scope(#[from] ScopeError),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    default: Vec<RawRequirement>,
    #[serde(default)]
    transports: BTreeMap<String, BTreeMap<String, Vec<RawRequirement>>>,
}

/// A requirement by its `type`; each variant's own fields refuse the unknown (a `signedBy`'s are
/// not read: it is refused whatever they say).
#[derive(Debug, Deserialize)]
#[serde(tag = "type")]
enum RawRequirement {
    #[serde(rename = "insecureAcceptAnything")]
    InsecureAcceptAnything(NoFields),
    #[serde(rename = "reject")]
    Reject(NoFields),
    #[serde(rename = "signedBy")]
    SignedBy(serde::de::IgnoredAny),
    #[serde(rename = "sigstoreSigned")]
    SigstoreSigned(Box<SigstoreSigned>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NoFields {}

/// A `sigstoreSigned` requirement, as the man page defines it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SigstoreSigned {
    pub key_path: Option<String>,
    pub key_paths: Option<Vec<String>>,
    pub key_data: Option<String>,
    pub key_datas: Option<Vec<String>>,
    pub fulcio: Option<Fulcio>,
    pub rekor_public_key_path: Option<String>,
    pub rekor_public_key_paths: Option<Vec<String>>,
    pub rekor_public_key_data: Option<String>,
    pub rekor_public_key_datas: Option<Vec<String>>,
    pub signed_identity: Option<SignedIdentity>,
    /// The keys of `keyPath`, `keyPaths`, `keyData` and `keyDatas`, loaded with the file.
    #[serde(skip)]
    pub keys: Vec<PublicKey>,
    /// Rekor's keys (`rekorPublicKey…`), loaded with the file.
    #[serde(skip)]
    pub rekor_keys: Vec<PublicKey>,
    /// Fulcio's CA certificates (`fulcio.caPath` or `caData`), loaded with the file.
    #[serde(skip)]
    pub fulcio_roots: Vec<rustls::pki_types::CertificateDer<'static>>,
}

/// Fulcio's CA and the identity a certificate must carry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Fulcio {
    pub ca_path: Option<String>,
    pub ca_data: Option<String>,
    pub oidc_issuer: Option<String>,
    pub subject_email: Option<String>,
}

/// Which identity a signature must claim for the image.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "type", deny_unknown_fields)]
pub enum SignedIdentity {
    #[serde(rename = "matchExact")]
    MatchExact {},
    #[serde(rename = "matchRepoDigestOrExact")]
    MatchRepoDigestOrExact {},
    #[serde(rename = "matchRepository")]
    MatchRepository {},
    #[serde(rename = "exactReference", rename_all = "camelCase")]
    ExactReference { docker_reference: String },
    #[serde(rename = "exactRepository", rename_all = "camelCase")]
    ExactRepository { docker_repository: String },
    #[serde(rename = "remapIdentity", rename_all = "camelCase")]
    RemapIdentity { prefix: String, signed_prefix: String },
}

/// One requirement an image must meet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    InsecureAcceptAnything,
    Reject,
    /// Shared: each decision that needs it hands it on without copying its keys.
    SigstoreSigned(Arc<SigstoreSigned>),
}

impl Requirement {
    /// Its `type`, as the file names it.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::InsecureAcceptAnything => "insecureAcceptAnything",
            Self::Reject => "reject",
            Self::SigstoreSigned(_) => "sigstoreSigned",
        }
    }
}

/// A policy file as read: the default requirements and the `docker` transport's scopes. Other
/// transports (`docker-daemon`, `oci`, …) are read and left aside: images reach a node from
/// registries only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyFile {
    pub default: Vec<Requirement>,
    /// The `docker` transport's scopes; `""` is its own default.
    pub docker: BTreeMap<String, Vec<Requirement>>,
}

/// Reads a containers-policy.json document that names no key file (its keys, if any, are
/// `keyData`): a `keyPath` is refused as unreadable. The config reads with [`parse_with_keys`].
pub fn parse(text: &[u8]) -> Result<PolicyFile, PolicyFileError> {
    parse_with_keys(text, &|_| Err("key files are not read here".to_owned()))
}

/// Reads a containers-policy.json document; the key files it names are read with `read_key`.
pub fn parse_with_keys(text: &[u8], read_key: &KeyReader<'_>) -> Result<PolicyFile, PolicyFileError> {
    let raw: RawPolicy = serde_json::from_slice(text).map_err(|error| {
        PolicyFileError::Parse(messages::echo(&error.to_string().escape_debug().to_string()).into_owned())
    })?;
    let default = requirements(raw.default, "default", read_key)?;
    let mut docker = BTreeMap::new();
    for (transport, scopes) in raw.transports {
        for (scope, listed) in scopes {
            // Bounded: a file of 1 MiB may name a scope of 1 MiB.
            let where_ = format!("transports.{}.{}", shown(&transport), shown(&scope));
            let listed = requirements(listed, &where_, read_key)?;
            if transport == "docker" {
                scope::validate(&scope)?;
                docker.insert(scope, listed);
            }
        }
    }
    Ok(PolicyFile { default, docker })
}

fn requirements(
    raw: Vec<RawRequirement>,
    where_: &str,
    read_key: &KeyReader<'_>,
) -> Result<Vec<Requirement>, PolicyFileError> {
    if raw.is_empty() {
        return Err(PolicyFileError::NoRequirements { where_: where_.to_owned() });
    }
    raw.into_iter()
        .map(|requirement| match requirement {
            RawRequirement::InsecureAcceptAnything(NoFields {}) => Ok(Requirement::InsecureAcceptAnything),
            RawRequirement::Reject(NoFields {}) => Ok(Requirement::Reject),
            RawRequirement::SignedBy(serde::de::IgnoredAny) => {
                Err(PolicyFileError::SignedBy { where_: where_.to_owned() })
            }
            RawRequirement::SigstoreSigned(mut signed) => {
                check_sigstore(&signed, where_)?;
                load_keys(&mut signed, read_key)
                    .map_err(|source| PolicyFileError::Key { where_: where_.to_owned(), source })?;
                Ok(Requirement::SigstoreSigned(Arc::from(signed)))
            }
        })
        .collect()
}

fn check_sigstore(signed: &SigstoreSigned, where_: &str) -> Result<(), PolicyFileError> {
    let where_ = || where_.to_owned();
    let lists = [
        ("keyPaths", &signed.key_paths),
        ("keyDatas", &signed.key_datas),
        ("rekorPublicKeyPaths", &signed.rekor_public_key_paths),
        ("rekorPublicKeyDatas", &signed.rekor_public_key_datas),
    ];
    if let Some((what, _)) = lists.iter().find(|(_, list)| list.as_ref().is_some_and(Vec::is_empty)) {
        return Err(PolicyFileError::Empty { where_: where_(), what });
    }
    let sources = [
        signed.key_path.is_some(),
        signed.key_paths.is_some(),
        signed.key_data.is_some(),
        signed.key_datas.is_some(),
        signed.fulcio.is_some(),
    ];
    let found = sources.iter().filter(|given| **given).count();
    if found != 1 {
        return Err(PolicyFileError::KeySources { where_: where_(), found });
    }
    if let Some(fulcio) = &signed.fulcio {
        let ca = usize::from(fulcio.ca_path.is_some()) + usize::from(fulcio.ca_data.is_some());
        if ca != 1 || fulcio.oidc_issuer.is_none() || fulcio.subject_email.is_none() {
            return Err(PolicyFileError::Fulcio { where_: where_() });
        }
        let rekor = [
            signed.rekor_public_key_path.is_some(),
            signed.rekor_public_key_paths.is_some(),
            signed.rekor_public_key_data.is_some(),
            signed.rekor_public_key_datas.is_some(),
        ];
        if !rekor.contains(&true) {
            return Err(PolicyFileError::FulcioWithoutRekor { where_: where_() });
        }
    }
    Ok(())
}
