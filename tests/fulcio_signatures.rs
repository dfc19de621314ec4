//! Certificate (keyless) signatures and Rekor's timestamps (issue 49): a `sigstoreSigned`
//! requirement with `fulcio` and `rekorPublicKeyPath`, or a key with `rekorPublicKeyPath`. The
//! CA, the certificates and the Rekor key are made by openssl in the test (tests/support/
//! sigstore_pki.rs), the bundles signed by that Rekor key. First the verifier alone, case by case
//! with the reason a person reads; then on a real containerd through the cri-imaged binary, with
//! `cosign verify` (its Rekor key from SIGSTORE_REKOR_PUBLIC_KEY, offline) as the oracle.

mod support;

use std::{net::SocketAddr, path::Path};

use cri_imaged::{
    policy::{
        SigstoreSigned,
        sigstore::{Layer, LayerKind, verify},
    },
    reference::ImageReference,
};
use serde_json::{Value, json};
use support::{
    cosign::{cosign, key_pair as key_pair_cosign, run_cosign_with, sign_with_certificate},
    registry_push::{fetch, push_raw, sha256_digest},
    signed_pulls::{daemon_with_policy, judged_by_each_client},
    sigstore_pki::{Fulcio, Issued, Rekor, key_pair, now, payload, requirement, sign},
    stack::LocalStack,
};

const EMAIL: &str = "builder@example.com";
const ISSUER: &str = "https://issuer.example.com";
const REPOSITORY: &str = "registry.example.com/team/app";
const DIGEST: &str = "sha256:a8e87c3b20f50688f5156a664736f33dcc8a81e83c63156df15bb00d01f2c758";
const CODE_SIGNING: &str = "codeSigning";

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).expect("a file the test made")
}

fn fulcio_requirement(ca: &Path, rekor: &Path, (email, issuer): (&str, &str)) -> SigstoreSigned {
    requirement(json!({
        "fulcio": { "caPath": ca, "oidcIssuer": issuer, "subjectEmail": email },
        "rekorPublicKeyPath": rekor,
        "signedIdentity": { "type": "matchRepository" },
    }))
}

/// A signature layer as cosign pushes it: the payload's digest and size, and the annotations.
fn layer(
    payload: &[u8],
    signature: &str,
    certificate: Option<&str>,
    chain: Option<&str>,
    bundle: Option<&str>,
) -> Layer {
    Layer {
        kind: LayerKind::Cosign,
        digest: sha256_digest(payload),
        size: payload.len() as u64,
        signature: Some(signature.to_owned()),
        certificate: certificate.map(str::to_owned),
        chain: chain.map(str::to_owned),
        bundle: bundle.map(str::to_owned),
    }
}

/// A certificate signature of `payload` by `issued`, logged by `rekor` at `time`.
fn certificate_signed(issued: &Issued, chain: &str, rekor: &Rekor, payload: &[u8], time: i64) -> Layer {
    let signature = sign(&issued.key, payload);
    let certificate = read(&issued.cert);
    let bundle = rekor.bundle(&certificate, &signature, payload, time);
    layer(payload, &signature, Some(&certificate), Some(chain), Some(&bundle))
}

/// The verdict, or the reason, on `layers` for the test image.
fn verdict(requirement: &SigstoreSigned, layers: Vec<(Layer, Vec<u8>)>) -> Result<String, String> {
    let image = ImageReference::parse_normalized(&format!("{REPOSITORY}:v1")).expect("a reference");
    verify(requirement, &image, DIGEST, &layers).map(|accepted| accepted.key).map_err(|rejected| rejected.to_string())
}

