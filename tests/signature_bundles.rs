//! Signatures as Sigstore bundles (v0.3) attached as OCI 1.1 referrers, as cosign 3's `cosign sign`
//! makes them: a DSSE envelope whose in-toto statement, of predicate type
//! `https://sigstore.dev/cosign/sign/v1`, names the image's digest as its subject. cosign 2.5 makes
//! the same bundle with `cosign attest --new-bundle-format` and judges it with `cosign
//! verify-attestation`, the oracle here. Debian's docker-registry serves no referrers API, so the
//! referrers' index is at the fallback tag `sha256-<hex>`. On a real containerd: a bundle signed by
//! the policy's key is let in, also where cosign's tag holds another key's signature; one signed
//! by another key, an attestation of another predicate type
//! by the policy's key (an attestation is not a signature), an image with no signature and a bundle
//! of another image's digest attached to this one are refused with their reasons, through
//! EnsureImageExists and CRI PullImage, by grpcio and grpc-js. Then bundles cosign 2.5 cannot make
//! offline, made by the test: keyless ones and ones Rekor logged, each judged by cosign too.

mod support;

use std::net::SocketAddr;

use serde_json::{Value, json};
use support::{
    cosign::{
        SIGN_V1, attest_as_bundle, cosign, cosign_judges_bundle, cosign_judges_keyless_bundle,
        cosign_judges_logged_bundle, key_pair, sign as cosign_sign, sign_as_bundle,
    },
    registry_push::{fetch, push_raw, sha256_digest},
    signed_pulls::{daemon_with_policy, judged_by_each_client},
    sigstore_pki::{
        Fulcio, Rekor, certificate_bundle, dsse_bundle, key_pair as key_pair_pem, now, pae, sign, statement,
    },
    stack::LocalStack,
};

const EMAIL: &str = "builder@example.com";
const ISSUER: &str = "https://issuer.example.com";
const BUNDLE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";

/// The manifest at `reference` in `repository`, as JSON, and its size in bytes.
fn manifest(registry: SocketAddr, repository: &str, reference: &str, accept: &str) -> (Value, usize) {
    let (status, body) = fetch(registry, &format!("/v2/{repository}/manifests/{reference}"), accept).expect("GET");
    assert_eq!(status, 200, "{repository}:{reference}: {}", String::from_utf8_lossy(&body));
    (serde_json::from_slice(&body).expect("a manifest"), body.len())
}

/// Attaches to `image` (a digest in `repository`) the bundle cosign made for `signed`, in the same
/// repository: its referrer manifest, the subject changed, listed at `image`'s fallback tag.
fn attach_bundle_of(registry: SocketAddr, repository: &str, signed: &str, image: &str) {
    let (index, _) = manifest(registry, repository, &fallback(signed), OCI_INDEX);
    let (referrer, _) =
        manifest(registry, repository, index["manifests"][0]["digest"].as_str().expect("digest"), OCI_MANIFEST);
    push_referrer(registry, repository, image, referrer, &[]);
}

fn fallback(digest: &str) -> String {
    format!("sha256-{}", digest.trim_start_matches("sha256:"))
}

