//! What the decision on signatures says: a signature accepted and whose it is, or why the
//! requirement refuses the image, each signature's reason, in words for an event; and how signers
//! and digests are named in them. Apart from the decision so that a bundle's judgement
//! (`bundle`), which the decision calls, can say the same.

use std::fmt;

use super::{
    PayloadError, PublicKey,
    artifact::{PAYLOAD_LIMIT, is_sha256},
    certificate::CertificateError,
    envelope::BundleError,
    rekor::RekorError,
};
use crate::policy::{Fulcio, scope::shown};

/// The signatures' reasons a message shows.
const SHOWN: usize = 8;

/// The longest base64 signature read: an RSA-8192 signature is 1,368 characters.
pub(super) const SIGNATURE_BASE64_LIMIT: usize = 4096;

/// A signature that verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// The key's fingerprint ([`PublicKey::fingerprint`]), or for a certificate (`fulcio`),
    /// whom it names: `certificate for "dev@example.com" (OIDC issuer "https://…")`.
    pub key: String,
    /// The signature layer's digest (a bundle's blob's).
    pub layer: String,
    /// The identity it claims (`docker-reference`), escaped and bounded.
    pub identity: String,
}

/// Why the requirement refuses the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejected {
    /// What the requirement asks is not verified by cri-imaged yet: it refuses (fails closed).
    Unsupported(&'static str),
    /// The image names a digest, and the manifest verified has another.
    ImageDigest { named: String, manifest: String },
    /// The image has no signature.
    NoSignature,
    /// None of its signatures verified: each one's reason, in the artifact's order.
    NoneVerified(Vec<Refused>),
}

/// One signature that did not verify.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The layer's digest, shortened for a person (`sha256:0123456789ab…`).
    pub layer: String,
    pub why: Why,
}

/// Why one signature did not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Why {
    #[error("a payload of {0} bytes, more than {PAYLOAD_LIMIT}")]
    PayloadTooLarge(u64),
    #[error("the payload is {read} bytes, the manifest says {stated}")]
    PayloadSize { stated: u64, read: usize },
    #[error("the payload is not the layer's blob: its digest differs")]
    PayloadDigest,
    #[error("no dev.cosignproject.cosign/signature annotation")]
    NoSignature,
    #[error("the signature annotation is not base64 of at most {SIGNATURE_BASE64_LIMIT} characters")]
    SignatureEncoding,
    #[error("not signed by {0}")]
    NoKey(String),
    #[error("no certificate (dev.sigstore.cosign/certificate), which the policy's fulcio asks for")]
    NoCertificate,
    #[error("{0}")]
    Certificate(#[from] CertificateError),
    #[error("not signed by the key of its certificate")]
    NotByCertificate,
    #[error("{0}")]
    Rekor(#[from] RekorError),
    #[error("{0}")]
    Payload(#[from] PayloadError),
    #[error("{0}")]
    Bundle(#[from] BundleError),
    #[error("signed for another image ({0})")]
    OtherImage(String),
    #[error("{0}")]
    Identity(String),
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unsupported(what) => f.write_str(what),
            Self::ImageDigest { named, manifest } => {
                write!(f, "the image names {named}, but the manifest verified is {manifest}")
            }
            Self::NoSignature => f.write_str("a signature was required, but the image has none"),
            Self::NoneVerified(refused) => {
                f.write_str("no signature verified: ")?;
                // An event's message: the first few reasons, then how many more.
                for (at, refused) in refused.iter().take(SHOWN).enumerate() {
                    let separator = if at == 0 { "" } else { "; " };
                    write!(f, "{separator}{}: {}", refused.layer, refused.why)?;
                }
                match refused.len().saturating_sub(SHOWN) {
                    0 => Ok(()),
                    more => write!(f, "; and {more} more"),
                }
            }
        }
    }
}

/// Whom a certificate the policy's `fulcio` accepts names, for [`Accepted::key`].
pub(super) fn certificate_name(fulcio: &Fulcio) -> String {
    let issuer = fulcio.oidc_issuer.as_deref().unwrap_or_default();
    let email = fulcio.subject_email.as_deref().unwrap_or_default();
    format!("certificate for {} (OIDC issuer {})", shown(email), shown(issuer))
}

/// The policy's keys, for a message: each by algorithm and fingerprint, four at most.
pub(super) fn named(keys: &[PublicKey]) -> String {
    let listed: Vec<String> =
        keys.iter().take(4).map(|key| format!("{} key {}", key.algorithm(), key.fingerprint())).collect();
    match keys.len() {
        1 => format!("the policy's {}", listed.join("")),
        count if count <= 4 => format!("any of the policy's keys ({})", listed.join(", ")),
        count => format!("any of the policy's {count} keys ({}, …)", listed.join(", ")),
    }
}

/// A digest for a person: a SHA-256 one to its first 12 hex digits, anything else escaped and
/// bounded (it comes from a registry).
pub(super) fn short(digest: &str) -> String {
    if is_sha256(digest) { format!("{}…", &digest[.."sha256:".len() + 12]) } else { shown(digest) }
}
