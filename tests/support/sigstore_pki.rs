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
use serde_json::{Value, json};

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
    pub fn issue(&self, dir: &Path, name: &str, identity: (&str, &str), usage: &str) -> Issued {
        self.ca.issue(dir, name, "/", &extensions(identity, usage))
    }

    /// A code-signing certificate for `email` as `issuer` vouched for it, of the key of `public`
    /// (cosign's, whose private key cosign keeps): `NAME.crt`.
    pub fn certify(&self, dir: &Path, name: &str, identity: (&str, &str), public: &Path) -> PathBuf {
        self.ca.certify(dir, name, "/", &extensions(identity, "codeSigning"), public)
    }
}

/// A Fulcio certificate's extensions: both of its issuer extensions, the e-mail, `usage`.
fn extensions((email, issuer): (&str, &str), usage: &str) -> [String; 6] {
    let raw_issuer: String = issuer.bytes().map(|byte| format!("{byte:02x}")).collect();
    [
        "basicConstraints=critical,CA:FALSE".to_owned(),
        "keyUsage=critical,digitalSignature".to_owned(),
        format!("extendedKeyUsage={usage}"),
        format!("subjectAltName=critical,email:{email}"),
        format!("1.3.6.1.4.1.57264.1.1=DER:{raw_issuer}"),
        format!("1.3.6.1.4.1.57264.1.8=ASN1:UTF8String:{issuer}"),
    ]
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
        let (entry, timestamp) = self.promise(&body, integrated_time);
        json!({ "SignedEntryTimestamp": timestamp, "Payload": entry }).to_string()
    }

    /// A Sigstore bundle's `tlogEntries[]` item for a DSSE envelope: `signature` (base64) by
    /// `signer` (PEM) over the envelope whose payload is `payload`, logged at `integrated_time`
    /// as a `dsse` 0.0.1 entry with its inclusion promise.
    pub fn dsse_entry(&self, signer: &str, signature: &str, payload: &[u8], integrated_time: i64) -> Value {
        let hex = |bytes: &[u8]| super::registry_push::sha256_digest(bytes).trim_start_matches("sha256:").to_owned();
        let body = json!({
            "apiVersion": "0.0.1",
            "kind": "dsse",
            "spec": {
                // Of the envelope as submitted; cri-imaged reads the payload's hash and the
                // signature instead, which the envelope's hash stands for.
                "envelopeHash": { "algorithm": "sha256", "value": hex(&pae(payload)) },
                "payloadHash": { "algorithm": "sha256", "value": hex(payload) },
                "signatures": [{ "signature": signature, "verifier": base64(signer.as_bytes()) }],
            },
        });
        let (entry, timestamp) = self.promise(&body, integrated_time);
        let log_id = ring::digest::digest(&ring::digest::SHA256, &self.der());
        // A tree of this entry alone (RFC 6962: its root is the leaf's hash), its checkpoint a
        // signed note by the same key: cosign 2.5 reads no bundle without an inclusion proof.
        let root = ring::digest::digest(&ring::digest::SHA256, &[&[0u8][..], body.to_string().as_bytes()].concat());
        let note = format!("rekor.example - 1\n1\n{}\n", base64(root.as_ref()));
        let signed = openssl(&["dgst", "-sha256", "-sign", text(&self.key)], Some(note.as_bytes()));
        let line = base64(&[&log_id.as_ref()[..4], &signed].concat());
        json!({
            "inclusionProof": {
                "logIndex": "0", "rootHash": base64(root.as_ref()), "treeSize": "1", "hashes": [],
                "checkpoint": { "envelope": format!("{note}\n\u{2014} rekor.example {line}\n") },
            },
            "logIndex": "1",
            "logId": { "keyId": base64(log_id.as_ref()) },
            "kindVersion": { "kind": "dsse", "version": "0.0.1" },
            "integratedTime": integrated_time.to_string(),
            "inclusionPromise": { "signedEntryTimestamp": timestamp },
            "canonicalizedBody": entry["body"],
        })
    }

    /// A Sigstore trusted root (cosign's `--trusted-root`) of `ca` (the test Fulcio's PEM) and
    /// this Rekor.
    pub fn trusted_root(&self, ca: &Path) -> Value {
        let ca = openssl(&["x509", "-in", text(ca), "-outform", "DER"], None);
        let der = self.der();
        let since = json!({ "start": "2020-01-01T00:00:00Z" });
        json!({
            "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
            "tlogs": [{
                "baseUrl": "https://rekor.example",
                "hashAlgorithm": "SHA2_256",
                "publicKey": { "rawBytes": base64(&der), "keyDetails": "PKIX_ECDSA_P256_SHA_256", "validFor": since },
                "logId": { "keyId": base64(ring::digest::digest(&ring::digest::SHA256, &der).as_ref()) },
            }],
            "certificateAuthorities": [{
                "subject": { "organization": "cri-imaged test", "commonName": "test Fulcio" },
                "uri": "https://fulcio.example",
                "certChain": { "certificates": [{ "rawBytes": base64(&ca) }] },
                "validFor": since,
            }],
            "ctlogs": [],
            "timestampAuthorities": [],
        })
    }

    /// The DER of the public key.
    fn der(&self) -> Vec<u8> {
        openssl(&["ec", "-pubin", "-in", text(&self.public), "-outform", "DER"], None)
    }

    /// The signed entry timestamp's payload for `body` and the timestamp (base64) over its
    /// canonical JSON.
    fn promise(&self, body: &Value, integrated_time: i64) -> (Value, String) {
        let log_id = super::registry_push::sha256_digest(&self.der());
        // In RFC 8785's order (keys by UTF-16 code units: `logID` before `logIndex`), whether
        // serde_json's map sorts or keeps the order written.
        let entry = json!({
            "body": base64(body.to_string().as_bytes()),
            "integratedTime": integrated_time,
            "logID": log_id.trim_start_matches("sha256:"),
            "logIndex": 1,
        });
        let timestamp = sign(&self.key, entry.to_string().as_bytes());
        (entry, timestamp)
    }
}

