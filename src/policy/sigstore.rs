//! cosign signatures verified by public key or by a Fulcio certificate, with Rekor's signed entry
//! timestamps where the policy names Rekor's key; pure: no network, no files but the key and CA
//! files the policy names, read through the caller's reader when the policy is loaded.
//! The registry client fetches the artifact and its payloads; the gate calls [`verify`].
//!
//! - `der`: the bounded DER reader a public key needs;
//! - `key`: PEM `PUBLIC KEY`s (ECDSA P-256 and P-384, Ed25519, RSA) and their signatures;
//! - `load`: a `sigstoreSigned` requirement's keys and CA, loaded with its policy file;
//! - `certificate`: a keyless signer's certificate, its chain to the policy's CA and its identity;
//! - `rekor`: Rekor's signed entry timestamp, and when it says the signature was logged;
//! - `artifact`: cosign's signature manifest (`sha256-<hex>.sig`, or a referrer), bounded;
//! - `envelope`: a Sigstore bundle's format (a DSSE envelope of an in-toto statement), read;
//! - `bundle`: a Sigstore bundle judged as an image signature;
//! - `payload`: the signed payload, read as strictly as containers/image reads it;
//! - `identity`: `signedIdentity`, with containers/image's semantics;
//! - `verdict`: what the decision says: a signature accepted, or why not;
//! - `verify`: the decision, per signature.
//!
//! Not verified: Rekor's inclusion proofs and certificates' SCTs (containers/image checks neither;
//! the SET is what proves the log has the entry), and a bundle's RFC 3161 timestamps.

mod artifact;
mod bundle;
mod certificate;
mod der;
mod envelope;
mod identity;
mod key;
mod load;
mod payload;
mod rekor;
mod verdict;
mod verify;

pub use self::{
    artifact::{
        Artifact, ArtifactError, BUNDLE_MEDIA_TYPE, BUNDLE_MEDIA_TYPES, LAYER_LIMIT, Layer, LayerKind, MANIFEST_LIMIT,
        PAYLOAD_LIMIT, REFERRER_ARTIFACT_TYPE, REFERRER_LIMIT, SIGNATURE_MEDIA_TYPE, parse_artifact, parse_referrers,
    },
    certificate::{CertificateError, Leaf, read_leaf, trust_anchors},
    der::DerError,
    envelope::{BundleError, SIGN_PREDICATE_TYPE, pae},
    key::{Algorithm, KEY_FILE_LIMIT, KeyError, PublicKey},
    load::{KeyLoadError, KeyReader, load_keys},
    payload::{COSIGN_SIGNATURE_TYPE, Payload, PayloadError, parse_payload},
    rekor::{BUNDLE_LIMIT, RekorError},
    verdict::{Accepted, Refused, Rejected, Why},
    verify::verify,
};

#[cfg(test)]
mod tests;
