//! Signatures pushed as OCI 1.1 referrers (issue 49): `cosign sign --registry-referrers-mode=
//! oci-1-1` attaches the signature manifest to the image as a referrer instead of the tag
//! `sha256-<hex>.sig`. Debian's docker-registry serves no referrers API, so cosign keeps the
//! referrers' index at the fallback tag `sha256-<hex>`, as the distribution spec has it; cri-imaged
//! reads the API where a registry serves it (unit-tested on a registry of the test's own) and that
//! tag where it does not. On a real containerd, with `cosign verify --experimental-oci11` as the
//! oracle: a referrer signed by the policy's key is let in, one signed by another key and an image
//! with no signature at all are refused with their reasons, through EnsureImageExists and CRI
//! PullImage, by grpcio and grpc-js.

mod support;

use serde_json::json;
use support::{
    cosign::{cosign, cosign_accepts_referrer, key_pair, sign_as_referrer},
    signed_pulls::{daemon_with_policy, judged_by_each_client},
    stack::LocalStack,
};

#[tokio::test]
async fn signatures_attached_as_referrers_are_found_and_judged_as_cosign_judges_them() {
    let Some(cosign) = cosign() else { return };
    let Some(stack) = LocalStack::start() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let (ours, theirs) = (key_pair(&cosign, &dir.path().join("ours")), key_pair(&cosign, &dir.path().join("theirs")));
    let signed = stack.seed("ref/signed:v1", "signed as a referrer");
    sign_as_referrer(&cosign, &ours, &format!("{}@{signed}", stack.image("ref/signed")));
    let other = stack.seed("ref/otherkey:v1", "signed by another key as a referrer");
    sign_as_referrer(&cosign, &theirs, &format!("{}@{other}", stack.image("ref/otherkey")));
    stack.seed("ref/unsigned:v1", "not signed");

    let cases = [
        ("signed", true, ""),
        ("otherkey", false, "not signed by the policy's ECDSA P-256 key"),
        ("unsigned", false, "none among its referrers"),
    ];
    for (name, expected, _) in cases {
        let image = stack.image(&format!("ref/{name}:v1"));
        assert_eq!(cosign_accepts_referrer(&cosign, &ours, &image), expected, "cosign's verdict on {name}");
    }

    let policy = json!({
        "default": [{ "type": "reject" }],
        "transports": { "docker": { format!("{}/ref", stack.registry): [{
            "type": "sigstoreSigned",
            "keyPath": ours.join("cosign.pub"),
            "signedIdentity": { "type": "matchRepository" },
        }] } }
    });
    let daemon = daemon_with_policy(dir.path(), &stack, &policy).await;

    let cases: Vec<_> = cases
        .iter()
        .map(|&(name, expected, reason)| (stack.image(&format!("ref/{name}:v1")), expected, reason))
        .collect();
    judged_by_each_client(&daemon.socket, &cases).await;
}