/// Pushes `referrer` (a manifest of a bundle) with `image` (a digest in `repository`) as its
/// subject, and `blobs`, then the index at `image`'s fallback tag listing it.
fn push_referrer(registry: SocketAddr, repository: &str, image: &str, mut referrer: Value, blobs: &[&[u8]]) {
    let (_, size) = manifest(registry, repository, image, OCI_MANIFEST);
    referrer["subject"] = json!({ "mediaType": OCI_MANIFEST, "digest": image, "size": size });
    let body = serde_json::to_vec(&referrer).expect("json");
    let digest =
        push_raw(registry, repository, &sha256_digest(&body), blobs, &body, OCI_MANIFEST).expect("push referrer");
    let entry = json!({ "mediaType": OCI_MANIFEST, "digest": digest, "size": body.len(), "artifactType": BUNDLE });
    let index = json!({ "schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [entry] });
    let body = serde_json::to_vec(&index).expect("json");
    push_raw(registry, repository, &fallback(image), &[], &body, OCI_INDEX).expect("push index");
}

#[tokio::test]
async fn sigstore_bundles_attached_as_referrers_are_judged_as_cosign_verify_attestation_judges_them() {
    let Some(cosign) = cosign() else { return };
    let Some(stack) = LocalStack::start() else { return };
    let registry: SocketAddr = stack.registry.parse().expect("a loopback address");
    let dir = tempfile::tempdir().expect("tempdir");
    let (ours, theirs) = (key_pair(&cosign, &dir.path().join("ours")), key_pair(&cosign, &dir.path().join("theirs")));
    let at = |name: &str, digest: &str| format!("{}@{digest}", stack.image(&format!("bundle/{name}")));
    let signed = stack.seed("bundle/signed:v1", "signed as a bundle");
    sign_as_bundle(&cosign, &ours, &at("signed", &signed));
    let other = stack.seed("bundle/otherkey:v1", "signed by another key as a bundle");
    sign_as_bundle(&cosign, &theirs, &at("otherkey", &other));
    let attested = stack.seed("bundle/provenance:v1", "attested, not signed");
    let provenance = r#"{"buildDefinition":{"buildType":"https://example.com/build"}}"#;
    attest_as_bundle(&cosign, &ours, &at("provenance", &attested), "https://slsa.dev/provenance/v1", provenance);
    stack.seed("bundle/unsigned:v1", "not signed");
    // Signed both ways: cosign's tag by another key, a bundle by ours (read since the tag's are
    // not enough).
    let both = stack.seed("bundle/both:v1", "signed both ways");
    cosign_sign(&cosign, &theirs, &at("both", &both));
    sign_as_bundle(&cosign, &ours, &at("both", &both));
    // Another image's bundle, by our key, attached to `moved` in the same repository.
    let (moved, x) = (stack.seed("bundle/moved:v1", "moved here"), stack.seed("bundle/moved:x", "signed for x"));
    sign_as_bundle(&cosign, &ours, &at("moved", &x));
    attach_bundle_of(registry, "bundle/moved", &x, &moved);

    // Each case, whether it goes in, why cosign refuses it (its words: each case is refused for the
    // reason it stands for, not a malformed artifact), and the reason a person reads from us.
    let cases = [
        ("signed", true, "", ""),
        ("both", true, "", ""),
        ("otherkey", false, "accepted signatures do not match threshold, Found: 0", "not signed by the policy's"),
        ("provenance", false, "none of the attestations matched the predicate type", "not a cosign signature"),
        ("unsigned", false, "no valid bundles exist in registry", "none among its referrers"),
        ("moved", false, "provided artifact digest does not match any digest in statement", "signed for another image"),
    ];
    for (name, expected, words, _) in cases {
        let image = stack.image(&format!("bundle/{name}:v1"));
        let (accepted, text) = cosign_judges_bundle(&cosign, &ours, &image);
        assert_eq!(accepted, expected, "cosign's verdict on {name}: {text}");
        assert!(text.contains(words), "cosign on {name}: {text}");
    }

    let policy = json!({
        "default": [{ "type": "reject" }],
        "transports": { "docker": { format!("{}/bundle", stack.registry): [{
            "type": "sigstoreSigned",
            "keyPath": ours.join("cosign.pub"),
            "signedIdentity": { "type": "matchRepository" },
        }] } }
    });
    let daemon = daemon_with_policy(dir.path(), &stack, &policy).await;

    let judged: Vec<_> = cases
        .iter()
        .map(|&(name, expected, _, reason)| (stack.image(&format!("bundle/{name}:v1")), expected, reason))
        .collect();
    judged_by_each_client(&daemon.socket, &judged).await;
}

/// Pushes `blob` (a Sigstore bundle) as a referrer of `image` (a digest in `repository`), as
/// cosign 3 does: a manifest of the bundle's artifact type, listed in the index at the fallback
/// tag.
fn push_bundle(registry: SocketAddr, repository: &str, image: &str, blob: &[u8]) {
    let empty = b"{}";
    let referrer = json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": BUNDLE,
        "config": { "mediaType": "application/vnd.oci.empty.v1+json", "digest": sha256_digest(empty), "size": 2 },
        "layers": [{ "mediaType": BUNDLE, "digest": sha256_digest(blob), "size": blob.len() }],
    });
    push_referrer(registry, repository, image, referrer, &[empty, blob]);
}

