//! cosign signatures verified by public key (issue 49, slice 2), pure: no network, no files but
//! the key files the policy names, read through the caller's reader when the policy is loaded.
//! The registry client fetches the artifact and its payloads; the gate calls [`verify`].
//!
//! - `der`: the bounded DER reader a public key needs;
//! - `key`: PEM `PUBLIC KEY`s (ECDSA P-256 and P-384, Ed25519, RSA) and their signatures;
//! - `load`: a `sigstoreSigned` requirement's keys, loaded with its policy file;
//! - `artifact`: cosign's signature manifest (`sha256-<hex>.sig`), bounded;
//! - `payload`: the signed payload, read as strictly as containers/image reads it;
//! - `identity`: `signedIdentity`, with containers/image's semantics;
//! - `verify`: the decision, and why, per signature.
//!
//! Not yet: `fulcio` (certificates) and Rekor's inclusion proofs, which refuse (fail closed).

mod artifact;
mod der;
mod identity;
mod key;
mod load;
mod payload;
mod verify;

pub use self::{
    artifact::{
        Artifact, ArtifactError, LAYER_LIMIT, Layer, MANIFEST_LIMIT, PAYLOAD_LIMIT, SIGNATURE_MEDIA_TYPE,
        parse_artifact,
    },
    der::DerError,
    key::{Algorithm, KEY_FILE_LIMIT, KeyError, PublicKey},
    load::{KeyLoadError, KeyReader, load_keys},
    payload::{COSIGN_SIGNATURE_TYPE, Payload, PayloadError, parse_payload},
    verify::{Accepted, Refused, Rejected, Why, verify},
};

#[cfg(test)]
mod tests;
