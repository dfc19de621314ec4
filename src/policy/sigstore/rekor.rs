//! Rekor's signed entry timestamp (the `dev.sigstore.cosign/bundle` annotation), read as hostile
//! input with containers/image's semantics: the SET is an ECDSA signature by one of the policy's
//! Rekor keys over the canonical JSON (RFC 8785) of its payload; the payload's body is a
//! `hashedrekord` 0.0.1 entry naming the same signer (key or certificate), the same signature
//! and the SHA-256 of the same payload. Its `integratedTime` is when the signature was logged:
//! the time a Fulcio certificate must have been valid at.
//!
//! A Sigstore bundle carries the same promise in its `tlogEntries`, over a `dsse` 0.0.1 entry: the
//! envelope's signature by the same signer, and the SHA-256 of its payload.

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::PublicKey;
use crate::policy::scope::shown;

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
    #[error("the bundle's Rekor entry has no inclusion promise (signed entry timestamp)")]
    NoPromise,
    #[error("the bundle has no Rekor entry, which the policy's Rekor key asks for")]
    NoEntry,
    #[error("the bundle's Rekor entry is a {0} {1}, not a dsse 0.0.1")]
    Kind(String, String),
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
    let body = vouched(rekor_keys, &bundle.signed_entry_timestamp, &bundle.payload)?;
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
    if !entry.spec.data.hash.value.eq_ignore_ascii_case(&sha256_hex(payload)) {
        return Err(RekorError::OtherPayload);
    }
    integrated(&bundle.payload)
}

/// A Sigstore bundle's transparency log entry (`verificationMaterial.tlogEntries[]`), as its
/// protobuf JSON has it: 64-bit integers may be strings, the log's id is base64.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TlogEntry {
    pub log_index: Int64,
    pub log_id: LogId,
    pub kind_version: KindVersion,
    pub integrated_time: Int64,
    pub inclusion_promise: Option<Promise>,
    pub canonicalized_body: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogId {
    pub key_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct KindVersion {
    pub kind: String,
    pub version: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Promise {
    pub signed_entry_timestamp: String,
}

/// A protobuf JSON int64: a string of digits, or a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Int64(pub i64);

impl<'de> Deserialize<'de> for Int64 {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Number(i64),
            Text(String),
        }
        match Either::deserialize(deserializer)? {
            Either::Number(number) => Ok(Self(number)),
            Either::Text(text) => text.parse().map(Self).map_err(serde::de::Error::custom),
        }
    }
}

/// The most log entries of one bundle tried.
pub const TLOG_ENTRY_LIMIT: usize = 4;

#[derive(Deserialize)]
struct DsseEntry {
    #[serde(rename = "apiVersion")]
    api_version: String,
    kind: String,
    spec: DsseSpec,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DsseSpec {
    payload_hash: Hash,
    signatures: Vec<DsseSignature>,
}

#[derive(Deserialize)]
struct DsseSignature {
    signature: String,
    verifier: String,
}

/// When one of a bundle's `entries` says a DSSE signature was logged: its promise (the SET) is
/// signed by one of `rekor_keys`, and its body is a `dsse` 0.0.1 entry listing `signature` by
/// `signer` (DER) over an envelope whose payload is `payload`. The first entry that vouches wins;
/// none: why the last one did not.
pub fn dsse_logged_at(
    rekor_keys: &[PublicKey],
    entries: &[TlogEntry],
    signer: &[u8],
    signature: &[u8],
    payload: &[u8],
) -> Result<u64, RekorError> {
    let mut why = RekorError::NoEntry;
    for entry in entries.iter().take(TLOG_ENTRY_LIMIT) {
        match dsse_entry(rekor_keys, entry, signer, signature, payload) {
            Ok(time) => return Ok(time),
            Err(error) => why = error,
        }
    }
    Err(why)
}

fn dsse_entry(
    rekor_keys: &[PublicKey],
    entry: &TlogEntry,
    signer: &[u8],
    signature: &[u8],
    payload: &[u8],
) -> Result<u64, RekorError> {
    let promise = entry.inclusion_promise.as_ref().ok_or(RekorError::NoPromise)?;
    let log_id = base64_decode(&entry.log_id.key_id).ok_or(RekorError::Format)?;
    let set_payload = Payload {
        body: entry.canonicalized_body.clone(),
        integrated_time: entry.integrated_time.0,
        log_id: log_id.iter().map(|byte| format!("{byte:02x}")).collect(),
        log_index: entry.log_index.0,
    };
    let body = vouched(rekor_keys, &promise.signed_entry_timestamp, &set_payload)?;
    let (kind, version) = (entry.kind_version.kind.as_str(), entry.kind_version.version.as_str());
    if (kind, version) != ("dsse", "0.0.1") {
        return Err(RekorError::Kind(shown(kind), shown(version)));
    }
    let logged: DsseEntry = serde_json::from_slice(&body).map_err(|_| RekorError::Body)?;
    if logged.kind != "dsse" || logged.api_version != "0.0.1" || logged.spec.payload_hash.algorithm != "sha256" {
        return Err(RekorError::Body);
    }
    let by_signer: Vec<&DsseSignature> = logged
        .spec
        .signatures
        .iter()
        .filter(|listed| base64_decode(&listed.verifier).and_then(|pem| first_pem_der(&pem)).as_deref() == Some(signer))
        .collect();
    if by_signer.is_empty() {
        return Err(RekorError::OtherSigner);
    }
    if !by_signer.iter().any(|listed| base64_decode(&listed.signature).as_deref() == Some(signature)) {
        return Err(RekorError::OtherSignature);
    }
    if !logged.spec.payload_hash.value.eq_ignore_ascii_case(&sha256_hex(payload)) {
        return Err(RekorError::OtherPayload);
    }
    integrated(&set_payload)
}

/// The entry's body, if one of `rekor_keys` made `timestamp` (base64) over `payload`'s canonical
/// form.
fn vouched(rekor_keys: &[PublicKey], timestamp: &str, payload: &Payload) -> Result<Vec<u8>, RekorError> {
    let timestamp = base64_decode(timestamp).ok_or(RekorError::Format)?;
    let canonical = serde_json::to_vec(payload).map_err(|_| RekorError::Format)?;
    if !rekor_keys.iter().any(|key| key.verifies(&canonical, &timestamp)) {
        return Err(RekorError::Signature);
    }
    base64_decode(&payload.body).ok_or(RekorError::Body)
}

/// A time before the epoch vouches for no certificate's validity.
fn integrated(payload: &Payload) -> Result<u64, RekorError> {
    u64::try_from(payload.integrated_time).map_err(|_| RekorError::Format)
}

fn sha256_hex(bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    digest.as_ref().iter().map(|byte| format!("{byte:02x}")).collect()
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
