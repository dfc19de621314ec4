//! Signatures as Sigstore bundles (v0.3) attached as OCI 1.1 referrers, as cosign 3's `cosign sign`
//! makes them: a DSSE envelope whose in-toto statement, of predicate type
//! `https://sigstore.dev/cosign/sign/v1`, names the image's digest as its subject. cosign 2.5 makes
//! the same bundle with `cosign attest --new-bundle-format` and judges it with `cosign
//! verify-attestation`, the oracle here. Debian's docker-registry serves no referrers API, so the
//! referrers' index is at the fallback tag `sha256-<hex>`. On a real containerd: a bundle signed by
//! the policy's key is let in; one signed by another key, an attestation of another predicate type
//! by the policy's key (an attestation is not a signature), an image with no signature and a bundle
//! of another image's digest attached to this one are refused with their reasons, through
//! EnsureImageExists and CRI PullImage, by grpcio and grpc-js.

mod support;

use std::{net::SocketAddr, path::Path};

use serde_json::{Value, json};
use support::{
    clients::{Answer, Call, Client},
    cosign::{attest_as_bundle, cosign, cosign_judges_bundle, key_pair, sign_as_bundle},
    process::DaemonProcess,
    registry_push::{fetch, push_raw, sha256_digest},
    stack::LocalStack,
};

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
    let fallback = |digest: &str| format!("sha256-{}", digest.trim_start_matches("sha256:"));
    let (index, _) = manifest(registry, repository, &fallback(signed), OCI_INDEX);
    let (mut referrer, _) =
        manifest(registry, repository, index["manifests"][0]["digest"].as_str().expect("digest"), OCI_MANIFEST);
    let (_, size) = manifest(registry, repository, image, OCI_MANIFEST);
    referrer["subject"] = json!({ "mediaType": OCI_MANIFEST, "digest": image, "size": size });
    let body = serde_json::to_vec(&referrer).expect("json");
    let digest =
        push_raw(registry, repository, &sha256_digest(&body), &[], &body, OCI_MANIFEST).expect("push referrer");
    let entry = json!({ "mediaType": OCI_MANIFEST, "digest": digest, "size": body.len(), "artifactType": BUNDLE });
    let index = json!({ "schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [entry] });
    let body = serde_json::to_vec(&index).expect("json");
    push_raw(registry, repository, &fallback(image), &[], &body, OCI_INDEX).expect("push index");
}

async fn run(client: Client, socket: &Path, calls: Vec<Call>) -> Vec<Answer> {
    let socket = socket.to_owned();
    tokio::task::spawn_blocking(move || client.run(&socket, &calls)).await.expect("client task")
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
    // Another image's bundle, by our key, attached to `moved` in the same repository.
    let (moved, x) = (stack.seed("bundle/moved:v1", "moved here"), stack.seed("bundle/moved:x", "signed for x"));
    sign_as_bundle(&cosign, &ours, &at("moved", &x));
    attach_bundle_of(registry, "bundle/moved", &x, &moved);

    // Each case, whether it goes in, why cosign refuses it (its words: each case is refused for the
    // reason it stands for, not a malformed artifact), and the reason a person reads from us.
    let cases = [
        ("signed", true, "", ""),
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
    let file = dir.path().join("policy.json");
    std::fs::write(&file, policy.to_string()).expect("policy");
    let flags = ["--signature-policy", file.to_str().expect("utf-8")];
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &flags).await;

    let clients = Client::available();
    for (i, &client) in clients.iter().enumerate() {
        for (name, expected, _, reason) in cases {
            let image = stack.image(&format!("bundle/{name}:v1"));
            let pod = json!({ "namespace": "prod", "name": "web", "uid": format!("{name}-{i}") });
            let ensure = Call::new(
                "imagemanager.v1.ImageManager/EnsureImageExists",
                json!({ "image": image, "pull_policy": "IF_NOT_PRESENT", "pod": pod }),
            );
            let sandbox = json!({ "metadata": { "name": "web", "uid": format!("{name}-{i}"), "namespace": "prod" } });
            let pull = Call::new(
                "runtime.v1.ImageService/PullImage",
                json!({ "image": { "image": image }, "sandbox_config": sandbox }),
            );
            let answers = run(client, &daemon.socket, vec![ensure, pull]).await;
            if expected {
                assert!(answers.iter().all(|answer| answer.code() == "OK"), "{client:?} {name}: {answers:?}");
                continue;
            }
            let Answer::Error { code, message } = &answers[0] else { panic!("{client:?} let {name} in") };
            assert_eq!(code, "PERMISSION_DENIED", "{client:?} {name}: {message}");
            assert!(message.contains(reason), "{client:?} {name}: {message}");
            let Answer::Error { code, message } = &answers[1] else { panic!("{client:?} CRI let {name} in") };
            assert_eq!(code, "UNKNOWN", "{client:?} {name}: {message}");
            assert!(message.starts_with("SignatureValidationFailed: "), "{client:?} {name}: {message}");
        }
    }
    assert_eq!(clients.len(), 2, "grpcio and grpc-js both ran");
}
