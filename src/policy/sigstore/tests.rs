use base64::Engine as _;
use ring::{
    rand::SystemRandom,
    signature::{
        ECDSA_P256_SHA256_ASN1_SIGNING, ECDSA_P384_SHA384_ASN1_SIGNING, EcdsaKeyPair, Ed25519KeyPair, KeyPair,
    },
};

use super::*;
use crate::{
    policy::{PolicyFileError, SignedIdentity, SigstoreSigned, parse_with_keys},
    reference::ImageReference,
};

const REPOSITORY: &str = "registry.example.com/team/app";
/// The SHA-256 of `cri-imaged test manifest`: the manifest the signatures are for.
const MANIFEST: &str = "sha256:a8e87c3b20f50688f5156a664736f33dcc8a81e83c63156df15bb00d01f2c758";
const OTHER_MANIFEST: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000001";

fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn image(reference: &str) -> ImageReference {
    ImageReference::parse_normalized(reference).expect("a reference")
}

/// A payload as cosign writes it: the repository without a tag.
fn payload(reference: &str, digest: &str) -> Vec<u8> {
    format!(
        r#"{{"critical":{{"identity":{{"docker-reference":"{reference}"}},"image":{{"docker-manifest-digest":"{digest}"}},"type":"cosign container image signature"}},"optional":null}}"#
    )
    .into_bytes()
}

/// A PEM `PUBLIC KEY` around `key`, after the DER of its SubjectPublicKeyInfo up to the key.
fn pem(spki_prefix: &[u8], key: &[u8]) -> String {
    let body = base64(&[spki_prefix, key].concat());
    let lines: Vec<&str> = body.as_bytes().chunks(64).map(|line| std::str::from_utf8(line).expect("ascii")).collect();
    format!("-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n", lines.join("\n"))
}

const P256_SPKI: &[u8] = &[
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce,
    0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];
const P384_SPKI: &[u8] = &[
    0x30, 0x76, 0x30, 0x10, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x05, 0x2b, 0x81, 0x04, 0x00,
    0x22, 0x03, 0x62, 0x00,
];
const ED25519_SPKI: &[u8] = &[0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00];

type Sign = Box<dyn Fn(&[u8]) -> Vec<u8>>;

/// A key pair made for the test: its public key's PEM, and signing.
struct Signer {
    pem: String,
    sign: Sign,
}

fn ecdsa(p384: bool) -> Signer {
    let rng = SystemRandom::new();
    let (algorithm, prefix) =
        if p384 { (&ECDSA_P384_SHA384_ASN1_SIGNING, P384_SPKI) } else { (&ECDSA_P256_SHA256_ASN1_SIGNING, P256_SPKI) };
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(algorithm, &rng).expect("generated");
    let pair = EcdsaKeyPair::from_pkcs8(algorithm, pkcs8.as_ref(), &rng).expect("read back");
    let pem = pem(prefix, pair.public_key().as_ref());
    Signer { pem, sign: Box::new(move |message| pair.sign(&rng, message).expect("signed").as_ref().to_vec()) }
}

fn ed25519() -> Signer {
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).expect("generated");
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("read back");
    let pem = pem(ED25519_SPKI, pair.public_key().as_ref());
    Signer { pem, sign: Box::new(move |message| pair.sign(message).as_ref().to_vec()) }
}

/// A `sigstoreSigned` requirement trusting `pems` (as `keyDatas`), with `identity` when given.
fn requirement(pems: &[&str], identity: Option<&str>) -> SigstoreSigned {
    let datas: Vec<String> = pems.iter().map(|pem| base64(pem.as_bytes())).collect();
    let mut json = serde_json::json!({"keyDatas": datas});
    if let Some(identity) = identity {
        json["signedIdentity"] = serde_json::from_str(identity).expect("an identity");
    }
    let mut signed: SigstoreSigned = serde_json::from_value(json).expect("a requirement");
    load_keys(&mut signed, &|_| Err("no files in this test".into())).expect("keys load");
    signed
}

