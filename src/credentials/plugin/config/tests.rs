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
        (
            "    env:",
            "    tokenAttributes: {serviceAccountTokenAudience: x}\n    env:",
            "providers[0].tokenAttributes: service account tokens are not supported by cri-imaged",
        ),
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
