//! cosign's signature artifact as a registry would serve it: any bytes read as the `.sig`
//! manifest (`policy::sigstore::parse_artifact`) and as an image's referrers
//! (`parse_referrers`), as a payload (`parse_payload`) and a Sigstore bundle's blob (a layer of
//! its own, as a referrer's would be), as a public key (`PublicKey::from_pem`,
//! `from_spki`), and as a signature, then judged by `verify` under fixed keys (the RSA-2048 test
//! vector's and a P-256 one) for the test vector's image and digest; and judged again under a
//! `fulcio` requirement (the test CA) and under the keys with a Rekor key (the P-256 one), whose
//! private keys were discarded: nothing may ever pass those. The payload is also read as a
//! certificate's DER (`read_leaf`, which verification reaches only after a chain to the CA
//! verified).
//!
//! Input: the manifest, the payload, the signature annotation (base64), the certificate
//! annotation (PEM) and the bundle annotation (JSON), separated by NUL bytes; missing parts are
//! empty.
#![no_main]

use cri_imaged::{
    policy::{
        SigstoreSigned,
        sigstore::{
            LAYER_LIMIT, Layer, LayerKind, PublicKey, REFERRER_LIMIT, Rejected, load_keys, parse_artifact, parse_payload,
            parse_referrers, read_leaf, verify,
        },
    },
    reference::ImageReference,
};
use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};

/// The test vector's manifest digest (src/policy/sigstore/testdata/README.md).
const MANIFEST: &str = "sha256:a8e87c3b20f50688f5156a664736f33dcc8a81e83c63156df15bb00d01f2c758";
const RSA: &str = include_str!("../../src/policy/sigstore/testdata/rsa-2048.pub");
const P256: &str = include_str!("../../src/policy/sigstore/testdata/p256.pub");
const FULCIO_CA: &str = include_str!("../../src/policy/sigstore/testdata/fulcio-ca.pem");

/// The longest error of a parser: what it quotes is escaped and bounded.
const MAX_ERROR: usize = 1500;
/// The longest refusal: eight signatures' reasons shown, each bounded.
const MAX_REFUSAL: usize = 8 * 1000;

fn requirement(identity: &str) -> SigstoreSigned {
    let b64 = |pem: &str| base64(pem.as_bytes());
    let json = format!(r#"{{"keyDatas": ["{}", "{}"], "signedIdentity": {identity}}}"#, b64(RSA), b64(P256));
    let mut signed: SigstoreSigned = serde_json::from_str(&json).expect("a requirement");
    load_keys(&mut signed, &|_| Err("no files".into())).expect("the test keys load");
    signed
}

/// Requirements nothing the fuzzer makes can meet: their private keys are gone.
fn unforgeable() -> [SigstoreSigned; 2] {
    let b64 = |pem: &str| base64(pem.as_bytes());
    let fulcio = format!(
        r#"{{"fulcio": {{"caData": "{}", "oidcIssuer": "https://issuer.example", "subjectEmail": "dev@example.com"}}, "rekorPublicKeyData": "{}", "signedIdentity": {{"type": "matchRepository"}}}}"#,
        b64(FULCIO_CA),
        b64(P256)
    );
    let logged = format!(
        r#"{{"keyData": "{}", "rekorPublicKeyData": "{}", "signedIdentity": {{"type": "matchRepository"}}}}"#,
        b64(RSA),
        b64(P256)
    );
    [fulcio, logged].map(|json| {
        let mut signed: SigstoreSigned = serde_json::from_str(&json).expect("a requirement");
        load_keys(&mut signed, &|_| Err("no files".into())).expect("the test CA and keys load");
        signed
    })
}

fn base64(bytes: &[u8]) -> String {
    base64::Engine::encode(&base64::engine::general_purpose::STANDARD, bytes)
}

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(5, |&b| b == 0);
    let mut next = || parts.next().unwrap_or_default();
    let (manifest, payload, signature, certificate, bundle) = (next(), next(), next(), next(), next());
    let text = |bytes: &[u8]| (!bytes.is_empty()).then(|| String::from_utf8_lossy(bytes).into_owned());

    let mut layers = Vec::new();
    match parse_artifact(manifest) {
        Ok(artifact) => {
            assert!(artifact.layers.len() <= LAYER_LIMIT);
            for layer in &artifact.layers {
                // Safe in a blob URL: the client fetches by it.
                let hex = layer.digest.strip_prefix("sha256:").expect("a sha256 digest");
                assert!(hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
            }
            layers.extend(artifact.layers.into_iter().map(|layer| (layer, payload.to_vec())));
        }
        Err(error) => assert!(error.to_string().len() <= MAX_ERROR, "{error}"),
    }
    // The manifest's bytes as an image's referrers too.
    match parse_referrers(manifest) {
        Ok(listed) => {
            assert!(listed.len() <= REFERRER_LIMIT);
            assert!(listed.iter().all(|digest| digest.len() == 71 && digest.starts_with("sha256:")));
        }
        Err(error) => assert!(error.to_string().len() <= MAX_ERROR, "{error}"),
    }
    if let Err(error) = parse_payload(payload) {
        assert!(error.to_string().len() <= MAX_ERROR, "{error}");
    }
    for key in [PublicKey::from_pem(payload), PublicKey::from_spki(payload)] {
        if let Err(error) = key {
            assert!(error.to_string().len() <= MAX_ERROR, "{error}");
        }
    }
    if let Err(error) = read_leaf(payload) {
        assert!(error.to_string().len() <= MAX_ERROR, "{error}");
    }

    // The payload as a layer of its own, signed by the third part: the test vector's seed verifies.
    let digest: String = Sha256::digest(payload).iter().map(|b| format!("{b:02x}")).collect();
    let own = Layer {
        kind: LayerKind::Cosign,
        digest: format!("sha256:{digest}"),
        size: payload.len() as u64,
        signature: Some(String::from_utf8_lossy(signature).into_owned()),
        certificate: text(certificate),
        chain: text(certificate),
        bundle: text(bundle),
    };
    // And as a Sigstore bundle's blob.
    layers.push((Layer { kind: LayerKind::Bundle, ..own.clone() }, payload.to_vec()));
    layers.push((own, payload.to_vec()));
    let image = ImageReference::parse_normalized("registry.example.com/team/app:v1").expect("a reference");
    for identity in [r#"{"type": "matchRepository"}"#, r#"{"type": "matchRepoDigestOrExact"}"#] {
        let required = requirement(identity);
        match verify(&required, &image, MANIFEST, &layers) {
            Ok(accepted) => {
                assert!(required.keys.iter().any(|key| key.fingerprint() == accepted.key));
                assert!(layers.iter().any(|(layer, _)| layer.digest == accepted.layer));
            }
            Err(rejected) => {
                let message = rejected.to_string();
                assert!(message.len() <= MAX_REFUSAL, "{} bytes: {message}", message.len());
                if let Rejected::NoneVerified(refused) = rejected {
                    assert_eq!(refused.len(), layers.len().min(LAYER_LIMIT));
                }
            }
        }
    }
    for required in unforgeable() {
        if let Ok(accepted) = verify(&required, &image, MANIFEST, &layers) {
            panic!("accepted without the Rekor or CA key: {accepted:?}");
        }
    }
});
