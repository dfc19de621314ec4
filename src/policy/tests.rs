use super::*;

fn reference(image: &str) -> ImageReference {
    ImageReference::parse_normalized(image).expect("a reference")
}

/// A P-256 public key, whatever the path (made with openssl; see sigstore/testdata/README.md).
const KEY: &[u8] = include_bytes!("sigstore/testdata/p256.pub");

/// A CA certificate (see sigstore/testdata/README.md).
const FULCIO_CA: &[u8] = include_bytes!("sigstore/testdata/fulcio-ca.pem");

fn any_path_is_the_test_key(_: &std::path::Path) -> Result<Vec<u8>, String> {
    Ok(KEY.to_vec())
}

fn policy(json: &str) -> PolicyFile {
    parse_with_keys(json.as_bytes(), &any_path_is_the_test_key).unwrap_or_else(|error| panic!("{error}: {json}"))
}

fn refused(json: &str) -> String {
    match parse_with_keys(json.as_bytes(), &any_path_is_the_test_key) {
        Ok(file) => panic!("accepted: {file:?}"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn an_image_is_looked_up_from_its_whole_reference_to_wildcards_of_its_domain() {
    assert_eq!(
        lookups(&reference("registry.example.com:5000/team/app/web:v1")),
        [
            "registry.example.com:5000/team/app/web:v1",
            "registry.example.com:5000/team/app/web",
            "registry.example.com:5000/team/app",
            "registry.example.com:5000/team",
            "registry.example.com:5000",
            "*.example.com",
            "*.com",
        ]
    );
    let digest = format!("sha256:{}", "a".repeat(64));
    assert_eq!(
        lookups(&reference(&format!("busybox@{digest}"))),
        [
            format!("docker.io/library/busybox@{digest}"),
            "docker.io/library/busybox".into(),
            "docker.io/library".into(),
            "docker.io".into(),
            "*.io".into()
        ]
    );
    assert_eq!(lookups(&reference("localhost/app")), ["localhost/app", "localhost"], "no tag, no domain to widen");
}

/// containers-policy.json(5)'s own example, abridged.
const EXAMPLE: &str = r#"{
    "default": [{"type": "reject"}],
    "transports": {
        "docker": {
            "docker.io/library/busybox": [{"type": "insecureAcceptAnything"}],
            "registry.example.com": [{"type": "insecureAcceptAnything"}],
            "registry.example.com/legacy": [{"type": "reject"}],
            "registry.example.com/legacy/tool:v2": [{"type": "insecureAcceptAnything"}],
            "*.trusted.example": [{"type": "insecureAcceptAnything"}],
            "registry.signed.example": [
                {"type": "sigstoreSigned", "keyPath": "/etc/pki/signed.pub", "signedIdentity": {"type": "matchRepository"}}
            ]
        },
        "docker-daemon": {"": [{"type": "insecureAcceptAnything"}]}
    }
}"#;

#[test]
fn the_most_specific_scope_decides_and_the_default_covers_the_rest() {
    let policies = Policies { default: Some(policy(EXAMPLE)), namespaces: BTreeMap::new() };
    let decided = |image: &str| {
        let verdict = policies.decide(&reference(image), Some("any"));
        (verdict.scope, verdict.decision)
    };
    let scope = |scope: &str| Some(scope.to_owned());
    assert_eq!(decided("busybox:1.36"), (scope("docker.io/library/busybox"), Decision::Accepted));
    assert_eq!(decided("alpine"), (None, Decision::Rejected), "the default");
    assert_eq!(decided("registry.example.com/team/app:v1"), (scope("registry.example.com"), Decision::Accepted));
    assert_eq!(
        decided("registry.example.com/legacy/tool:v1"),
        (scope("registry.example.com/legacy"), Decision::Rejected)
    );
    assert_eq!(
        decided("registry.example.com/legacy/tool:v2"),
        (scope("registry.example.com/legacy/tool:v2"), Decision::Accepted)
    );
    assert_eq!(decided("eu.trusted.example/app"), (scope("*.trusted.example"), Decision::Accepted));
    assert_eq!(decided("trusted.example/app"), (None, Decision::Rejected), "a wildcard covers subdomains only");
    assert_eq!(decided("registry.example.com.evil.test/app"), (None, Decision::Rejected));
    let (scope_of, decision) = decided(&format!("registry.signed.example/app@sha256:{}", "b".repeat(64)));
    assert_eq!(scope_of, scope("registry.signed.example"));
    let key = |signed: &[Arc<SigstoreSigned>]| signed[0].key_path.clone();
    assert!(
        matches!(decision, Decision::NeedsSignature(ref signed) if key(signed).as_deref() == Some("/etc/pki/signed.pub"))
    );
}

#[test]
fn a_namespaces_own_file_replaces_the_default_for_its_pods_only() {
    let open = policy(r#"{"default": [{"type": "insecureAcceptAnything"}]}"#);
    let policies = Policies { default: Some(policy(EXAMPLE)), namespaces: BTreeMap::from([("ci".to_owned(), open)]) };
    let verdict = policies.decide(&reference("alpine"), Some("ci"));
    assert_eq!((verdict.policy, verdict.decision), (PolicySource::Namespace("ci".into()), Decision::Accepted));
    for namespace in [Some("prod"), None] {
        let verdict = policies.decide(&reference("alpine"), namespace);
        assert_eq!((verdict.policy, verdict.decision), (PolicySource::Default, Decision::Rejected), "{namespace:?}");
    }
    let none = Policies::default().decide(&reference("alpine"), Some("ci"));
    assert_eq!((none.policy, none.decision), (PolicySource::None, Decision::Accepted), "no policy: every image");
}

#[test]
fn the_transports_default_comes_before_the_policys() {
    let file = policy(
        r#"{"default": [{"type": "reject"}], "transports": {"docker": {"": [{"type": "insecureAcceptAnything"}]}}}"#,
    );
    let verdict = Policies { default: Some(file), namespaces: BTreeMap::new() }.decide(&reference("alpine"), None);
    assert_eq!((verdict.scope, verdict.decision), (Some(String::new()), Decision::Accepted));
}

#[test]
fn every_requirement_must_accept() {
    let file = policy(r#"{"default": [{"type": "insecureAcceptAnything"}, {"type": "reject"}]}"#);
    let verdict = Policies { default: Some(file), namespaces: BTreeMap::new() }.decide(&reference("alpine"), None);
    assert_eq!(verdict.decision, Decision::Rejected);
}

#[test]
fn what_the_format_does_not_have_or_cri_imaged_would_not_honour_is_refused_naming_it() {
    for (json, says) in [
        (r#"{"default": [{"type": "reject"}], "extra": 1}"#, "unknown field `extra`"),
        (r#"{"transports": {}}"#, "missing field `default`"),
        (r#"{"default": []}"#, "default: a list of requirements must not be empty"),
        (r#"{"default": [{"type": "reject", "keyPath": "/k"}]}"#, "unknown field `keyPath`"),
        (r#"{"default": [{"type": "acceptIfSunny"}]}"#, "unknown variant `acceptIfSunny`"),
        (
            r#"{"default": [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": "/k.gpg"}]}"#,
            "default: signedBy (GPG signatures) is not supported",
        ),
        (
            r#"{"default": [{"type": "sigstoreSigned"}]}"#,
            "exactly one of keyPath, keyPaths, keyData, keyDatas and fulcio (found 0)",
        ),
        (r#"{"default": [{"type": "sigstoreSigned", "keyPath": "/a", "keyData": "b"}]}"#, "(found 2)"),
        (r#"{"default": [{"type": "sigstoreSigned", "keyPaths": []}]}"#, "keyPaths must not be empty"),
        (r#"{"default": [{"type": "sigstoreSigned", "keyPath": "/a", "keyPth": "/b"}]}"#, "unknown field `keyPth`"),
        (
            r#"{"default": [{"type": "sigstoreSigned", "fulcio": {"caPath": "/ca", "oidcIssuer": "https://i"}}]}"#,
            "fulcio needs caPath or caData (one), oidcIssuer and subjectEmail",
        ),
        (
            r#"{"default": [{"type": "sigstoreSigned", "fulcio": {"caPath": "/ca", "oidcIssuer": "https://i", "subjectEmail": "a@b"}}]}"#,
            "fulcio signatures need rekorPublicKeyPath",
        ),
        (
            // Any path reads the test's public key: not a certificate.
            r#"{"default": [{"type": "sigstoreSigned", "fulcio": {"caPath": "/ca", "oidcIssuer": "https://i", "subjectEmail": "a@b"}, "rekorPublicKeyPath": "/r"}]}"#,
            r#"fulcio.caPath "/ca": cannot be read: no PEM CERTIFICATE block"#,
        ),
        (
            r#"{"default": [{"type": "sigstoreSigned", "keyPath": "/a", "signedIdentity": {"type": "exactReference"}}]}"#,
            "missing field `dockerReference`",
        ),
        (
            r#"{"default": [{"type": "reject"}], "transports": {"docker": {"busybox": [{"type": "reject"}]}}}"#,
            r#"scope "busybox" names no registry: scopes are full names, as images are looked up (here "docker.io/library/busybox")"#,
        ),
        (
            r#"{"default": [{"type": "reject"}], "transports": {"docker": {"*.example.com/app": [{"type": "reject"}]}}}"#,
            "a wildcard is `*.` and a domain",
        ),
        (
            r#"{"default": [{"type": "reject"}], "transports": {"docker": {"registry.example.com/Bad Name": [{"type": "reject"}]}}}"#,
            "is not an image reference, a namespace or a registry",
        ),
        (
            r#"{"default": [{"type": "reject"}], "transports": {"docker-daemon": {"": [{"type": "signedBy"}]}}}"#,
            r#"transports."docker-daemon"."": signedBy"#,
        ),
        ("not json", "not a containers-policy.json document"),
    ] {
        let message = refused(json);
        assert!(message.contains(says), "{json}\n  said: {message}\n  not: {says}");
    }
}

#[test]
fn an_error_quotes_a_scope_escaped_and_bounded() {
    // A scope of escapes: each byte is six characters quoted (as the fuzzer found).
    let scope = format!("re{}/{}.example.com", r"\u007f".repeat(20_000), r"\u007f".repeat(20_000));
    let message = refused(&format!(
        r#"{{"default": [{{"type": "reject"}}], "transports": {{"docker": {{"{scope}": [{{"type": "reject"}}]}}}}}}"#
    ));
    assert!(message.len() < 1000, "{} bytes: {message}", message.len());
    assert!(message.contains(r"\u{7f}") && message.contains("bytes)"), "{message}");
    // serde's own words quote an unknown field whole: bounded too (the fuzzer's second find).
    let message = refused(&format!(r#"{{"default": [{{"type": "reject"}}], "{}": 1}}"#, "0".repeat(100_000)));
    assert!(message.len() < 400 && message.contains("unknown field"), "{} bytes: {message}", message.len());
}

#[test]
fn every_kind_of_scope_and_signed_identity_the_man_page_has_is_read() {
    use base64::Engine as _;
    let data = base64::engine::general_purpose::STANDARD.encode(KEY);
    let file = policy(
        &r#"{
        "default": [{"type": "reject"}],
        "transports": {"docker": {
            "": [{"type": "reject"}],
            "localhost:5000": [{"type": "insecureAcceptAnything"}],
            "registry.example.com/ns/app@sha256:0000000000000000000000000000000000000000000000000000000000000000": [{"type": "insecureAcceptAnything"}],
            "a.example.com": [{"type": "sigstoreSigned", "keyPaths": ["/a", "/b"], "signedIdentity": {"type": "matchRepoDigestOrExact"}}],
            "b.example.com": [{"type": "sigstoreSigned", "keyDatas": ["YQ=="], "signedIdentity": {"type": "exactRepository", "dockerRepository": "b.example.com/x"}}],
            "c.example.com": [{"type": "sigstoreSigned", "keyData": "YQ==", "signedIdentity": {"type": "remapIdentity", "prefix": "c.example.com", "signedPrefix": "mirror.example/c"}}],
            "d.example.com": [{"type": "sigstoreSigned", "fulcio": {"caData": "CA==", "oidcIssuer": "https://issuer.example", "subjectEmail": "dev@example.com"}, "rekorPublicKeyPath": "/rekor.pub"}],
            "*.example.org": [{"type": "insecureAcceptAnything"}]
        }}
    }"#
        .replace("YQ==", &data)
        .replace("CA==", &base64::engine::general_purpose::STANDARD.encode(FULCIO_CA)),
    );
    assert_eq!(file.docker.len(), 8);
    let Requirement::SigstoreSigned(signed) = &file.docker["a.example.com"][0] else { panic!("sigstoreSigned") };
    assert_eq!(signed.keys.len(), 2, "each of keyPaths loaded");
}
