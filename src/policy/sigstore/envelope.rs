//! A Sigstore bundle's format, read as hostile input: its JSON (a DSSE envelope of an in-toto
//! statement, and what it says of its signer and log), DSSE's pre-authentication encoding, and
//! why a bundle is not read. `bundle` judges what is read.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::{Deserialize, de::IgnoredAny};

use super::rekor::TlogEntry;

/// The predicate type of cosign's image signature as an in-toto statement.
pub const SIGN_PREDICATE_TYPE: &str = "https://sigstore.dev/cosign/sign/v1";

/// The payload type of a DSSE envelope holding an in-toto statement.
pub(super) const IN_TOTO_PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";

/// The in-toto statement types read.
pub(super) const STATEMENT_TYPES: [&str; 2] = ["https://in-toto.io/Statement/v1", "https://in-toto.io/Statement/v0.1"];

/// The most signatures of one envelope tried.
pub(super) const ENVELOPE_SIGNATURE_LIMIT: usize = 4;

/// The longest base64 signature read, as for a cosign layer's annotation.
pub(super) const SIGNATURE_BASE64_LIMIT: usize = 4096;

/// Why a bundle is not read as an image signature.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BundleError {
    /// serde's words, escaped and bounded: they may quote what the registry sent.
    #[error("the bundle is not a Sigstore bundle: {0}")]
    Parse(String),
    #[error("the bundle's mediaType is {0}, not a Sigstore bundle's")]
    MediaType(String),
    #[error("the bundle signs a blob (messageSignature), not an image")]
    MessageSignature,
    #[error("the bundle has no DSSE envelope")]
    NoEnvelope,
    #[error("the envelope's payloadType is {0}, not {IN_TOTO_PAYLOAD_TYPE}")]
    PayloadType(String),
    #[error("the envelope's payload is not base64")]
    PayloadEncoding,
    #[error("the envelope holds {0} signatures, not 1 to {ENVELOPE_SIGNATURE_LIMIT}")]
    SignatureCount(usize),
    #[error("an envelope signature is not base64 of at most {SIGNATURE_BASE64_LIMIT} characters")]
    SignatureEncoding,
    #[error("the bundle's certificate is not base64 DER")]
    CertificateEncoding,
    #[error("the envelope's payload is not an in-toto statement: {0}")]
    Statement(String),
    #[error("the statement's _type is {0}, not an in-toto statement's")]
    StatementType(String),
    #[error("a {0} attestation, not a cosign signature ({SIGN_PREDICATE_TYPE})")]
    NotASignature(String),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawBundle {
    pub(super) media_type: String,
    pub(super) verification_material: Material,
    pub(super) dsse_envelope: Option<Envelope>,
    pub(super) message_signature: Option<IgnoredAny>,
}

/// What the bundle says of its signer and log; a `publicKey` hint is not read (the policy's keys
/// are tried in turn), nor RFC 3161 timestamps (containers-policy.json names no TSA).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Material {
    pub(super) certificate: Option<RawBytes>,
    pub(super) x509_certificate_chain: Option<Chain>,
    #[serde(default)]
    pub(super) tlog_entries: Vec<TlogEntry>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawBytes {
    pub(super) raw_bytes: String,
}

#[derive(Deserialize)]
pub(super) struct Chain {
    pub(super) certificates: Vec<RawBytes>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Envelope {
    pub(super) payload: String,
    pub(super) payload_type: String,
    pub(super) signatures: Vec<EnvelopeSignature>,
}

#[derive(Deserialize)]
pub(super) struct EnvelopeSignature {
    pub(super) sig: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Statement {
    #[serde(rename = "_type")]
    pub(super) statement_type: String,
    pub(super) predicate_type: String,
    pub(super) subject: Vec<Subject>,
}

#[derive(Deserialize)]
pub(super) struct Subject {
    pub(super) name: Option<String>,
    pub(super) digest: BTreeMap<String, String>,
}

/// DSSE's pre-authentication encoding: what an envelope's signature is over.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut encoded = format!("DSSEv1 {} {payload_type} {} ", payload_type.len(), payload.len()).into_bytes();
    encoded.extend_from_slice(payload);
    encoded
}

pub(super) fn decode(text: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD.decode(text).ok()
}

pub(super) fn bounded(error: &serde_json::Error) -> String {
    crate::messages::echo(&error.to_string().escape_debug().to_string()).into_owned()
}