const MATCH_REPOSITORY: Option<&str> = Some(r#"{"type": "matchRepository"}"#);

/// The layer cosign would push for `payload` signed `signature`.
fn layer(payload: &[u8], signature: &[u8]) -> Layer {
    let digest = ring::digest::digest(&ring::digest::SHA256, payload);
    let hex: String = digest.as_ref().iter().map(|byte| format!("{byte:02x}")).collect();
    Layer {
        kind: LayerKind::Cosign,
        digest: format!("sha256:{hex}"),
        size: payload.len() as u64,
        signature: Some(base64(signature)),
        certificate: None,
        chain: None,
        bundle: None,
    }
}

fn signed_by(signer: &Signer, payload: Vec<u8>) -> (Layer, Vec<u8>) {
    (layer(&payload, &(signer.sign)(&payload)), payload)
}

fn rejected(result: Result<Accepted, Rejected>) -> Rejected {
    result.expect_err("rejected")
}

/// The one reason of a single signature's refusal.
fn why(result: Result<Accepted, Rejected>) -> Why {
    match rejected(result) {
        Rejected::NoneVerified(refused) if refused.len() == 1 => refused[0].why.clone(),
        other => panic!("not one signature refused: {other:?}"),
    }
}

#[test]
fn a_signature_by_a_trusted_key_of_each_algorithm_cosign_makes_is_accepted() {
    for (algorithm, signer) in [("ECDSA P-256", ecdsa(false)), ("ECDSA P-384", ecdsa(true)), ("Ed25519", ed25519())] {
        let required = requirement(&[&signer.pem], MATCH_REPOSITORY);
        let signature = signed_by(&signer, payload(REPOSITORY, MANIFEST));
        let accepted =
            verify(&required, &image("registry.example.com/team/app:v1"), MANIFEST, std::slice::from_ref(&signature))
                .unwrap_or_else(|rejected| panic!("{algorithm}: {rejected}"));
        assert_eq!(accepted.key, required.keys[0].fingerprint());
        assert_eq!(accepted.key.len(), 16);
        assert_eq!((accepted.layer, accepted.identity), (signature.0.digest, format!("{REPOSITORY:?}")));
        assert_eq!(required.keys[0].algorithm().to_string(), algorithm);
    }
}

/// Vectors made once with openssl (testdata/README.md): an RSA key, and P-384 over both hashes.
#[test]
fn rsa_and_p384_signatures_made_by_openssl_verify() {
    let payload = include_bytes!("testdata/payload.json").to_vec();
    for (key, signature) in [
        (include_str!("testdata/rsa-2048.pub"), include_str!("testdata/rsa-2048.sig")),
        (include_str!("testdata/p384.pub"), include_str!("testdata/p384-sha256.sig")),
        (include_str!("testdata/p384.pub"), include_str!("testdata/p384-sha384.sig")),
    ] {
        let required = requirement(&[key], MATCH_REPOSITORY);
        let mut signed = layer(&payload, b"");
        signed.signature = Some(signature.trim().to_owned());
        let verdict = verify(&required, &image(&format!("{REPOSITORY}:v1")), MANIFEST, &[(signed, payload.clone())]);
        assert!(verdict.is_ok(), "{key}: {verdict:?}");
    }
    assert_eq!(
        requirement(&[include_str!("testdata/rsa-2048.pub")], None).keys[0].algorithm(),
        Algorithm::Rsa { bits: 2048 }
    );
}

#[test]
fn a_signature_by_another_key_is_refused_naming_the_trusted_one() {
    let (trusted, other) = (ecdsa(false), ecdsa(false));
    let required = requirement(&[&trusted.pem], MATCH_REPOSITORY);
    let signature = signed_by(&other, payload(REPOSITORY, MANIFEST));
    let verdict = verify(&required, &image(&format!("{REPOSITORY}:v1")), MANIFEST, &[signature]);
    let fingerprint = required.keys[0].fingerprint().to_owned();
    assert_eq!(why(verdict.clone()), Why::NoKey(format!("the policy's ECDSA P-256 key {fingerprint}")));
    assert!(rejected(verdict).to_string().starts_with("no signature verified: sha256:"));
}

#[test]
fn one_good_signature_among_bad_ones_is_enough() {
    let (trusted, other) = (ed25519(), ed25519());
    let required = requirement(&[&other.pem, &trusted.pem], MATCH_REPOSITORY);
    let stranger = ecdsa(false);
    let signatures =
        [signed_by(&stranger, payload(REPOSITORY, MANIFEST)), signed_by(&trusted, payload(REPOSITORY, MANIFEST))];
    let accepted = verify(&required, &image(&format!("{REPOSITORY}:v1")), MANIFEST, &signatures).expect("accepted");
    assert_eq!(accepted.key, required.keys[1].fingerprint(), "the second key verified it");
}

#[test]
fn a_signature_for_another_digest_is_refused_naming_it() {
    let signer = ecdsa(false);
    let required = requirement(&[&signer.pem], MATCH_REPOSITORY);
    let signature = signed_by(&signer, payload(REPOSITORY, OTHER_MANIFEST));
    let verdict = verify(&required, &image(&format!("{REPOSITORY}:v1")), MANIFEST, &[signature]);
    assert_eq!(why(verdict.clone()), Why::OtherImage("sha256:000000000000…".into()));
    let message = rejected(verdict).to_string();
    assert!(message.ends_with(": signed for another image (sha256:000000000000…)"), "{message}");
}

#[test]
fn a_tampered_payload_no_longer_verifies() {
    let signer = ecdsa(false);
    let required = requirement(&[&signer.pem], MATCH_REPOSITORY);
    let (signed, _) = signed_by(&signer, payload(REPOSITORY, OTHER_MANIFEST));
    // The registry swaps the payload and the layer's digest with it, keeping the signature.
    let tampered = payload(REPOSITORY, MANIFEST);
    let mut layer_now = layer(&tampered, b"");
    layer_now.signature = signed.signature;
    let verdict = verify(&required, &image(&format!("{REPOSITORY}:v1")), MANIFEST, &[(layer_now, tampered)]);
    assert!(matches!(why(verdict), Why::NoKey(_)));
}

#[test]
fn a_payload_that_is_not_the_layers_blob_is_refused_before_any_signature_check() {
    let signer = ecdsa(false);
    let required = requirement(&[&signer.pem], MATCH_REPOSITORY);
    let (signed, good) = signed_by(&signer, payload(REPOSITORY, MANIFEST));
    let mut other = good.clone();
    other[0] = b' ';
    let verdict = verify(&required, &image(&format!("{REPOSITORY}:v1")), MANIFEST, &[(signed.clone(), other)]);
    assert_eq!(why(verdict), Why::PayloadDigest);
    let verdict = verify(&required, &image(&format!("{REPOSITORY}:v1")), MANIFEST, &[(signed, good[1..].to_vec())]);
    assert_eq!(why(verdict), Why::PayloadSize { stated: good.len() as u64, read: good.len() - 1 });
}

#[test]
fn a_signed_payload_of_another_type_or_shape_is_refused() {
    let signer = ed25519();
    let required = requirement(&[&signer.pem], MATCH_REPOSITORY);
    let typed = String::from_utf8(payload(REPOSITORY, MANIFEST)).expect("utf-8");
    for (payload, says) in [
        (typed.replace("cosign container image signature", "atomic container signature"), "its type is"),
        (typed.replace(r#""optional":null"#, r#""optional":null,"extra":1"#), "unknown field `extra`"),
        (typed.replace(r#","optional":null"#, ""), "missing field `optional`"),
        (typed.replace(r#""type""#, r#""identity2":{},"type""#), "unknown field `identity2`"),
        (typed.replace(r#""optional":null"#, r#""optional":[]"#), "optional is not a JSON object"),
        (typed.replace(r#""optional":null"#, r#""optional":{"timestamp":1.5}"#), "optional.timestamp"),
        (typed.replace(r#""optional":null"#, r#""optional":{"creator":7}"#), "optional.creator"),
        (format!("[{typed}]"), "the payload is not a JSON object"),
    ] {
        let verdict = verify(
            &required,
            &image(&format!("{REPOSITORY}:v1")),
            MANIFEST,
            &[signed_by(&signer, payload.into_bytes())],
        );
        let reason = why(verdict).to_string();
        assert!(reason.contains(says), "{reason}\n  not: {says}");
    }
    let annotated =
        typed.replace(r#""optional":null"#, r#""optional":{"creator":"ci","timestamp":1700000000,"commit":"abc"}"#);
    assert!(
        verify(&required, &image(&format!("{REPOSITORY}:v1")), MANIFEST, &[signed_by(&signer, annotated.into_bytes())])
            .is_ok()
    );
}

#[test]
fn the_default_identity_refuses_cosigns_repository_only_claim_and_says_what_accepts_it() {
    let signer = ecdsa(false);
    let required = requirement(&[&signer.pem], None);
    let verdict = verify(
        &required,
        &image(&format!("{REPOSITORY}:v1")),
        MANIFEST,
        &[signed_by(&signer, payload(REPOSITORY, MANIFEST))],
    );
    let reason = why(verdict).to_string();
    assert!(
        reason.contains("without a tag, as cosign signs: only a signedIdentity of matchRepository or exactRepository"),
        "{reason}"
    );
    let tagged = payload(&format!("{REPOSITORY}:v1"), MANIFEST);
    assert!(verify(&required, &image(&format!("{REPOSITORY}:v1")), MANIFEST, &[signed_by(&signer, tagged)]).is_ok());
}

/// containers/image's `policy_reference_match.go`, each kind accepting and refusing.
#[test]
fn each_signed_identity_accepts_what_containers_image_accepts() {
    let digest = format!("{REPOSITORY}@{MANIFEST}");
    let cases: &[(&str, &str, &str, bool)] = &[
        (
            r#"{"type": "matchRepoDigestOrExact"}"#,
            "registry.example.com/team/app:v1",
            "registry.example.com/team/app:v1",
            true,
        ),
        (
            r#"{"type": "matchRepoDigestOrExact"}"#,
            "registry.example.com/team/app:v1",
            "registry.example.com/team/app:v2",
            false,
        ),
        (r#"{"type": "matchRepoDigestOrExact"}"#, &digest, "registry.example.com/team/app:v2", true),
        (r#"{"type": "matchRepoDigestOrExact"}"#, &digest, "registry.example.com/team/other:v2", false),
        (r#"{"type": "matchExact"}"#, "registry.example.com/team/app:v1", "registry.example.com/team/app:v1", true),
        (r#"{"type": "matchExact"}"#, &digest, "registry.example.com/team/app:v1", false),
        (r#"{"type": "matchRepository"}"#, "docker.io/library/busybox:1.36", "busybox", true),
        (
            r#"{"type": "matchRepository"}"#,
            "registry.example.com/team/app:v1",
            "registry.example.com/team/other",
            false,
        ),
        (
            r#"{"type": "exactReference", "dockerReference": "registry.example.com/team/app:v1"}"#,
            "mirror.example/x:9",
            "registry.example.com/team/app:v1",
            true,
        ),
        (
            r#"{"type": "exactReference", "dockerReference": "registry.example.com/team/app:v1"}"#,
            "mirror.example/x:9",
            "registry.example.com/team/app",
            false,
        ),
        (
            r#"{"type": "exactRepository", "dockerRepository": "registry.example.com/team/app"}"#,
            "mirror.example/x:9",
            "registry.example.com/team/app",
            true,
        ),
        (
            r#"{"type": "exactRepository", "dockerRepository": "registry.example.com/team/app"}"#,
            "mirror.example/x:9",
            "registry.example.com/team/x",
            false,
        ),
        (
            r#"{"type": "remapIdentity", "prefix": "mirror.example/team", "signedPrefix": "registry.example.com/team"}"#,
            "mirror.example/team/app:v1",
            "registry.example.com/team/app:v1",
            true,
        ),
        (
            r#"{"type": "remapIdentity", "prefix": "mirror.example/team", "signedPrefix": "registry.example.com/team"}"#,
            "mirror.example/team/app:v1",
            "mirror.example/team/app:v1",
            false,
        ),
        (
            r#"{"type": "remapIdentity", "prefix": "mirror.example/team", "signedPrefix": "registry.example.com/team"}"#,
            "mirror.example/teams/app:v1",
            "mirror.example/teams/app:v1",
            true,
        ),
        (
            r#"{"type": "remapIdentity", "prefix": "mirror.example/team", "signedPrefix": "registry.example.com/team"}"#,
            "mirror.example/team/app:v1",
            "registry.example.com/team/app",
            false,
        ),
    ];
    for (rule, intended, signed, accepts) in cases {
        let rule: SignedIdentity = serde_json::from_str(rule).expect("a rule");
        let verdict = identity::check(&rule, &image(intended), signed);
        assert_eq!(verdict.is_ok(), *accepts, "{rule:?} for {intended} signed {signed}: {verdict:?}");
    }
}

/// A requirement whose CA or Rekor key was never loaded (only `parse_with_keys` loads them)
/// refuses every image rather than skip what it names; with Rekor's key loaded, a signature
/// without Rekor's timestamp is refused. (Certificates and timestamps themselves: tests/
/// fulcio_signatures.rs, with openssl-made CAs.)
#[test]
fn a_requirement_never_loaded_refuses_and_a_rekor_key_asks_for_a_timestamp() {
    let signer = ecdsa(false);
    let signature = signed_by(&signer, payload(REPOSITORY, MANIFEST));
    let fulcio: SigstoreSigned = serde_json::from_str(
        r#"{"fulcio": {"caData": "YQ==", "oidcIssuer": "https://issuer.example", "subjectEmail": "a@example.com"}, "rekorPublicKeyData": "YQ=="}"#,
    )
    .expect("a requirement");
    let verdict =
        rejected(verify(&fulcio, &image(&format!("{REPOSITORY}:v1")), MANIFEST, std::slice::from_ref(&signature)));
    assert_eq!(verdict.to_string(), "the requirement has no Rekor key loaded");
    let mut rekor = requirement(&[&signer.pem], MATCH_REPOSITORY);
    rekor.rekor_public_key_data = Some(base64(signer.pem.as_bytes()));
    let verdict =
        rejected(verify(&rekor, &image(&format!("{REPOSITORY}:v1")), MANIFEST, std::slice::from_ref(&signature)));
    assert!(matches!(verdict, Rejected::Unsupported(words) if words.contains("Rekor")));
    load_keys(&mut rekor, &|_| Err("no files in this test".into())).expect("keys load");
    let verdict = rejected(verify(&rekor, &image(&format!("{REPOSITORY}:v1")), MANIFEST, &[signature]));
    assert!(verdict.to_string().contains("no Rekor bundle"), "{verdict}");
}

#[test]
fn no_signature_and_an_image_naming_another_digest_are_refused() {
    let signer = ecdsa(false);
    let required = requirement(&[&signer.pem], MATCH_REPOSITORY);
    let verdict = rejected(verify(&required, &image(&format!("{REPOSITORY}:v1")), MANIFEST, &[]));
    assert_eq!(verdict.to_string(), "a signature was required, but the image has none");
    let signature = signed_by(&signer, payload(REPOSITORY, MANIFEST));
    let named = image(&format!("{REPOSITORY}@{OTHER_MANIFEST}"));
    assert!(matches!(verify(&required, &named, MANIFEST, &[signature]), Err(Rejected::ImageDigest { .. })));
}

fn manifest(layers: &[serde_json::Value]) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": MANIFEST, "size": 233},
        "layers": layers,
    }))
    .expect("json")
}

fn cosign_layer(digest: &str) -> serde_json::Value {
    serde_json::json!({
        "mediaType": SIGNATURE_MEDIA_TYPE, "digest": digest, "size": 250,
        "annotations": {"dev.cosignproject.cosign/signature": "MEUC", "dev.sigstore.cosign/bundle": "{}", "org.example": "x"}
    })
}

#[test]
fn the_signature_manifest_gives_its_signature_layers_and_passes_over_the_rest() {
    let other = serde_json::json!({"mediaType": "application/vnd.in-toto+json", "digest": "md5:x", "size": 1});
    let bundle = serde_json::json!({"mediaType": BUNDLE_MEDIA_TYPE, "digest": OTHER_MANIFEST, "size": 679});
    let artifact = parse_artifact(&manifest(&[other, cosign_layer(MANIFEST), bundle])).expect("read");
    assert_eq!(artifact.not_considered, 0);
    let (kinds, sizes): (Vec<_>, Vec<_>) = artifact.layers.iter().map(|layer| (layer.kind, layer.size)).unzip();
    assert_eq!((kinds, sizes), (vec![LayerKind::Cosign, LayerKind::Bundle], vec![250, 679]));
    assert_eq!(
        artifact.layers[..1],
        [Layer {
            kind: LayerKind::Cosign,
            digest: MANIFEST.into(),
            size: 250,
            signature: Some("MEUC".into()),
            certificate: None,
            chain: None,
            bundle: Some("{}".into()),
        }]
    );
    for (bytes, says) in [
        (manifest(&[cosign_layer("sha256:../../etc")]), "is not sha256:<64 hex digits>"),
        (br#"{"schemaVersion": 1, "layers": []}"#.to_vec(), "schemaVersion is 1"),
        (
            br#"{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "layers": []}"#.to_vec(),
            "is a \"application/vnd.oci.image.index.v1+json\", not an image manifest",
        ),
        (br#"{"schemaVersion": 2, "layers": {}}"#.to_vec(), "not an image manifest"),
    ] {
        let error = parse_artifact(&bytes).expect_err("refused").to_string();
        assert!(error.contains(says), "{error}\n  not: {says}");
    }
}

#[test]
fn sizes_and_counts_are_bounded() {
    let many: Vec<serde_json::Value> = (0..100).map(|_| cosign_layer(MANIFEST)).collect();
    let artifact = parse_artifact(&manifest(&many)).expect("read");
    assert_eq!((artifact.layers.len(), artifact.not_considered), (LAYER_LIMIT, 100 - LAYER_LIMIT));
    let huge = vec![b' '; MANIFEST_LIMIT + 1];
    assert_eq!(parse_artifact(&huge), Err(ArtifactError::TooLarge(MANIFEST_LIMIT + 1)));
    // A registry's error quoted by serde is escaped and bounded.
    let error = parse_artifact(format!("{{\"{}\u{7f}\": ", "x".repeat(100_000)).as_bytes()).expect_err("refused");
    assert!(error.to_string().len() < 400, "{error}");

    let signer = ecdsa(false);
    let required = requirement(&[&signer.pem], MATCH_REPOSITORY);
    let stranger = ecdsa(false);
    let signatures: Vec<_> = (0..40).map(|_| signed_by(&stranger, payload(REPOSITORY, MANIFEST))).collect();
    let Err(Rejected::NoneVerified(refused)) =
        verify(&required, &image(&format!("{REPOSITORY}:v1")), MANIFEST, &signatures)
    else {
        panic!("refused")
    };
    assert_eq!(refused.len(), LAYER_LIMIT, "the first {LAYER_LIMIT} only");
    let message = Rejected::NoneVerified(refused).to_string();
    assert!(message.ends_with("; and 24 more") && message.len() < 1500, "{message}");
    let mut large = layer(b"", b"");
    large.size = PAYLOAD_LIMIT + 1;
    let verdict = verify(&required, &image(&format!("{REPOSITORY}:v1")), MANIFEST, &[(large, Vec::new())]);
    assert_eq!(why(verdict), Why::PayloadTooLarge(PAYLOAD_LIMIT + 1));
}

fn refused_policy(key: &str, file: &'static [u8]) -> String {
    let json = format!(
        r#"{{"default": [{{"type": "reject"}}], "transports": {{"docker": {{"registry.example.com": [{{"type": "sigstoreSigned", {key}}}]}}}}}}"#
    );
    match parse_with_keys(json.as_bytes(), &|path| {
        if path.ends_with("missing.pub") {
            Err("No such file or directory (os error 2)".into())
        } else {
            Ok(file.to_vec())
        }
    }) {
        Ok(_) => panic!("{key} loaded"),
        Err(error) => {
            assert!(matches!(error, PolicyFileError::Key { .. }), "{error}");
            error.to_string()
        }
    }
}

#[test]
fn a_key_that_cannot_be_read_or_used_refuses_the_policy_naming_the_scope_and_the_key_never_its_bytes() {
    let scope = r#"transports."docker"."registry.example.com": "#;
    for (key, file, says) in [
        (
            r#""keyPath": "/etc/pki/missing.pub""#,
            &b""[..],
            r#"keyPath "/etc/pki/missing.pub": cannot be read: No such file"#,
        ),
        (
            r#""keyPath": "/etc/pki/dsa.pub""#,
            include_bytes!("testdata/dsa.pub"),
            "DSA keys are not verified by cri-imaged",
        ),
        (
            r#""keyPaths": ["/ok.pub", "/p521.pub"]"#,
            include_bytes!("testdata/p521.pub"),
            r#"keyPaths[0] "/ok.pub": ECDSA P-521 keys are not verified"#,
        ),
        (r#""keyPath": "/ed448.pub""#, include_bytes!("testdata/ed448.pub"), "Ed448 keys are not"),
        (r#""keyPath": "/rsa.pub""#, include_bytes!("testdata/rsa-1024.pub"), "an RSA key of 1024 bits"),
        (
            r#""keyPath": "/private.pem""#,
            b"-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n",
            "a PEM \"PRIVATE KEY\" block first",
        ),
        (r#""keyPath": "/text""#, b"hello", "no PEM block"),
        (r#""keyData": "not base64!""#, b"", "keyData: not base64"),
        (
            r#""keyDatas": ["LS0tLS1CRUdJTiBQVUJMSUMgS0VZLS0tLS0KTUFBPQotLS0tLUVORCBQVUJMSUMgS0VZLS0tLS0K"]"#,
            b"",
            "keyDatas[0]: not a SubjectPublicKeyInfo",
        ),
        (
            r#""keyPath": "/ok.pub", "rekorPublicKeyPath": "/rsa.pub""#,
            include_bytes!("testdata/rsa-2048.pub"),
            "rekorPublicKeyPath \"/rsa.pub\": a Rekor key must be ECDSA, not RSA-2048",
        ),
    ] {
        let message = refused_policy(key, file);
        assert!(message.starts_with(scope) && message.contains(says), "{message}\n  not: {says}");
        let body = String::from_utf8_lossy(file);
        let second_line = body.lines().nth(1).unwrap_or("no such line in the key");
        assert!(!message.contains(second_line), "{message} quotes the key");
    }
}

#[test]
fn keys_are_equal_when_their_der_is_and_print_as_their_fingerprint() {
    let pem = include_str!("testdata/p256.pub");
    let (one, two) = (
        PublicKey::from_pem(pem.as_bytes()).expect("a key"),
        PublicKey::from_key_data(&base64(pem.as_bytes())).expect("a key"),
    );
    assert_eq!(one, two);
    assert_ne!(one, PublicKey::from_pem(ecdsa(false).pem.as_bytes()).expect("a key"));
    assert_eq!(format!("{one:?}"), format!("PublicKey(ECDSA P-256 {})", one.fingerprint()));
    // Text around the block is passed over, as Go's pem.Decode does.
    assert_eq!(PublicKey::from_pem(format!("# cosign.pub\n{pem}trailing").as_bytes()), Ok(one));
}

#[test]
fn der_that_is_not_strict_is_refused() {
    let pem = include_str!("testdata/p256.pub");
    let body: String = pem.lines().filter(|line| !line.starts_with("-----")).collect();
    let der = base64::engine::general_purpose::STANDARD.decode(body).expect("base64");
    assert!(PublicKey::from_spki(&der).is_ok());
    let mut trailing = der.clone();
    trailing.push(0);
    assert_eq!(PublicKey::from_spki(&trailing), Err(KeyError::Der(DerError::Trailing)));
    // The same length in a longer form than needed (0x81 0x59 for 0x59).
    let long_form = [&[0x30, 0x81], &der[1..]].concat();
    assert_eq!(PublicKey::from_spki(&long_form), Err(KeyError::Der(DerError::Length)));
    assert_eq!(PublicKey::from_spki(&der[..40]), Err(KeyError::Der(DerError::Truncated)));
    let mut compressed = der.clone();
    compressed[26] = 0x02;
    assert_eq!(PublicKey::from_spki(&compressed), Err(KeyError::EcPoint));
}

/// An image's referrers: cosign's signature manifests and Sigstore bundles are read, then those of
/// an empty artifact type (cosign 2.5 lists its bundles so), each digest checked (safe in a URL),
/// at most eight, and an index that is not one (or too large) is refused.
#[test]
fn the_signature_manifests_among_an_images_referrers_are_found_bounded() {
    let descriptor = |digest: &str, artifact_type: Option<&str>| {
        let mut descriptor = serde_json::json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest, "size": 1,
        });
        if let Some(artifact_type) = artifact_type {
            descriptor["artifactType"] = artifact_type.into();
        }
        descriptor
    };
    let digest = |n: u32| format!("sha256:{:064x}", n);
    let mut manifests = vec![
        descriptor(&digest(1), Some(REFERRER_ARTIFACT_TYPE)),
        descriptor(&digest(2), Some("application/vnd.dev.sigstore.bundle.v0.3+json")),
        descriptor(&digest(3), None),
        descriptor(&digest(4), Some("application/vnd.oci.empty.v1+json")),
        descriptor(&digest(5), Some("application/spdx+json")),
        descriptor("sha256:../../escape", Some(REFERRER_ARTIFACT_TYPE)),
    ];
    manifests.extend((10..30).map(|n| descriptor(&digest(n), Some(REFERRER_ARTIFACT_TYPE))));
    let index = serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": manifests,
    });
    let found = parse_referrers(index.to_string().as_bytes()).expect("an index");
    assert_eq!(found.len(), REFERRER_LIMIT);
    assert_eq!(found[..3], [digest(1), digest(2), digest(10)], "other types, no type and a bad digest passed over");
    let few: Vec<_> = index["manifests"].as_array().expect("listed")[..5].to_vec();
    let index = serde_json::json!({ "schemaVersion": 2, "manifests": few });
    let found = parse_referrers(index.to_string().as_bytes()).expect("an index");
    assert_eq!(found, [digest(1), digest(2), digest(4)], "an empty artifact type after the known ones");
    assert!(matches!(
        parse_referrers(b"{\"schemaVersion\": 1, \"manifests\": []}"),
        Err(ArtifactError::SchemaVersion(1))
    ));
    assert!(matches!(parse_referrers(b"[]"), Err(ArtifactError::Parse(_))));
    let huge = vec![b' '; MANIFEST_LIMIT + 1];
    assert!(matches!(parse_referrers(&huge), Err(ArtifactError::TooLarge(_))));
}