/// Every case of a certificate signature, each with what a person reads: only a certificate
/// from the policy's CA, for code signing, naming the policy's issuer and e-mail, valid when
/// Rekor (the policy's key) logged this very signature of this payload, is accepted.
#[test]
fn a_certificate_signature_is_accepted_only_as_issued_named_and_logged() {
    if support::process::require_tool("openssl").is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (fulcio, stranger) = (Fulcio::new(dir.path(), "fulcio"), Fulcio::new(dir.path(), "stranger"));
    let (rekor, other_rekor) = (Rekor::new(dir.path(), "rekor"), Rekor::new(dir.path(), "other-rekor"));
    let chain = read(&fulcio.ca.cert);
    let signed = payload(REPOSITORY, DIGEST);
    let ours = fulcio.issue(dir.path(), "ours", (EMAIL, ISSUER), CODE_SIGNING);
    let policy = fulcio_requirement(&fulcio.ca.cert, &rekor.public, (EMAIL, ISSUER));
    let good = certificate_signed(&ours, &chain, &rekor, &signed, now());
    assert_eq!(
        verdict(&policy, vec![(good.clone(), signed.clone())]),
        Ok(format!("certificate for {EMAIL:?} (OIDC issuer {ISSUER:?})"))
    );

    let refused =
        |policy: &SigstoreSigned, layer: Layer| verdict(policy, vec![(layer, signed.clone())]).expect_err("refused");
    // The policy's identity, other than the certificate's.
    let other_email = fulcio_requirement(&fulcio.ca.cert, &rekor.public, ("else@example.com", ISSUER));
    assert!(refused(&other_email, good.clone()).contains("do not include the policy's subjectEmail"));
    let other_issuer = fulcio_requirement(&fulcio.ca.cert, &rekor.public, (EMAIL, "https://elsewhere.example"));
    assert!(refused(&other_issuer, good.clone()).contains("OIDC issuer is \"https://issuer.example.com\""));
    // Issued by another CA, or for another use.
    let foreign = stranger.issue(dir.path(), "foreign", (EMAIL, ISSUER), CODE_SIGNING);
    let reason = refused(&policy, certificate_signed(&foreign, &read(&stranger.ca.cert), &rekor, &signed, now()));
    assert!(reason.contains("does not chain to the policy's fulcio CA"), "{reason}");
    let server = fulcio.issue(dir.path(), "server", (EMAIL, ISSUER), "serverAuth");
    let reason = refused(&policy, certificate_signed(&server, &chain, &rekor, &signed, now()));
    assert!(reason.contains("does not chain to the policy's fulcio CA for code signing"), "{reason}");
    // Logged after the certificate expired (a day), or before it was issued.
    for (when, time) in [("after", now() + 3 * 86_400), ("before", now() - 3 * 86_400)] {
        let reason = refused(&policy, certificate_signed(&ours, &chain, &rekor, &signed, time));
        assert!(
            reason.contains("does not chain") && (reason.contains("Expired") || reason.contains("NotValidYet")),
            "{when}: {reason}"
        );
    }
    // Rekor's timestamp: absent, by another key, of another signature or payload.
    let mut unlogged = good.clone();
    unlogged.bundle = None;
    assert!(refused(&policy, unlogged).contains("no Rekor bundle"));
    let signature = good.signature.clone().expect("signed");
    let certificate = read(&ours.cert);
    let mut by_other = good.clone();
    by_other.bundle = Some(other_rekor.bundle(&certificate, &signature, &signed, now()));
    assert!(refused(&policy, by_other).contains("not signed by the policy's Rekor key"));
    let mut of_other_payload = good.clone();
    of_other_payload.bundle = Some(rekor.bundle(&certificate, &signature, b"another payload", now()));
    assert!(refused(&policy, of_other_payload).contains("of another payload"));
    let mut of_other_signature = good.clone();
    of_other_signature.bundle = Some(rekor.bundle(&certificate, &sign(&ours.key, b"x"), &signed, now()));
    assert!(refused(&policy, of_other_signature).contains("of another signature"));
    // The certificate swapped for another the CA issued to the same identity: its key did not
    // sign, and Rekor logged the first.
    let twin = fulcio.issue(dir.path(), "twin", (EMAIL, ISSUER), CODE_SIGNING);
    let mut swapped = good.clone();
    swapped.certificate = Some(read(&twin.cert));
    assert!(refused(&policy, swapped).contains("names another signer"));
    // No certificate at all: a key signature under a fulcio requirement.
    let mut keyed = good;
    keyed.certificate = None;
    assert!(refused(&policy, keyed).contains("no certificate"));
}

