//! A Sigstore bundle as an image signature (issue 49), judged by the verifier alone, every case
//! made by the test: the envelope's signature by a policy key or by a certificate from the test
//! Fulcio, Rekor's `dsse` entry for it where the policy names Rekor's key, and the in-toto
//! statement read only after the signature verified: a cosign signature, of the manifest, naming
//! the repository (or nothing, as cosign 3 writes it). cosign's own bundles, and cosign's verdict
//! on them, are in tests/signature_bundles.rs.

mod support;

use cri_imaged::{
    policy::{
        SigstoreSigned,
        sigstore::{BUNDLE_MEDIA_TYPE, Layer, LayerKind, SIGN_PREDICATE_TYPE, verify},
    },
    reference::ImageReference,
};
use serde_json::{Value, json};
use support::{
    registry_push::sha256_digest,
    sigstore_pki::{
        Fulcio, Rekor, base64, certificate_bundle, dsse_bundle, key_pair, now, pae, requirement, sign, statement,
    },
};

const EMAIL: &str = "builder@example.com";
const ISSUER: &str = "https://issuer.example.com";
const REPOSITORY: &str = "registry.example.com/team/app";
const DIGEST: &str = "sha256:a8e87c3b20f50688f5156a664736f33dcc8a81e83c63156df15bb00d01f2c758";
const OTHER_DIGEST: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000001";

fn read(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).expect("a file the test made")
}

/// A bundle as the layer of a referrer manifest: its blob's digest and size.
fn layer(blob: &[u8]) -> Layer {
    Layer {
        kind: LayerKind::Bundle,
        digest: sha256_digest(blob),
        size: blob.len() as u64,
        signature: None,
        certificate: None,
        chain: None,
        bundle: None,
    }
}

/// The verdict (who signed), or the reason, on `blob` for `image`.
fn verdict(requirement: &SigstoreSigned, image: &str, blob: Vec<u8>) -> Result<String, String> {
    let image = ImageReference::parse_normalized(image).expect("a reference");
    let layers = [(layer(&blob), blob)];
    verify(requirement, &image, DIGEST, &layers).map(|accepted| accepted.key).map_err(|rejected| rejected.to_string())
}

fn with(mut bundle: Value, edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    edit(&mut bundle);
    bundle.to_string().into_bytes()
}

fn json(blob: &[u8]) -> Value {
    serde_json::from_slice(blob).expect("a bundle")
}

/// A keyless bundle: accepted only as issued to the policy's identity, for code signing, valid
/// when Rekor (the policy's key) logged this very signature of this statement.
#[test]
fn a_certificate_bundle_is_accepted_only_as_issued_named_and_logged() {
    if support::process::require_tool("openssl").is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (fulcio, stranger) = (Fulcio::new(dir.path(), "fulcio"), Fulcio::new(dir.path(), "stranger"));
    let (rekor, other_rekor) = (Rekor::new(dir.path(), "rekor"), Rekor::new(dir.path(), "other-rekor"));
    let ours = fulcio.issue(dir.path(), "ours", (EMAIL, ISSUER), "codeSigning");
    let policy = requirement(json!({
        "fulcio": { "caPath": fulcio.ca.cert, "oidcIssuer": ISSUER, "subjectEmail": EMAIL },
        "rekorPublicKeyPath": rekor.public,
        "signedIdentity": { "type": "matchRepository" },
    }));
    let image = format!("{REPOSITORY}:v1");
    let signed = statement(None, DIGEST, SIGN_PREDICATE_TYPE);
    let good = certificate_bundle(&ours, &rekor, &signed, now());
    assert_eq!(
        verdict(&policy, &image, good.clone()),
        Ok(format!("certificate for {EMAIL:?} (OIDC issuer {ISSUER:?})"))
    );

    let refused = |blob: Vec<u8>| verdict(&policy, &image, blob).expect_err("refused");
    let foreign = stranger.issue(dir.path(), "foreign", (EMAIL, ISSUER), "codeSigning");
    assert!(refused(certificate_bundle(&foreign, &rekor, &signed, now())).contains("does not chain to the policy's"));
    let intruder = fulcio.issue(dir.path(), "intruder", ("intruder@example.com", ISSUER), "codeSigning");
    let reason = refused(certificate_bundle(&intruder, &rekor, &signed, now()));
    assert!(reason.contains("do not include the policy's subjectEmail"), "{reason}");
    let reason = refused(certificate_bundle(&ours, &rekor, &signed, now() + 3 * 86_400));
    assert!(reason.contains("Expired"), "logged after the certificate expired: {reason}");
    let reason = refused(certificate_bundle(&ours, &other_rekor, &signed, now()));
    assert!(reason.contains("not signed by the policy's Rekor key"), "{reason}");
    let reason = refused(with(json(&good), |bundle| bundle["verificationMaterial"]["tlogEntries"] = json!([])));
    assert!(reason.contains("the bundle has no Rekor entry"), "{reason}");
    let reason = refused(with(json(&good), |bundle| {
        bundle["verificationMaterial"]["tlogEntries"][0]["kindVersion"] =
            json!({ "kind": "intoto", "version": "0.0.2" });
    }));
    // The kind is part of what the timestamp signed only through the body: the SET still
    // verifies, and the kind named outside it is refused.
    assert!(reason.contains("not a dsse 0.0.1"), "{reason}");
    // The log entry of another signature by the same certificate.
    let elsewhere = certificate_bundle(&ours, &rekor, &statement(None, OTHER_DIGEST, SIGN_PREDICATE_TYPE), now());
    let reason = refused(with(json(&good), |bundle| {
        bundle["verificationMaterial"]["tlogEntries"] = json(&elsewhere)["verificationMaterial"]["tlogEntries"].clone();
    }));
    assert!(reason.contains("of another signature"), "{reason}");
    // The statement swapped after signing: Rekor logged another (nor did the key sign this one).
    let reason = refused(with(json(&good), |bundle| {
        bundle["dsseEnvelope"]["payload"] = json!(base64(&statement(None, OTHER_DIGEST, SIGN_PREDICATE_TYPE)));
    }));
    assert!(reason.contains("of another payload"), "{reason}");
    let reason = refused(with(json(&good), |bundle| bundle["verificationMaterial"] = json!({ "publicKey": {} })));
    assert!(reason.contains("no certificate"), "{reason}");
}

