use std::collections::HashMap;

use super::*;

#[test]
fn unknown_pull_policy_is_refused_with_its_value() {
    let wire = api::EnsureImageExistsRequest { image: "busybox".into(), pull_policy: 9, ..Default::default() };
    let error = EnsureRequest::try_from(wire).expect_err("9 is no policy");
    assert_eq!(error, RequestError::UnknownPullPolicy(9));
    assert!(error.to_string().contains("pull_policy 9"));
}

#[test]
fn pull_secrets_keep_their_coordinates_type_and_content() {
    use secrecy::ExposeSecret;
    let secret = api::PullSecret {
        name: "regcred".into(),
        namespace: "team".into(),
        docker_config_json: r#"{"auths": {}}"#.into(),
        uid: "6c1d".into(),
        r#type: "kubernetes.io/dockercfg".into(),
    };
    let wire =
        api::EnsureImageExistsRequest { image: "busybox".into(), pull_secrets: vec![secret], ..Default::default() };
    let request = EnsureRequest::try_from(wire).expect("valid");
    let [secret] = request.pull_secrets.as_slice() else { panic!("one secret") };
    let expected = SecretCoordinates { uid: "6c1d".into(), namespace: "team".into(), name: "regcred".into() };
    assert_eq!(secret.coordinates, expected);
    assert_eq!(secret.kind, "kubernetes.io/dockercfg");
    assert_eq!(secret.content.expose_secret(), r#"{"auths": {}}"#);
    assert!(!format!("{secret:?}").contains("auths"), "Debug shows no content");
}

#[test]
fn a_wire_pull_secret_never_prints_its_content() {
    let secret = api::PullSecret { name: "regcred".into(), docker_config_json: "hunter2".into(), ..Default::default() };
    let printed = format!("{:?}", api::EnsureImageExistsRequest { pull_secrets: vec![secret], ..Default::default() });
    assert!(!printed.contains("hunter2") && printed.contains("regcred"), "{printed}");
}

#[test]
fn unspecified_pull_policy_is_left_for_the_manager_to_default() {
    let wire = api::EnsureImageExistsRequest { image: "busybox".into(), ..Default::default() };
    let request = EnsureRequest::try_from(wire).expect("valid");
    assert_eq!(request.pull_policy, None);
    assert_eq!(request.image, "busybox");
}

fn with_account(account: api::ServiceAccount) -> api::EnsureImageExistsRequest {
    let pod = api::PodRef { namespace: "team".into(), name: "web".into(), uid: "pod-uid".into(), ..Default::default() };
    api::EnsureImageExistsRequest {
        image: "busybox".into(),
        pod: Some(pod),
        service_account: Some(account),
        ..Default::default()
    }
}

fn account(tokens: Vec<api::ServiceAccountToken>) -> api::ServiceAccount {
    api::ServiceAccount {
        namespace: "team".into(),
        name: "builder".into(),
        uid: "sa-uid".into(),
        annotations: HashMap::from([("example.com/role".into(), "pull".into())]),
        tokens,
    }
}

fn token(audience: &str, token: &str) -> api::ServiceAccountToken {
    api::ServiceAccountToken { audience: audience.into(), token: token.into() }
}

#[test]
fn a_service_account_keeps_its_coordinates_annotations_and_tokens_by_audience() {
    use secrecy::ExposeSecret;
    let wire = with_account(account(vec![token("registry.io", "sa-token-1"), token("other.io", "sa-token-2")]));
    let request = EnsureRequest::try_from(wire).expect("valid");
    let account = request.service_account.expect("an account");
    assert_eq!(
        (account.namespace.as_str(), account.name.as_str(), account.uid.as_str()),
        ("team", "builder", "sa-uid")
    );
    assert_eq!(account.annotations.get("example.com/role").map(String::as_str), Some("pull"));
    assert_eq!(account.token_for("registry.io").map(ExposeSecret::expose_secret), Some("sa-token-1"));
    assert_eq!(account.token_for("other.io").map(ExposeSecret::expose_secret), Some("sa-token-2"));
    assert!(account.token_for("third.io").is_none());
}

#[test]
fn a_service_account_without_a_name_is_no_service_account() {
    let nameless = api::ServiceAccount { name: String::new(), uid: String::new(), ..account(vec![token("a", "t")]) };
    assert!(EnsureRequest::try_from(with_account(nameless)).expect("valid").service_account.is_none());
    let absent = api::EnsureImageExistsRequest { image: "busybox".into(), ..Default::default() };
    assert!(EnsureRequest::try_from(absent).expect("valid").service_account.is_none());
}

#[test]
fn an_unbounded_or_inconsistent_service_account_is_refused_naming_the_field_never_the_token() {
    let secret = "secret-token-value";
    let long = format!("{secret}{}", "x".repeat(MAX_TOKEN_BYTES));
    let many_annotations = (0..=MAX_ANNOTATIONS).map(|i| (format!("k{i}"), String::new())).collect();
    let cases = [
        (
            account(vec![token("registry.io", &long)]),
            "service_account.tokens",
            format!(
                "service_account.tokens: the token for audience \"registry.io\" is {} bytes, more than 16384",
                long.len()
            ),
        ),
        (
            account((0..=MAX_TOKENS).map(|i| token(&format!("a{i}"), secret)).collect()),
            "service_account.tokens",
            "service_account.tokens: 17 tokens, more than 16".to_owned(),
        ),
        (
            api::ServiceAccount { annotations: many_annotations, ..account(vec![token("a", secret)]) },
            "service_account.annotations",
            "service_account.annotations: 65 annotations, more than 64".to_owned(),
        ),
        (
            api::ServiceAccount { namespace: "other".into(), ..account(vec![token("a", secret)]) },
            "service_account.namespace",
            "service_account.namespace \"other\" is not the pod's namespace \"team\"".to_owned(),
        ),
        (
            api::ServiceAccount { uid: String::new(), ..account(vec![token("a", secret)]) },
            "service_account.uid",
            "service_account.uid is required with service_account.name".to_owned(),
        ),
    ];
    for (account, field, message) in cases {
        let error = EnsureRequest::try_from(with_account(account)).expect_err(field);
        assert_eq!((error.field(), error.to_string()), (field, message));
        assert!(!format!("{error:?}").contains(secret), "{error:?}");
    }
}

#[test]
fn a_token_is_never_printed_by_the_wire_or_the_translated_request() {
    let secret = "secret-token-value";
    let wire = with_account(account(vec![token("registry.io", secret)]));
    let printed = format!("{wire:?}");
    assert!(!printed.contains(secret) && printed.contains("registry.io"), "{printed}");
    let printed = format!("{:?}", EnsureRequest::try_from(wire).expect("valid"));
    assert!(!printed.contains(secret) && printed.contains("registry.io"), "{printed}");
}

#[test]
fn clear_backoff_takes_one_pair_or_all_and_says_why_otherwise() {
    let clear = |pod_uid: &str, image: &str, runtime_handler: &str, all: bool| {
        let wire = api::ClearBackoffRequest {
            pod_uid: pod_uid.into(),
            image: image.into(),
            runtime_handler: runtime_handler.into(),
            all,
        };
        ClearBackoff::try_from(wire).map_err(|error| (error.field(), error.to_string()))
    };
    let pair = ClearBackoff::Pair { pod_uid: "u1".into(), image: "busybox".into(), runtime_handler: "kata".into() };
    assert_eq!(clear("u1", "busybox", "kata", false), Ok(pair));
    assert_eq!(clear("", "", "", true), Ok(ClearBackoff::All));
    let either = "give pod_uid and image (one pod's back-off for one image) or all (every back-off)";
    assert_eq!(clear("", "", "", false), Err(("all", format!("{either}; the request gave neither"))));
    assert_eq!(clear("u1", "busybox", "", true), Err(("all", format!("{either}, not both"))));
    assert_eq!(clear("", "", "kata", true).map_err(|(field, _)| field), Err("all"), "a handler is part of a pair");
    assert_eq!(
        clear("u1", "", "", false),
        Err(("image", "image is required with pod_uid: a back-off is one pod's pulls of one image".to_owned()))
    );
    assert_eq!(clear("", "busybox", "", false).map_err(|(field, _)| field), Err("pod_uid"));
}

fn submission(images: &[&str]) -> api::SubmitPrePullRequest {
    api::SubmitPrePullRequest { images: images.iter().map(|image| (*image).to_owned()).collect(), ..Default::default() }
}

/// The refusal of `wire`: its field and its message.
fn refused(wire: api::SubmitPrePullRequest) -> (&'static str, String) {
    let error = Submission::try_from(wire).expect_err("refused");
    (error.field(), error.to_string())
}

#[test]
fn a_submission_with_a_field_past_its_bound_is_refused_naming_the_field_and_the_bound() {
    // Issue 47: a 1.5 MiB runtime handler was kept, listed and written down.
    let handler = api::SubmitPrePullRequest { runtime_handler: "k".repeat(3 << 19), ..submission(&["app:1"]) };
    assert_eq!(
        refused(handler),
        (
            "runtime_handler",
            "runtime_handler: 1572864 bytes, more than 63 (a RuntimeClass's handler is a DNS label)".into()
        )
    );
    for bad in ["Kata", "kata_qemu", "-kata", "kata-", "kata.v2", "ka ta"] {
        let wire = api::SubmitPrePullRequest { runtime_handler: bad.into(), ..submission(&["app:1"]) };
        let (field, message) = refused(wire);
        assert_eq!(field, "runtime_handler");
        assert!(message.contains(&format!("{bad:?} is not a DNS label")), "{message}");
    }
    for good in ["", "runc", "kata-qemu", "gvisor2", &"a".repeat(63)] {
        let wire = api::SubmitPrePullRequest { runtime_handler: good.into(), ..submission(&["app:1"]) };
        assert_eq!(Submission::try_from(wire).expect("a DNS label").runtime_handler, good);
    }

    let namespace = api::SubmitPrePullRequest { namespace: "n".repeat(64), ..submission(&["app:1"]) };
    assert_eq!(
        refused(namespace),
        ("namespace", "namespace: 64 bytes, more than 63 (a Kubernetes namespace's name is a DNS label)".into())
    );
    for bad in ["Team", "team_a", "-team", "team-", "kube.system", "te am"] {
        let wire = api::SubmitPrePullRequest { namespace: bad.into(), ..submission(&["app:1"]) };
        let (field, message) = refused(wire);
        assert_eq!(field, "namespace");
        assert!(message.contains(&format!("{bad:?} is not a DNS label")), "{message}");
    }
    for good in ["", "team", "kube-system", "a1", &"n".repeat(63)] {
        let wire = api::SubmitPrePullRequest { namespace: good.into(), ..submission(&["app:1"]) };
        assert_eq!(Submission::try_from(wire).expect("a namespace's name").namespace, good);
    }

    let long = format!("{}.example/app:1", "a".repeat(2000));
    let (field, message) = refused(submission(&["app:1", &long]));
    assert_eq!(
        (field, message),
        ("images", format!("images[1]: {} bytes, more than 1024 (the longest image reference)", long.len()))
    );
    let many: Vec<String> = (0..=1024).map(|index| format!("app-{index}:1")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    assert_eq!(refused(submission(&many)), ("images", "images: 1025 given, more than 1024".into()));

    let secret = |bytes: usize| api::PullSecret {
        name: "regcred".into(),
        docker_config_json: "x".repeat(bytes),
        ..Default::default()
    };
    let wire =
        api::SubmitPrePullRequest { pull_secrets: (0..17).map(|_| secret(10)).collect(), ..submission(&["app:1"]) };
    assert_eq!(refused(wire), ("pull_secrets", "pull_secrets: 17 given, more than 16".into()));
    let wire = api::SubmitPrePullRequest { pull_secrets: vec![secret(64 << 10)], ..submission(&["app:1"]) };
    let (field, message) = refused(wire);
    assert_eq!((field, message.as_str()), ("pull_secrets", "pull_secrets: 65543 bytes in all, more than 65536"));
    assert!(!message.contains("xxx"), "never quoted");
}

#[test]
fn a_page_of_pre_pulls_is_at_most_500_and_goes_on_only_from_a_token_the_daemon_gave() {
    let page = |page_size: u32, page_token: &str| {
        Page::try_from(api::ListPrePullsRequest { page_size, page_token: page_token.into() })
    };
    assert_eq!(page(0, "").expect("the first").size, 500);
    assert_eq!(page(10, "").expect("the first").size, 10);
    assert_eq!(page(u32::MAX, "").expect("the first").size, 500);
    let token = "5.1700000000.123.0123456789abcdef";
    assert_eq!(page(0, token).expect("goes on").after.expect("after").to_string(), token);
    let error = page(0, "not a token").expect_err("refused");
    assert_eq!((error.field(), error.to_string().as_str()), ("page_token", "page_token: not one ListPrePulls gave"));
}