/// A key with `rekorPublicKeyPath`: the key's signature counts only with Rekor's timestamp of it.
#[test]
fn a_key_signature_under_a_rekor_key_needs_its_timestamp() {
    if support::process::require_tool("openssl").is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (key, public) = key_pair(dir.path(), "signer");
    let rekor = Rekor::new(dir.path(), "rekor");
    let policy = requirement(json!({
        "keyPath": public,
        "rekorPublicKeyPath": rekor.public,
        "signedIdentity": { "type": "matchRepository" },
    }));
    let signed = payload(REPOSITORY, DIGEST);
    let signature = sign(&key, &signed);
    let bundle = rekor.bundle(&read(&public), &signature, &signed, now());
    let logged = layer(&signed, &signature, None, None, Some(&bundle));
    assert!(verdict(&policy, vec![(logged, signed.clone())]).is_ok());
    let unlogged = layer(&signed, &signature, None, None, None);
    let reason = verdict(&policy, vec![(unlogged, signed.clone())]).expect_err("refused");
    assert!(reason.contains("no Rekor bundle"), "{reason}");
}

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

/// Pushes `layer` (with `payload`) as the signature of `digest` in `repository`, as cosign would.
fn push_signature(registry: SocketAddr, repository: &str, digest: &str, layer: &Layer, payload: &[u8]) {
    let config = br#"{"architecture":"","os":"","config":{},"rootfs":{"type":"layers","diff_ids":[]}}"#;
    let mut annotations = json!({ "dev.cosignproject.cosign/signature": layer.signature });
    for (name, value) in [
        ("dev.sigstore.cosign/certificate", &layer.certificate),
        ("dev.sigstore.cosign/chain", &layer.chain),
        ("dev.sigstore.cosign/bundle", &layer.bundle),
    ] {
        if let Some(value) = value {
            annotations[name] = json!(value);
        }
    }
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha256_digest(config), "size": config.len() },
        "layers": [{
            "mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
            "digest": layer.digest, "size": layer.size, "annotations": annotations,
        }],
    });
    let tag = format!("sha256-{}.sig", digest.trim_start_matches("sha256:"));
    let body = serde_json::to_vec(&manifest).expect("json");
    push_raw(registry, repository, &tag, &[config, payload], &body, OCI_MANIFEST).expect("push signature");
}

/// Adds to the signature cosign pushed for `digest` in `repository` the Rekor bundle `rekor`
/// makes for it (its signature, certificate and payload, as cosign pushed them).
fn add_rekor_bundle(registry: SocketAddr, repository: &str, digest: &str, rekor: &Rekor) {
    let tag = format!("sha256-{}.sig", digest.trim_start_matches("sha256:"));
    let (status, body) = fetch(registry, &format!("/v2/{repository}/manifests/{tag}"), OCI_MANIFEST).expect("GET");
    assert_eq!(status, 200, "cosign's signature manifest");
    let mut manifest: Value = serde_json::from_slice(&body).expect("a manifest");
    let layer = &manifest["layers"][0];
    let blob = format!("/v2/{repository}/blobs/{}", layer["digest"].as_str().expect("a digest"));
    let (status, payload) = fetch(registry, &blob, "*/*").expect("GET payload");
    assert_eq!(status, 200, "cosign's payload");
    let annotation = |name: &str| layer["annotations"][name].as_str().expect(name).to_owned();
    let signature = annotation("dev.cosignproject.cosign/signature");
    let certificate = annotation("dev.sigstore.cosign/certificate");
    let bundle = rekor.bundle(&certificate, &signature, &payload, now());
    manifest["layers"][0]["annotations"]["dev.sigstore.cosign/bundle"] = json!(bundle);
    let body = serde_json::to_vec(&manifest).expect("json");
    push_raw(registry, repository, &tag, &[], &body, OCI_MANIFEST).expect("push the signature again");
}

