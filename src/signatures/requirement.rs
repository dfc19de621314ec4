//! A requirement's name across restarts: the SHA-256 of its canonical form (every field the
//! policy file gave it, each loaded key's algorithm and SHA-256, each Fulcio CA certificate's
//! SHA-256), so that a verification kept on disk matches only the requirement it met, and a
//! reload or restart that changes any of it (a key, a key or CA file's contents,
//! `signedIdentity`) leaves what it covered unmatched.

use std::sync::Arc;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::policy::{Fulcio, SignedIdentity, SigstoreSigned, sigstore::PublicKey};

/// The canonical form's version: a change to the form leaves every kept verification unmatched.
const FORM: u32 = 2;

/// The hex SHA-256 naming `requirements`, in their order (all must be met).
pub fn requirement_id(requirements: &[Arc<SigstoreSigned>]) -> String {
    let canonical =
        json!({ "form": FORM, "requirements": requirements.iter().map(|r| canonical(r)).collect::<Vec<_>>() });
    let bytes = serde_json::to_vec(&canonical).unwrap_or_default();
    format!("{:x}", Sha256::digest(&bytes))
}

/// Every field, named: a field added to [`SigstoreSigned`] must be added here (the destructuring
/// does not compile until it is), or two requirements that differ in it would share a name.
fn canonical(signed: &SigstoreSigned) -> Value {
    let SigstoreSigned {
        key_path,
        key_paths,
        key_data,
        key_datas,
        fulcio,
        rekor_public_key_path,
        rekor_public_key_paths,
        rekor_public_key_data,
        rekor_public_key_datas,
        signed_identity,
        keys,
        rekor_keys,
        fulcio_roots,
    } = signed;
    json!({
        "keyPath": key_path,
        "keyPaths": key_paths,
        "keyData": key_data,
        "keyDatas": key_datas,
        "fulcio": fulcio.as_ref().map(canonical_fulcio),
        "rekorPublicKeyPath": rekor_public_key_path,
        "rekorPublicKeyPaths": rekor_public_key_paths,
        "rekorPublicKeyData": rekor_public_key_data,
        "rekorPublicKeyDatas": rekor_public_key_datas,
        "signedIdentity": signed_identity.as_ref().map(canonical_identity),
        "keys": keys.iter().map(key).collect::<Vec<_>>(),
        "rekorKeys": rekor_keys.iter().map(key).collect::<Vec<_>>(),
        "fulcioRoots": fulcio_roots.iter().map(|root| format!("{:x}", Sha256::digest(root))).collect::<Vec<_>>(),
    })
}

/// A loaded key: its algorithm and the SHA-256 of its SubjectPublicKeyInfo (what a key file held
/// when it was read; the 64-bit fingerprint a person reads is too short to name it).
fn key(key: &PublicKey) -> String {
    format!("{} {:x}", key.algorithm(), Sha256::digest(key.spki()))
}

fn canonical_fulcio(fulcio: &Fulcio) -> Value {
    let Fulcio { ca_path, ca_data, oidc_issuer, subject_email } = fulcio;
    json!({ "caPath": ca_path, "caData": ca_data, "oidcIssuer": oidc_issuer, "subjectEmail": subject_email })
}

fn canonical_identity(identity: &SignedIdentity) -> Value {
    match identity {
        SignedIdentity::MatchExact {} => json!({ "type": "matchExact" }),
        SignedIdentity::MatchRepoDigestOrExact {} => json!({ "type": "matchRepoDigestOrExact" }),
        SignedIdentity::MatchRepository {} => json!({ "type": "matchRepository" }),
        SignedIdentity::ExactReference { docker_reference } => {
            json!({ "type": "exactReference", "dockerReference": docker_reference })
        }
        SignedIdentity::ExactRepository { docker_repository } => {
            json!({ "type": "exactRepository", "dockerRepository": docker_repository })
        }
        SignedIdentity::RemapIdentity { prefix, signed_prefix } => {
            json!({ "type": "remapIdentity", "prefix": prefix, "signedPrefix": signed_prefix })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A requirement as a policy file writes it (keys given as `keyData` are loaded).
    fn parsed(text: &str) -> Vec<Arc<SigstoreSigned>> {
        let policy = format!(r#"{{"default": [{text}]}}"#);
        let file = crate::policy::parse(policy.as_bytes()).expect("a policy");
        file.default
            .into_iter()
            .filter_map(|requirement| match requirement {
                crate::policy::Requirement::SigstoreSigned(signed) => Some(signed),
                _ => None,
            })
            .collect()
    }

    /// A key file's bytes as `keyData` gives them.
    fn key_data(pem: &str) -> String {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(pem)
    }

    const P256: &str = include_str!("../policy/sigstore/testdata/p256.pub");
    const P384: &str = include_str!("../policy/sigstore/testdata/p384.pub");

    #[test]
    fn the_same_requirement_read_twice_has_the_same_name_and_any_change_another() {
        let with_key = |pem: &str, identity: &str| {
            let data = key_data(pem);
            format!(r#"{{"type": "sigstoreSigned", "keyData": "{data}", "signedIdentity": {identity}}}"#)
        };
        let base = |identity: &str| with_key(P256, identity);
        let repository = base(r#"{"type": "matchRepository"}"#);
        let one = requirement_id(&parsed(&repository));
        assert_eq!(one, requirement_id(&parsed(&repository)), "stable");
        assert_eq!(one.len(), 64);
        assert!(one.bytes().all(|byte| byte.is_ascii_hexdigit() && !byte.is_ascii_uppercase()));
        let exact = requirement_id(&parsed(&base(r#"{"type": "matchExact"}"#)));
        assert_ne!(one, exact, "another signedIdentity");
        assert_ne!(one, requirement_id(&parsed(&with_key(P384, r#"{"type": "matchRepository"}"#))), "another key");
        let remapped = |prefix: &str| {
            let identity = format!(r#"{{"type": "remapIdentity", "prefix": "{prefix}", "signedPrefix": "s.example"}}"#);
            requirement_id(&parsed(&base(&identity)))
        };
        assert_ne!(remapped("a.example"), remapped("b.example"), "another prefix");
        // Two requirements are not one, and their order is kept.
        let two = parsed(&format!("{repository}, {}", base(r#"{"type": "matchExact"}"#)));
        assert_eq!(two.len(), 2);
        let reversed: Vec<_> = two.iter().rev().cloned().collect();
        assert_ne!(requirement_id(&two), one);
        assert_ne!(requirement_id(&two), requirement_id(&reversed));
    }

    #[test]
    fn a_key_file_whose_key_changed_under_the_same_path_is_another_requirement() {
        let text = br#"{"default": [{"type": "sigstoreSigned", "keyPath": "/etc/cri-imaged/cosign.pub"}]}"#;
        let read_with = |pem: &'static str| {
            let file = crate::policy::parse_with_keys(text, &|_| Ok(pem.as_bytes().to_vec())).expect("a policy");
            let crate::policy::Requirement::SigstoreSigned(signed) = &file.default[0] else { panic!("sigstoreSigned") };
            requirement_id(std::slice::from_ref(signed))
        };
        assert_eq!(read_with(P256), read_with(P256));
        assert_ne!(read_with(P256), read_with(P384));
    }
}
