//! Rekor's signed entry timestamp (the `dev.sigstore.cosign/bundle` annotation), read as hostile
//! input with containers/image's semantics: the SET is an ECDSA signature by one of the policy's
//! Rekor keys over the canonical JSON (RFC 8785) of its payload; the payload's body is a
//! `hashedrekord` 0.0.1 entry naming the same signer (key or certificate), the same signature
//! and the SHA-256 of the same payload. Its `integratedTime` is when the signature was logged:
//! the time a Fulcio certificate must have been valid at.

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::PublicKey;

/// The largest bundle annotation read: cosign's are about 3 KiB (the body holds a certificate).
pub const BUNDLE_LIMIT: usize = 64 * 1024;

/// Why a SET does not vouch for a signature.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RekorError {
    #[error("no Rekor bundle (dev.sigstore.cosign/bundle), which the policy's rekorPublicKey asks for")]
    Missing,
    #[error("the Rekor bundle is more than {BUNDLE_LIMIT} bytes")]
    TooLarge,
    #[error("the Rekor bundle is not a SignedEntryTimestamp and a Payload of body, integratedTime, logIndex and logID")]
    Format,
    #[error("the Rekor bundle is not signed by the policy's Rekor key")]
    Signature,
    #[error("the Rekor entry is not a hashedrekord 0.0.1 of a SHA-256")]
    Body,
    #[error("the Rekor entry names another signer")]
    OtherSigner,
    #[error("the Rekor entry is of another signature")]
    OtherSignature,
    #[error("the Rekor entry is of another payload")]
    OtherPayload,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Bundle {
    #[serde(rename = "SignedEntryTimestamp")]
    signed_entry_timestamp: String,
    #[serde(rename = "Payload")]
    payload: Payload,
}

/// The signed payload, its fields in the canonical order (RFC 8785 sorts keys by UTF-16 code
/// units, so `logID` before `logIndex`): serialised compactly, this is its canonical form, as
/// serde_json escapes strings as ECMAScript's JSON.stringify does.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct Payload {
    body: String,
    #[serde(rename = "integratedTime")]
    integrated_time: i64,
    #[serde(rename = "logID")]
    log_id: String,
    #[serde(rename = "logIndex")]
    log_index: i64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Entry {
    api_version: String,
    kind: String,
    spec: Spec,
}

#[derive(Deserialize)]
struct Spec {
    data: Data,
    signature: EntrySignature,
}

#[derive(Deserialize)]
struct Data {
    hash: Hash,
}

#[derive(Deserialize)]
struct Hash {
    algorithm: String,
    value: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct EntrySignature {
    content: String,
    public_key: Content,
}

#[derive(Deserialize)]
struct Content {
    content: String,
}

/// When `bundle` says the signature was logged (seconds since the epoch), if one of `rekor_keys`
/// signed it and its entry is of `signer` (the DER in the key's or certificate's PEM),
/// `signature` (decoded) over `payload`.
pub fn logged_at(
    rekor_keys: &[PublicKey],
    bundle: Option<&str>,
    signer: &[u8],
    signature: &[u8],
    payload: &[u8],
) -> Result<u64, RekorError> {
    let bundle = bundle.ok_or(RekorError::Missing)?;
    if bundle.len() > BUNDLE_LIMIT {
        return Err(RekorError::TooLarge);
    }
    let bundle: Bundle = serde_json::from_str(bundle).map_err(|_| RekorError::Format)?;
    let timestamp = base64_decode(&bundle.signed_entry_timestamp).ok_or(RekorError::Format)?;
    let canonical = serde_json::to_vec(&bundle.payload).map_err(|_| RekorError::Format)?;
    if !rekor_keys.iter().any(|key| key.verifies(&canonical, &timestamp)) {
        return Err(RekorError::Signature);
    }
    let body = base64_decode(&bundle.payload.body).ok_or(RekorError::Body)?;
    let entry: Entry = serde_json::from_slice(&body).map_err(|_| RekorError::Body)?;
    if entry.kind != "hashedrekord" || entry.api_version != "0.0.1" || entry.spec.data.hash.algorithm != "sha256" {
        return Err(RekorError::Body);
    }
    let named = base64_decode(&entry.spec.signature.public_key.content).ok_or(RekorError::Body)?;
    if first_pem_der(&named).as_deref() != Some(signer) {
        return Err(RekorError::OtherSigner);
    }
    if base64_decode(&entry.spec.signature.content).as_deref() != Some(signature) {
        return Err(RekorError::OtherSignature);
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, payload);
    let hex: String = digest.as_ref().iter().map(|byte| format!("{byte:02x}")).collect();
    if !entry.spec.data.hash.value.eq_ignore_ascii_case(&hex) {
        return Err(RekorError::OtherPayload);
    }
    // A time before the epoch vouches for no certificate's validity.
    u64::try_from(bundle.payload.integrated_time).map_err(|_| RekorError::Format)
}

/// The DER of the first PEM block in `pem`, whatever its type (containers/image compares the
/// blocks' bytes only), if nothing but white space follows it.
pub fn first_pem_der(pem: &[u8]) -> Option<Vec<u8>> {
    let mut reader = pem;
    let (_, der) = rustls::pki_types::pem::from_buf(&mut reader).ok()??;
    reader.iter().all(u8::is_ascii_whitespace).then_some(der)
}

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD.decode(text).ok()
}