/// A key's bundle: the signature over the envelope's PAE by a policy key, then the statement's
/// claims: a cosign signature, of this manifest, for an identity `signedIdentity` accepts. With a
/// Rekor key, Rekor's entry of this signature is required.
#[test]
fn a_key_bundle_is_judged_by_its_signature_then_its_statement() {
    if support::process::require_tool("openssl").is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (key, public) = key_pair(dir.path(), "signer");
    let (other_key, _) = key_pair(dir.path(), "other");
    let rekor = Rekor::new(dir.path(), "rekor");
    let by = |key: &std::path::Path, statement: &[u8]| {
        dsse_bundle(json!({ "publicKey": { "hint": "" } }), statement, &sign(key, &pae(statement)))
    };
    let policy = |identity: Value| requirement(json!({ "keyPath": public, "signedIdentity": identity }));
    let repository = json!({ "type": "matchRepository" });
    let tagged = format!("{REPOSITORY}:v1");
    let nameless = statement(None, DIGEST, SIGN_PREDICATE_TYPE);
    assert!(verdict(&policy(repository.clone()), &tagged, by(&key, &nameless)).is_ok());

    let refused = |identity: &Value, image: &str, blob: Vec<u8>| {
        verdict(&policy(identity.clone()), image, blob).expect_err("refused")
    };
    assert!(refused(&repository, &tagged, by(&other_key, &nameless)).contains("not signed by the policy's"));
    let provenance = statement(None, DIGEST, "https://slsa.dev/provenance/v1");
    let reason = refused(&repository, &tagged, by(&key, &provenance));
    assert!(reason.contains("https://slsa.dev/provenance/v1\" attestation, not a cosign signature"), "{reason}");
    let reason = refused(&repository, &tagged, by(&key, &statement(None, OTHER_DIGEST, SIGN_PREDICATE_TYPE)));
    assert!(reason.contains("signed for another image (sha256:000000000000…)"), "{reason}");
    // A statement naming its repository is held to it; one naming none claims the repository it
    // is attached in, so a rule naming another identity refuses it.
    let named = statement(Some("registry.example.com/team/other"), DIGEST, SIGN_PREDICATE_TYPE);
    assert!(refused(&repository, &tagged, by(&key, &named)).contains("signed for repository"));
    let exact = json!({ "type": "exactRepository", "dockerRepository": "registry.example.com/team/elsewhere" });
    assert!(refused(&exact, &tagged, by(&key, &nameless)).contains("signed for repository"));
    // As cosign's legacy payload, a repository without a tag: the default rule refuses it.
    let default = json!({ "type": "matchRepoDigestOrExact" });
    for image in [tagged.clone(), format!("{REPOSITORY}@{DIGEST}")] {
        assert!(refused(&default, &image, by(&key, &nameless)).contains("without a tag"), "{image}");
    }
    // What is not a DSSE signature of an in-toto statement.
    let message = with(json(&by(&key, &nameless)), |bundle| {
        bundle["messageSignature"] = json!({ "messageDigest": {}, "signature": "" });
    });
    assert!(refused(&repository, &tagged, message).contains("signs a blob (messageSignature)"));
    let other_type = with(json(&by(&key, &nameless)), |bundle| bundle["mediaType"] = json!("application/json"));
    assert!(refused(&repository, &tagged, other_type).contains("not a Sigstore bundle's"));

    // With a Rekor key: the entry of this very signature, by Rekor's key.
    let logged_policy = requirement(json!({
        "keyPath": public, "rekorPublicKeyPath": rekor.public, "signedIdentity": repository,
    }));
    let signature = sign(&key, &pae(&nameless));
    let entry = rekor.dsse_entry(&read(&public), &signature, &nameless, now());
    let logged = dsse_bundle(json!({ "tlogEntries": [entry] }), &nameless, &signature);
    assert!(verdict(&logged_policy, &tagged, logged).is_ok());
    let reason = verdict(&logged_policy, &tagged, by(&key, &nameless)).expect_err("unlogged");
    assert!(reason.contains("the bundle has no Rekor entry"), "{reason}");
    assert_eq!(json(&by(&key, &nameless))["mediaType"], BUNDLE_MEDIA_TYPE);
}
