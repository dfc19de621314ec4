//! The decision on an image's signatures under one `sigstoreSigned` requirement, pure: one
//! signature is enough, if it verifies under one of the requirement's keys, is over the payload
//! the layer names, and that payload claims the manifest's digest and an identity the policy's
//! `signedIdentity` accepts. Otherwise every signature's reason, in words for an event.

use std::fmt;

use super::{
    PayloadError, PublicKey,
    artifact::{LAYER_LIMIT, Layer, LayerKind, PAYLOAD_LIMIT, is_sha256},
    bundle::{self, BundleError},
    certificate::{self, CertificateError},
    identity, parse_payload,
    rekor::{self, RekorError},
};
use crate::{
    policy::{Fulcio, SignedIdentity, SigstoreSigned, scope::shown},
    reference::ImageReference,
};

/// The signatures' reasons a message shows.
const SHOWN: usize = 8;

/// The longest base64 signature read: an RSA-8192 signature is 1,368 characters.
const SIGNATURE_BASE64_LIMIT: usize = 4096;

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

/// Judges `image` (as the pod names it, normalised, with the default tag applied: the identity
/// `signedIdentity` compares), whose manifest has `manifest_digest` (`sha256:…`, computed by the
/// caller over the bytes the pull will use), by its `signatures` (each layer of
/// [`super::parse_artifact`]'s with its payload, the layer's blob) under `requirement`. At most
/// [`LAYER_LIMIT`] are read.
pub fn verify(
    requirement: &SigstoreSigned,
    image: &ImageReference,
    manifest_digest: &str,
    signatures: &[(Layer, Vec<u8>)],
) -> Result<Accepted, Rejected> {
    // What the policy's load guarantees, checked again: a requirement whose keys or CA were never
    // loaded refuses everything rather than skip what it names.
    let names_rekor = [
        requirement.rekor_public_key_path.is_some(),
        requirement.rekor_public_key_paths.is_some(),
        requirement.rekor_public_key_data.is_some(),
        requirement.rekor_public_key_datas.is_some(),
    ]
    .contains(&true);
    if names_rekor && requirement.rekor_keys.is_empty() {
        return Err(Rejected::Unsupported("the requirement has no Rekor key loaded"));
    }
    if requirement.fulcio.is_some() {
        if requirement.fulcio_roots.is_empty() || requirement.rekor_keys.is_empty() {
            return Err(Rejected::Unsupported("the requirement has no fulcio CA or Rekor key loaded"));
        }
    } else if requirement.keys.is_empty() {
        return Err(Rejected::Unsupported("the requirement has no public key loaded"));
    }
    if let Some(named) = image.digest().filter(|named| *named != manifest_digest) {
        return Err(Rejected::ImageDigest { named: shown(named), manifest: shown(manifest_digest) });
    }
    if signatures.is_empty() {
        return Err(Rejected::NoSignature);
    }
    let rule = requirement.signed_identity.clone().unwrap_or(SignedIdentity::MatchRepoDigestOrExact {});
    let mut refused = Vec::new();
    for (layer, payload) in signatures.iter().take(LAYER_LIMIT) {
        match one(requirement, &rule, image, manifest_digest, layer, payload) {
            Ok(accepted) => return Ok(accepted),
            Err(why) => refused.push(Refused { layer: short(&layer.digest), why }),
        }
    }
    Err(Rejected::NoneVerified(refused))
}

/// One signature, in containers/image's order: the payload is the layer's, the signer is
/// trusted (a policy's key, or a certificate Rekor logged and the policy's CA issued to its
/// identity), the signature over the payload verifies, and only then is the payload read and
/// its claims checked.
fn one(
    requirement: &SigstoreSigned,
    rule: &SignedIdentity,
    image: &ImageReference,
    manifest_digest: &str,
    layer: &Layer,
    payload: &[u8],
) -> Result<Accepted, Why> {
    if layer.size > PAYLOAD_LIMIT || payload.len() as u64 > PAYLOAD_LIMIT {
        return Err(Why::PayloadTooLarge(layer.size.max(payload.len() as u64)));
    }
    if payload.len() as u64 != layer.size {
        return Err(Why::PayloadSize { stated: layer.size, read: payload.len() });
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, payload);
    if !is_sha256(&layer.digest) || layer.digest["sha256:".len()..] != hex(digest.as_ref()) {
        return Err(Why::PayloadDigest);
    }
    if layer.kind == LayerKind::Bundle {
        return bundle::judge(requirement, rule, image, manifest_digest, (&layer.digest, payload));
    }
    let encoded = layer.signature.as_deref().ok_or(Why::NoSignature)?;
    if encoded.len() > SIGNATURE_BASE64_LIMIT {
        return Err(Why::SignatureEncoding);
    }
    let signature = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, encoded)
        .map_err(|_| Why::SignatureEncoding)?;
    let key = match &requirement.fulcio {
        Some(fulcio) => by_certificate(requirement, fulcio, layer, &signature, payload)?,
        None => {
            let keys = &requirement.keys;
            let key =
                keys.iter().find(|key| key.verifies(payload, &signature)).ok_or_else(|| Why::NoKey(named(keys)))?;
            if !requirement.rekor_keys.is_empty() {
                rekor::logged_at(&requirement.rekor_keys, layer.bundle.as_deref(), key.spki(), &signature, payload)?;
            }
            key.fingerprint().to_owned()
        }
    };
    let claims = parse_payload(payload)?;
    if claims.manifest_digest != manifest_digest {
        return Err(Why::OtherImage(short(&claims.manifest_digest)));
    }
    identity::check(rule, image, &claims.docker_reference).map_err(Why::Identity)?;
    Ok(Accepted { key, layer: layer.digest.clone(), identity: shown(&claims.docker_reference) })
}

/// A keyless signature: Rekor logged it (its time), the certificate was the policy's CA's for the
/// policy's identity then, and its key made the signature. Whom the certificate names.
fn by_certificate(
    requirement: &SigstoreSigned,
    fulcio: &Fulcio,
    layer: &Layer,
    signature: &[u8],
    payload: &[u8],
) -> Result<String, Why> {
    let certificate = layer.certificate.as_deref().ok_or(Why::NoCertificate)?;
    let signer = rekor::first_pem_der(certificate.as_bytes()).ok_or(Why::NoCertificate)?;
    let time = rekor::logged_at(&requirement.rekor_keys, layer.bundle.as_deref(), &signer, signature, payload)?;
    let issuer = fulcio.oidc_issuer.as_deref().unwrap_or_default();
    let email = fulcio.subject_email.as_deref().unwrap_or_default();
    let chain = layer.chain.as_deref();
    let key = certificate::signer(&requirement.fulcio_roots, certificate, chain, time, (issuer, email))?;
    if !key.verifies(payload, signature) {
        return Err(Why::NotByCertificate);
    }
    Ok(certificate_name(fulcio))
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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}
