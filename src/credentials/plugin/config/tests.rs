use std::os::unix::fs::PermissionsExt;

use super::*;

const PROVIDER: &str = r#"
apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
  - name: test-plugin
    matchImages:
      - "*.registry.io"
      - "registry.local:5000"
    defaultCacheDuration: 12h
    apiVersion: credentialprovider.kubelet.k8s.io/v1
    args: [get-credentials]
    env:
      - name: REGION
        value: eu-1
"#;

/// A bin dir holding an executable `test-plugin`, and the config file `text` beside it.
fn load_text(text: &str) -> Result<Vec<ProviderConfig>, PluginConfigError> {
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).expect("bin dir");
    let plugin = bin.join("test-plugin");
    std::fs::write(&plugin, "#!/bin/sh\n").expect("plugin");
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).expect("executable");
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, text).expect("config");
    load(&config, &bin)
}

fn refusal(text: &str) -> String {
    match load_text(text) {
        Ok(_) => panic!("must be refused:\n{text}"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn a_kubelet_config_reads_with_every_field() {
    let providers = load_text(PROVIDER).expect("valid");
    assert_eq!(providers.len(), 1);
    let provider = &providers[0];
    assert_eq!(provider.name, "test-plugin");
    assert!(provider.executable.ends_with("bin/test-plugin"));
    assert_eq!(provider.match_images, ["*.registry.io", "registry.local:5000"]);
    assert_eq!(provider.default_cache_duration, Duration::from_secs(12 * 3600));
    assert_eq!(provider.api_version, "credentialprovider.kubelet.k8s.io/v1");
    assert_eq!(provider.args, ["get-credentials"]);
    assert_eq!(provider.env, [("REGION".to_owned(), "eu-1".to_owned())]);
}

#[test]
fn json_and_older_config_versions_read_too() {
    let json = r#"{"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "CredentialProviderConfig",
        "providers": [{"name": "test-plugin", "matchImages": ["*.registry.io"], "defaultCacheDuration": "1m0s",
        "apiVersion": "credentialprovider.kubelet.k8s.io/v1alpha1"}]}"#;
    assert_eq!(load_text(json).expect("valid")[0].default_cache_duration, Duration::from_secs(60));
}

#[test]
fn invalid_providers_are_refused_naming_the_field() {
    let cases = [
        (
            "name: test-plugin",
            "name: foo/../bar",
            "providers[0].name: provider name cannot contain path separators, '.' or '..'",
        ),
        (
            "name: test-plugin",
            "name: '..'",
            "providers[0].name: provider name cannot contain path separators, '.' or '..'",
        ),
        ("name: test-plugin", "name: ''", "providers[0].name: name is required"),
        (
            "    apiVersion: credentialprovider.kubelet.k8s.io/v1\n",
            "",
            "providers[0].apiVersion: apiVersion is required",
        ),
        (
            "apiVersion: credentialprovider.kubelet.k8s.io/v1\n    args",
            "apiVersion: credentialprovider.kubelet.k8s.io/v1alpha0\n    args",
            "providers[0].apiVersion: apiVersion must be one of credentialprovider.kubelet.k8s.io/v1, credentialprovider.kubelet.k8s.io/v1beta1, credentialprovider.kubelet.k8s.io/v1alpha1",
        ),
        (
            "      - \"*.registry.io\"\n      - \"registry.local:5000\"\n",
            "      - \"%invalid%\"\n",
            "providers[0].matchImages: match image \"%invalid%\" is invalid",
        ),
        ("    defaultCacheDuration: 12h\n", "", "providers[0].defaultCacheDuration: defaultCacheDuration is required"),
        (
            "defaultCacheDuration: 12h",
            "defaultCacheDuration: -1m0s",
            "providers[0].defaultCacheDuration: defaultCacheDuration must be greater than or equal to 0",
        ),
        (
            "defaultCacheDuration: 12h",
            "defaultCacheDuration: 12 hours",
            "providers[0].defaultCacheDuration: invalid duration \"12 hours\"",
        ),
        ("name: test-plugin", "name: absent-plugin", "providers[0].name: error inspecting binary executable"),
    ];
    for (from, to, expected) in cases {
        let text = PROVIDER.replacen(from, to, 1);
        assert_ne!(text, PROVIDER, "{from:?} is in the config");
        let error = refusal(&text);
        assert!(error.contains(expected), "{error}\n does not say {expected:?}");
    }
}

#[test]
fn the_file_itself_must_be_a_credential_provider_config() {
    let empty = "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders: []\n";
    assert!(refusal(empty).ends_with("providers: at least 1 item in plugins is required"));
    let wrong_kind = PROVIDER.replace("kind: CredentialProviderConfig", "kind: KubeletConfiguration");
    assert!(refusal(&wrong_kind).ends_with("kind is \"KubeletConfiguration\", not \"CredentialProviderConfig\""));
    let wrong_group = PROVIDER.replace("apiVersion: kubelet.config.k8s.io/v1", "apiVersion: foobar/v1alpha1");
    assert!(refusal(&wrong_group).contains("apiVersion \"foobar/v1alpha1\" is not one of"));
    let duplicate = format!("{PROVIDER}{}", &PROVIDER[PROVIDER.find("  - name").expect("a provider")..]);
    assert!(refusal(&duplicate).ends_with("providers[1].name: duplicate names are not allowed"));
}

#[test]
fn unknown_fields_are_refused_with_their_name_and_line() {
    let typo = PROVIDER.replace("matchImages", "matchImage");
    let error = refusal(&typo);
    assert!(error.contains("unknown field `matchImage`") && error.contains("line 6"), "{error}");
}

#[test]
fn a_relative_bin_dir_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, PROVIDER).expect("config");
    let error = load(&config, Path::new("bin")).expect_err("refused").to_string();
    assert!(error.ends_with("the plugin bin dir bin must be an absolute path"), "{error}");
}