/// cosign's verdict on a certificate signature of `image`: the CA as its chain, the identity
/// required, Rekor's key from the environment, no network (certificates carry no SCT here).
fn cosign_accepts_certificate(cosign: &Path, dir: &Path, image: &str, ca: &Path, rekor: &Path) -> bool {
    let args = [
        "verify",
        "--allow-http-registry",
        "--certificate-identity",
        EMAIL,
        "--certificate-oidc-issuer",
        ISSUER,
        "--certificate-chain",
        ca.to_str().expect("utf-8"),
        "--insecure-ignore-sct",
        image,
    ];
    let rekor = rekor.to_str().expect("utf-8");
    run_cosign_with(cosign, dir, &args, &[("SIGSTORE_REKOR_PUBLIC_KEY", rekor)]).0
}

/// On a real containerd: a namespace whose policy asks for the builder's certificate lets in the
/// image it signed (logged by Rekor) through EnsureImageExists and CRI PullImage, and refuses,
/// with the kubelet's reason, one signed by a certificate for someone else and one whose
/// signature Rekor never logged; it lets in cosign's own certificate signature too. cosign agrees
/// on all four.
#[tokio::test]
async fn cosign_and_cri_imaged_agree_on_certificate_signatures_at_the_node() {
    let Some(cosign) = cosign() else { return };
    let Some(stack) = LocalStack::start() else { return };
    let registry: SocketAddr = stack.registry.parse().expect("a loopback address");
    let dir = tempfile::tempdir().expect("tempdir");
    let fulcio = Fulcio::new(dir.path(), "fulcio");
    let rekor = Rekor::new(dir.path(), "rekor");
    let chain = read(&fulcio.ca.cert);
    let builder = fulcio.issue(dir.path(), "builder", (EMAIL, ISSUER), CODE_SIGNING);
    let intruder = fulcio.issue(dir.path(), "intruder", ("intruder@example.com", ISSUER), CODE_SIGNING);

    let repository = |name: &str| format!("{}/keyless/{name}", stack.registry);
    let mut cases = Vec::new();
    for (name, issued, logged, expected, reason) in [
        ("signed", &builder, true, true, ""),
        ("intruder", &intruder, true, false, "do not include the policy's subjectEmail"),
        ("unlogged", &builder, false, false, "no Rekor bundle"),
    ] {
        let digest = stack.seed(&format!("keyless/{name}:v1"), name);
        let signed = payload(&repository(name), &digest);
        let mut layer = certificate_signed(issued, &chain, &rekor, &signed, now());
        if !logged {
            layer.bundle = None;
        }
        push_signature(registry, &format!("keyless/{name}"), &digest, &layer, &signed);
        let image = format!("{}:v1", repository(name));
        let oracle = cosign_accepts_certificate(&cosign, dir.path(), &image, &fulcio.ca.cert, &rekor.public);
        assert_eq!(oracle, expected, "cosign's verdict on {name}");
        cases.push((image, expected, reason));
    }
    // cosign's own certificate signature (`cosign sign --certificate --certificate-chain`, its key
    // certified by the test Fulcio), with Rekor's timestamp added: offline, cosign logs nothing.
    let keys = key_pair_cosign(&cosign, &dir.path().join("cosign-signer"));
    let certified = fulcio.certify(dir.path(), "cosign-signer", (EMAIL, ISSUER), &keys.join("cosign.pub"));
    let digest = stack.seed("keyless/cosign:v1", "signed by cosign with a certificate");
    let at_digest = format!("{}@{digest}", repository("cosign"));
    sign_with_certificate(&cosign, &keys, (&certified, &fulcio.ca.cert), &at_digest);
    add_rekor_bundle(registry, "keyless/cosign", &digest, &rekor);
    let image = format!("{}:v1", repository("cosign"));
    assert!(cosign_accepts_certificate(&cosign, dir.path(), &image, &fulcio.ca.cert, &rekor.public));
    cases.push((image, true, ""));

    let policy = json!({
        "default": [{ "type": "reject" }],
        "transports": { "docker": { format!("{}/keyless", stack.registry): [{
            "type": "sigstoreSigned",
            "fulcio": { "caPath": fulcio.ca.cert, "oidcIssuer": ISSUER, "subjectEmail": EMAIL },
            "rekorPublicKeyPath": rekor.public,
            "signedIdentity": { "type": "matchRepository" },
        }] } }
    });
    let daemon = daemon_with_policy(dir.path(), &stack, &policy).await;

    judged_by_each_client(&daemon.socket, &cases).await;
}