/// Bundles logged by Rekor, made by the test (cosign 2.5 makes none offline): Rekor's `dsse`
/// entry with its promise and an inclusion proof (which cosign reads and cri-imaged, as
/// containers/image, does not). cosign, given a trusted root of the test Fulcio and Rekor, is the
/// oracle. Keyless: the builder's bundle is let in; one for someone else, one from another CA,
/// and one logged by another Rekor are refused. A key with Rekor's key: a logged bundle is let
/// in, an unlogged one refused. cosign agrees on every one.
#[tokio::test]
async fn logged_bundles_are_judged_as_cosign_judges_them() {
    let Some(cosign) = cosign() else { return };
    let Some(stack) = LocalStack::start() else { return };
    let registry: SocketAddr = stack.registry.parse().expect("a loopback address");
    let dir = tempfile::tempdir().expect("tempdir");
    let (fulcio, stranger) = (Fulcio::new(dir.path(), "fulcio"), Fulcio::new(dir.path(), "stranger"));
    let (rekor, other_rekor) = (Rekor::new(dir.path(), "rekor"), Rekor::new(dir.path(), "other-rekor"));
    let root = dir.path().join("root.json");
    std::fs::write(&root, rekor.trusted_root(&fulcio.ca.cert).to_string()).expect("trusted root");
    let builder = fulcio.issue(dir.path(), "builder", (EMAIL, ISSUER), "codeSigning");
    let intruder = fulcio.issue(dir.path(), "intruder", ("intruder@example.com", ISSUER), "codeSigning");
    let foreign = stranger.issue(dir.path(), "foreign", (EMAIL, ISSUER), "codeSigning");

    let mut cases = Vec::new();
    for (name, issued, log, expected, reason) in [
        ("signed", &builder, &rekor, true, ""),
        ("intruder", &intruder, &rekor, false, "do not include the policy's subjectEmail"),
        ("foreign", &foreign, &rekor, false, "does not chain to the policy's fulcio CA"),
        ("otherlog", &builder, &other_rekor, false, "not signed by the policy's Rekor key"),
    ] {
        let repository = format!("keyless-bundle/{name}");
        let digest = stack.seed(&format!("{repository}:v1"), name);
        let blob = certificate_bundle(issued, log, &statement(None, &digest, SIGN_V1), now());
        push_bundle(registry, &repository, &digest, &blob);
        let image = stack.image(&format!("{repository}:v1"));
        let trusted = (root.as_path(), fulcio.ca.cert.as_path(), rekor.public.as_path());
        let (accepted, text) = cosign_judges_keyless_bundle(&cosign, dir.path(), &image, trusted, (EMAIL, ISSUER));
        assert_eq!(accepted, expected, "cosign's verdict on {name}: {text}");
        cases.push((image, expected, reason));
    }

    let (key, public) = key_pair_pem(dir.path(), "signer");
    for (name, logged, expected, reason) in
        [("logged", true, true, ""), ("unlogged", false, false, "the bundle has no Rekor entry")]
    {
        let repository = format!("logged-bundle/{name}");
        let digest = stack.seed(&format!("{repository}:v1"), name);
        let statement = statement(None, &digest, SIGN_V1);
        let signature = sign(&key, &pae(&statement));
        let public_pem = std::fs::read_to_string(&public).expect("the public key");
        let entries = if logged { vec![rekor.dsse_entry(&public_pem, &signature, &statement, now())] } else { vec![] };
        let blob = dsse_bundle(json!({ "publicKey": {}, "tlogEntries": entries }), &statement, &signature);
        push_bundle(registry, &repository, &digest, &blob);
        let image = stack.image(&format!("{repository}:v1"));
        let (accepted, text) =
            cosign_judges_logged_bundle(&cosign, dir.path(), &image, (&root, &public, &rekor.public));
        assert_eq!(accepted, expected, "cosign's verdict on {name}: {text}");
        cases.push((image, expected, reason));
    }

    let policy = json!({
        "default": [{ "type": "reject" }],
        "transports": { "docker": {
            format!("{}/keyless-bundle", stack.registry): [{
                "type": "sigstoreSigned",
                "fulcio": { "caPath": fulcio.ca.cert, "oidcIssuer": ISSUER, "subjectEmail": EMAIL },
                "rekorPublicKeyPath": rekor.public,
                "signedIdentity": { "type": "matchRepository" },
            }],
            format!("{}/logged-bundle", stack.registry): [{
                "type": "sigstoreSigned",
                "keyPath": public,
                "rekorPublicKeyPath": rekor.public,
                "signedIdentity": { "type": "matchRepository" },
            }],
        } }
    });
    let daemon = daemon_with_policy(dir.path(), &stack, &policy).await;
    judged_by_each_client(&daemon.socket, &cases).await;
}