/// `PROVIDER` with `attributes` (a YAML flow mapping) as its `tokenAttributes`.
fn with_tokens(attributes: &str) -> String {
    PROVIDER.replacen("    env:", &format!("    tokenAttributes: {attributes}\n    env:"), 1)
}

const TOKEN_ATTRIBUTES: &str = "{serviceAccountTokenAudience: registry.io, cacheType: ServiceAccount, \
    requireServiceAccount: true, requiredServiceAccountAnnotationKeys: [example.com/role], \
    optionalServiceAccountAnnotationKeys: [Example.com/Tenant]}";

#[test]
fn token_attributes_read_in_a_v1_config_for_a_v1_plugin() {
    let providers = load_text(&with_tokens(TOKEN_ATTRIBUTES)).expect("valid");
    let expected = TokenAttributes {
        audience: "registry.io".into(),
        cache_type: CacheType::ServiceAccount,
        require_service_account: true,
        required_annotation_keys: vec!["example.com/role".into()],
        optional_annotation_keys: vec!["Example.com/Tenant".into()],
    };
    assert_eq!(providers[0].token_attributes, Some(expected));
    let minimal = "{serviceAccountTokenAudience: a, cacheType: Token, requireServiceAccount: false}";
    let attributes = load_text(&with_tokens(minimal)).expect("valid")[0].token_attributes.clone().expect("set");
    assert_eq!((attributes.cache_type, attributes.require_service_account), (CacheType::Token, false));
    assert!(attributes.required_annotation_keys.is_empty() && attributes.optional_annotation_keys.is_empty());
    assert_eq!(load_text(PROVIDER).expect("valid")[0].token_attributes, None, "absent: no token");
}

