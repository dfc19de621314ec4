//! What people and agents are shown of the policy in force: where it was read from, a digest to
//! compare nodes by, and each requirement of a verdict in a line (pure).

use std::{path::PathBuf, time::SystemTime};

use super::{Policies, Requirement, SignedIdentity, SigstoreSigned, Verdict};

/// Where the policy in force came from and when: for GetStatus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    /// `--signature-policy`.
    pub file: Option<PathBuf>,
    /// `--signature-policy-dir`, and how many namespace files it held.
    pub dir: Option<PathBuf>,
    pub namespace_files: usize,
    /// `sha256:<hex>` over every file read (policies and the keys they name), as read: equal on
    /// two nodes when they enforce the same bytes.
    pub digest: String,
    /// When the files were read (start, or the reload that put them in force).
    pub at: SystemTime,
}

impl Policies {
    /// The requirements `verdict` was decided under: its scope's, or its policy's default; none
    /// when no policy applied.
    pub fn requirements_of(&self, verdict: &Verdict) -> &[Requirement] {
        let file = match &verdict.policy {
            super::PolicySource::None => return &[],
            super::PolicySource::Default => self.default.as_ref(),
            super::PolicySource::Namespace(namespace) => self.namespaces.get(namespace),
        };
        let Some(file) = file else { return &[] };
        match &verdict.scope {
            Some(scope) => file.docker.get(scope).map_or(&[], Vec::as_slice),
            None => &file.default,
        }
    }
}

impl Requirement {
    /// One line: its type, and for a signature its keys (by fingerprint, or where they are) and
    /// the identity it accepts. Never a key's bytes.
    pub fn describe(&self) -> String {
        match self {
            Self::SigstoreSigned(signed) => format!("sigstoreSigned ({})", describe_signed(signed)),
            other => other.kind().to_owned(),
        }
    }
}

fn describe_signed(signed: &SigstoreSigned) -> String {
    let source = match (&signed.key_path, &signed.key_paths, &signed.fulcio) {
        (Some(path), _, _) => format!("keyPath {path}"),
        (_, Some(paths), _) => format!("keyPaths {}", paths.join(", ")),
        (_, _, Some(fulcio)) => format!(
            "fulcio oidcIssuer {}, subjectEmail {}, {} CA certificate(s)",
            fulcio.oidc_issuer.as_deref().unwrap_or_default(),
            fulcio.subject_email.as_deref().unwrap_or_default(),
            signed.fulcio_roots.len()
        ),
        _ => "keyData".to_owned(),
    };
    let named = |keys: &[crate::policy::sigstore::PublicKey]| -> Vec<String> {
        keys.iter().map(|key| format!("{} {}", key.algorithm(), key.fingerprint())).collect()
    };
    let keys = named(&signed.keys);
    let mut keys = if keys.is_empty() { String::new() } else { format!(": {}", keys.join(", ")) };
    let rekor = named(&signed.rekor_keys);
    if !rekor.is_empty() {
        keys.push_str(&format!("; Rekor {}", rekor.join(", ")));
    }
    let identity = match &signed.signed_identity {
        None | Some(SignedIdentity::MatchRepoDigestOrExact {}) => "matchRepoDigestOrExact".to_owned(),
        Some(SignedIdentity::MatchExact {}) => "matchExact".to_owned(),
        Some(SignedIdentity::MatchRepository {}) => "matchRepository".to_owned(),
        Some(SignedIdentity::ExactReference { docker_reference }) => format!("exactReference {docker_reference}"),
        Some(SignedIdentity::ExactRepository { docker_repository }) => {
            format!("exactRepository {docker_repository}")
        }
        Some(SignedIdentity::RemapIdentity { prefix, signed_prefix }) => {
            format!("remapIdentity {prefix} -> {signed_prefix}")
        }
    };
    format!("{source}{keys}; signedIdentity {identity}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{policy::PolicySource, reference::ImageReference};

    const P256: &str = include_str!("sigstore/testdata/p256.pub");

    fn policies() -> Policies {
        let key = serde_json::to_string(&base64_of(P256)).expect("json");
        let text = format!(
            r#"{{"default": [{{"type": "reject"}}], "transports": {{"docker": {{"r.example/app": [{{"type": "sigstoreSigned", "keyData": {key}, "signedIdentity": {{"type": "matchRepository"}}}}]}}}}}}"#
        );
        Policies { default: Some(super::super::parse(text.as_bytes()).expect("policy")), ..Default::default() }
    }

    fn base64_of(text: &str) -> String {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(text)
    }

    /// A keyless requirement is told by the identity it asks, its CA and Rekor's key.
    #[test]
    fn a_fulcio_requirement_is_described_by_its_identity_ca_and_rekor_key() {
        let ca = base64_of(include_str!("sigstore/testdata/fulcio-ca.pem"));
        let text = format!(
            r#"{{"default": [{{"type": "sigstoreSigned", "fulcio": {{"caData": "{ca}", "oidcIssuer": "https://issuer.example", "subjectEmail": "dev@example.com"}}, "rekorPublicKeyData": "{}"}}]}}"#,
            base64_of(P256)
        );
        let file = super::super::parse(text.as_bytes()).expect("policy");
        let described = file.default[0].describe();
        assert!(described.starts_with("sigstoreSigned (fulcio oidcIssuer https://issuer.example, subjectEmail dev@example.com, 1 CA certificate(s); Rekor ECDSA P-256 "), "{described}");
    }

    #[test]
    fn a_verdicts_requirements_are_its_scopes_described_by_key_fingerprint_never_key_bytes() {
        let policies = policies();
        let image = ImageReference::parse_normalized("r.example/app:v1").expect("reference");
        let verdict = policies.decide(&image, None);
        assert_eq!(verdict.policy, PolicySource::Default);
        let described: Vec<String> = policies.requirements_of(&verdict).iter().map(Requirement::describe).collect();
        assert_eq!(described.len(), 1);
        assert!(described[0].starts_with("sigstoreSigned (keyData: ECDSA P-256 "), "{described:?}");
        assert!(described[0].ends_with("; signedIdentity matchRepository)"), "{described:?}");
        assert!(!described[0].contains("MFkw"), "no key bytes: {described:?}");
        let other = policies.decide(&ImageReference::parse_normalized("r.example/other:v1").expect("reference"), None);
        let described: Vec<String> = policies.requirements_of(&other).iter().map(Requirement::describe).collect();
        assert_eq!(described, ["reject"]);
        assert!(Policies::default().requirements_of(&Policies::default().decide(&image, None)).is_empty());
    }
}
