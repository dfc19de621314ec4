//! A test Fulcio and a test Rekor, made by `openssl` at test time (never committed): a CA that
//! issues code-signing certificates carrying Fulcio's OIDC issuer and e-mail, and a Rekor key
//! that signs entry timestamps (the `dev.sigstore.cosign/bundle` annotation) for signatures made
//! by those certificates or by plain keys. What they make, cosign verifies offline (its Rekor key
//! from `SIGSTORE_REKOR_PUBLIC_KEY`), so cosign stays the oracle for certificate signatures.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use base64::Engine as _;
use serde_json::json;

use super::test_ca::{Leaf, TestCa};

fn openssl(args: &[&str], stdin: Option<&[u8]>) -> Vec<u8> {
    use std::io::Write as _;
    let mut child = Command::new("openssl")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("openssl runs");
    child.stdin.take().expect("stdin").write_all(stdin.unwrap_or_default()).expect("openssl's stdin");
    let output = child.wait_with_output().expect("openssl ends");
    assert!(output.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    output.stdout
}

fn text(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

pub fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A P-256 key pair in `dir`: `NAME.key` (PEM private key) and `NAME.pub` (PEM public key).
pub fn key_pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let (key, public) = (dir.join(format!("{name}.key")), dir.join(format!("{name}.pub")));
    openssl(&["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", text(&key)], None);
    openssl(&["ec", "-in", text(&key), "-pubout", "-out", text(&public)], None);
    (key, public)
}

/// `payload` signed by the private key at `key` (ECDSA over SHA-256, ASN.1), base64: as cosign
/// puts it in `dev.cosignproject.cosign/signature`.
pub fn sign(key: &Path, payload: &[u8]) -> String {
    base64(&openssl(&["dgst", "-sha256", "-sign", text(key)], Some(payload)))
}

/// A payload as cosign writes it for `repository` (no tag) at `digest`.
pub fn payload(repository: &str, digest: &str) -> Vec<u8> {
    json!({
        "critical": {
            "identity": { "docker-reference": repository },
            "image": { "docker-manifest-digest": digest },
            "type": "cosign container image signature",
        },
        "optional": null,
    })
    .to_string()
    .into_bytes()
}

/// A test Fulcio: its CA (`NAME.pem`, what a policy's `fulcio.caPath` names).
pub struct Fulcio {
    pub ca: TestCa,
}

/// A certificate Fulcio issued, and its private key.
pub type Issued = Leaf;

impl Fulcio {
    pub fn new(dir: &Path, name: &str) -> Self {
        Self { ca: TestCa::new(dir, name) }
    }

    /// A certificate for `email` as `issuer` vouched for it, valid for a day from now, for code
    /// signing (or for `usage`, to be refused), with both of Fulcio's issuer extensions.
    pub fn issue(&self, dir: &Path, name: &str, (email, issuer): (&str, &str), usage: &str) -> Issued {
        let raw_issuer: String = issuer.bytes().map(|byte| format!("{byte:02x}")).collect();
        let extensions = [
            "basicConstraints=critical,CA:FALSE".to_owned(),
            "keyUsage=critical,digitalSignature".to_owned(),
            format!("extendedKeyUsage={usage}"),
            format!("subjectAltName=critical,email:{email}"),
            format!("1.3.6.1.4.1.57264.1.1=DER:{raw_issuer}"),
            format!("1.3.6.1.4.1.57264.1.8=ASN1:UTF8String:{issuer}"),
        ];
        self.ca.issue(dir, name, "/", &extensions)
    }
}

/// A test Rekor: its key pair (`NAME.pub` is what a policy's `rekorPublicKeyPath` names, and
/// cosign's `SIGSTORE_REKOR_PUBLIC_KEY`).
pub struct Rekor {
    pub key: PathBuf,
    pub public: PathBuf,
}

impl Rekor {
    pub fn new(dir: &Path, name: &str) -> Self {
        let (key, public) = key_pair(dir, name);
        Self { key, public }
    }

    /// The bundle annotation for `signature` (base64) over `payload` by `signer` (the PEM of the
    /// certificate or public key), logged at `integrated_time`: a hashedrekord entry, its
    /// timestamp signed over the payload's canonical JSON (keys sorted, no white space).
    pub fn bundle(&self, signer: &str, signature: &str, payload: &[u8], integrated_time: i64) -> String {
        let body = json!({
            "apiVersion": "0.0.1",
            "kind": "hashedrekord",
            "spec": {
                "data": { "hash": { "algorithm": "sha256", "value": super::registry_push::sha256_digest(payload).trim_start_matches("sha256:") } },
                "signature": { "content": signature, "publicKey": { "content": base64(signer.as_bytes()) } },
            },
        });
        let der = openssl(&["ec", "-pubin", "-in", text(&self.public), "-outform", "DER"], None);
        let log_id = super::registry_push::sha256_digest(&der);
        // In RFC 8785's order (keys by UTF-16 code units: `logID` before `logIndex`), whether
        // serde_json's map sorts or keeps the order written.
        let entry = json!({
            "body": base64(body.to_string().as_bytes()),
            "integratedTime": integrated_time,
            "logID": log_id.trim_start_matches("sha256:"),
            "logIndex": 1,
        });
        let timestamp = sign(&self.key, entry.to_string().as_bytes());
        json!({ "SignedEntryTimestamp": timestamp, "Payload": entry }).to_string()
    }
}

/// Seconds since the epoch, now.
pub fn now() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    i64::try_from(since.as_secs()).expect("in range")
}