/// An in-toto statement of `digest` as cosign 3's `sign` writes it (`name`: none), of
/// `predicate_type`.
pub fn statement(name: Option<&str>, digest: &str, predicate_type: &str) -> Vec<u8> {
    let mut subject = json!({ "digest": { "sha256": digest.trim_start_matches("sha256:") } });
    if let Some(name) = name {
        subject["name"] = json!(name);
    }
    json!({
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [subject],
        "predicateType": predicate_type,
        "predicate": {},
    })
    .to_string()
    .into_bytes()
}

/// DSSE's pre-authentication encoding of an in-toto `payload`: what the envelope's signature is
/// over.
pub fn pae(payload: &[u8]) -> Vec<u8> {
    let kind = "application/vnd.in-toto+json";
    [format!("DSSEv1 {} {kind} {} ", kind.len(), payload.len()).as_bytes(), payload].concat()
}

/// A Sigstore bundle 0.3 (JSON) of `statement` with `signature` (base64, over its PAE), its
/// `verificationMaterial` as given.
pub fn dsse_bundle(material: Value, statement: &[u8], signature: &str) -> Vec<u8> {
    json!({
        "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
        "verificationMaterial": material,
        "dsseEnvelope": {
            "payload": base64(statement),
            "payloadType": "application/vnd.in-toto+json",
            "signatures": [{ "sig": signature, "keyid": "" }],
        },
    })
    .to_string()
    .into_bytes()
}

/// A certificate's bundle: `issued` signed `statement` (its PAE), and `rekor` logged it at
/// `time`.
pub fn certificate_bundle(issued: &Issued, rekor: &Rekor, statement: &[u8], time: i64) -> Vec<u8> {
    let signature = sign(&issued.key, &pae(statement));
    let certificate = std::fs::read_to_string(&issued.cert).expect("the certificate");
    let der = openssl(&["x509", "-in", text(&issued.cert), "-outform", "DER"], None);
    let material = json!({
        "certificate": { "rawBytes": base64(&der) },
        "tlogEntries": [rekor.dsse_entry(&certificate, &signature, statement, time)],
    });
    dsse_bundle(material, statement, &signature)
}

/// A `sigstoreSigned` requirement from its JSON, its files loaded as the daemon loads them.
pub fn requirement(json: Value) -> cri_imaged::policy::SigstoreSigned {
    let mut signed: cri_imaged::policy::SigstoreSigned = serde_json::from_value(json).expect("a requirement");
    let read = |path: &Path| std::fs::read(path).map_err(|error| error.to_string());
    cri_imaged::policy::sigstore::load_keys(&mut signed, &read).expect("loads");
    signed
}

/// Seconds since the epoch, now.
pub fn now() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    i64::try_from(since.as_secs()).expect("in range")
}