#[test]
fn invalid_token_attributes_are_refused_in_the_kubelets_words() {
    let at = "providers[0].tokenAttributes";
    let base = "serviceAccountTokenAudience: a, cacheType: Token, requireServiceAccount: true";
    let name_format = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
    let cases = [
        (
            "{cacheType: Token, requireServiceAccount: true}".to_owned(),
            format!("{at}.serviceAccountTokenAudience: Required value"),
        ),
        (
            "{serviceAccountTokenAudience: a, cacheType: Token}".to_owned(),
            format!("{at}.requireServiceAccount: Required value"),
        ),
        (
            "{serviceAccountTokenAudience: a, cacheType: Token, requireServiceAccount: false, requiredServiceAccountAnnotationKeys: [k]}".to_owned(),
            format!("{at}.requiredServiceAccountAnnotationKeys: Forbidden: requireServiceAccount cannot be false when requiredServiceAccountAnnotationKeys is set"),
        ),
        (
            format!("{{{base}, requiredServiceAccountAnnotationKeys: [cantendwithadash-]}}"),
            format!("{at}.requiredServiceAccountAnnotationKeys: Invalid value: \"cantendwithadash-\": name part {name_format}"),
        ),
        (
            format!("{{{base}, optionalServiceAccountAnnotationKeys: [a/b/c]}}"),
            format!("{at}.optionalServiceAccountAnnotationKeys: Invalid value: \"a/b/c\": a qualified name {name_format} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"),
        ),
        (
            format!("{{{base}, optionalServiceAccountAnnotationKeys: [/name]}}"),
            format!("{at}.optionalServiceAccountAnnotationKeys: Invalid value: \"/name\": prefix part must be non-empty"),
        ),
        (
            format!("{{{base}, optionalServiceAccountAnnotationKeys: [-bad.io/name]}}"),
            format!("{at}.optionalServiceAccountAnnotationKeys: Invalid value: \"-bad.io/name\": prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"),
        ),
        (
            format!("{{{base}, optionalServiceAccountAnnotationKeys: [{}]}}", "n".repeat(64)),
            format!("{at}.optionalServiceAccountAnnotationKeys: Invalid value: \"{}\": name part must be no more than 63 characters", "n".repeat(64)),
        ),
        (
            format!("{{{base}, optionalServiceAccountAnnotationKeys: [now-with-dashes/simple, now-with-dashes/simple]}}"),
            format!("{at}.optionalServiceAccountAnnotationKeys: Duplicate value: \"now-with-dashes/simple\""),
        ),
        (
            format!("{{{base}, requiredServiceAccountAnnotationKeys: [k, k]}}"),
            format!("{at}.requiredServiceAccountAnnotationKeys: Duplicate value: \"k\""),
        ),
        (
            format!("{{{base}, requiredServiceAccountAnnotationKeys: [now-with-dashes/simple-1, now-with-dashes/simple-2], optionalServiceAccountAnnotationKeys: [now-with-dashes/simple-2, now-with-dashes/simple-3]}}"),
            format!("{at}: Invalid value: [\"now-with-dashes/simple-2\"]: annotation keys cannot be both required and optional"),
        ),
        (
            "{serviceAccountTokenAudience: a, requireServiceAccount: true}".to_owned(),
            format!("{at}.cacheType: Required value: cacheType is required to be set when tokenAttributes is specified. Supported values are: ServiceAccount, Token"),
        ),
        (
            "{serviceAccountTokenAudience: a, cacheType: invalid-cache-type, requireServiceAccount: true}".to_owned(),
            format!("{at}.cacheType: Unsupported value: \"invalid-cache-type\": supported values: \"ServiceAccount\", \"Token\""),
        ),
    ];
    for (attributes, expected) in cases {
        let error = refusal(&with_tokens(&attributes));
        assert!(error.ends_with(&expected), "{attributes}:\n{error}\n does not end with\n{expected}");
    }
}

#[test]
fn token_attributes_are_refused_outside_a_v1_config_and_a_v1_plugin() {
    let v1beta1_plugin = with_tokens(TOKEN_ATTRIBUTES).replace(
        "apiVersion: credentialprovider.kubelet.k8s.io/v1\n",
        "apiVersion: credentialprovider.kubelet.k8s.io/v1beta1\n",
    );
    assert!(refusal(&v1beta1_plugin).ends_with(
        "providers[0].tokenAttributes: Forbidden: tokenAttributes is only supported for credentialprovider.kubelet.k8s.io/v1 API version"
    ));
    for version in ["v1beta1", "v1alpha1"] {
        let older = with_tokens(TOKEN_ATTRIBUTES).replace(
            "apiVersion: kubelet.config.k8s.io/v1\n",
            &format!("apiVersion: kubelet.config.k8s.io/{version}\n"),
        );
        let error = refusal(&older);
        assert!(error.contains("providers[0].tokenAttributes: unknown field \"tokenAttributes\""), "{error}");
    }
    let typo =
        with_tokens("{serviceAccountTokenAudience: a, cacheType: Token, requireServiceAccount: true, audiences: [b]}");
    let error = refusal(&typo);
    assert!(error.contains("unknown field `audiences`"), "{error}");
}
