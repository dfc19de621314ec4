//! The kubelet's keyring test tables (`keyring_test.go`), case by case, in our words.

use std::sync::Arc;

use super::*;
use crate::credentials::{CredentialSource, RegistryAuth, dockercfg};

fn credential(username: &str) -> Arc<Credential> {
    let auth = RegistryAuth::login(username.into(), format!("{username}-password").into());
    Arc::new(Credential { auth: Arc::new(auth), source: CredentialSource::NodeConfig })
}

fn usernames(found: &[Arc<Credential>]) -> Vec<String> {
    use secrecy::ExposeSecret;
    found.iter().map(|credential| credential.auth.username.expose_secret().to_owned()).collect()
}

/// A keyring read from a docker config holding one entry, `key` → foo:bar.
fn keyring_with(key: &str) -> Keyring {
    let document = serde_json::json!({ key: { "email": "foo@bar.baz", "auth": "Zm9vOmJhcg==" } }).to_string();
    let mut keyring = Keyring::default();
    for entry in dockercfg::parse(document.as_bytes(), dockercfg::Shape::Dockercfg).expect("valid") {
        keyring
            .add(&entry.key, Arc::new(Credential { auth: Arc::new(entry.auth), source: CredentialSource::NodeConfig }));
    }
    keyring
}

#[test]
fn host_globs_ports_and_paths_match_as_the_kubelet_matches_them() {
    let cases = [
        ("*.kubernetes.io", "prefix.kubernetes.io", true),
        ("prefix.*.io", "prefix.kubernetes.io", true),
        ("prefix.kubernetes.*", "prefix.kubernetes.io", true),
        ("*-good.kubernetes.io", "prefix-good.kubernetes.io", true),
        ("*.kubernetes.io/blah", "prefix.kubernetes.io/blah", true),
        ("prefix.*.io/foo", "prefix.kubernetes.io/foo/bar", true),
        ("*.kubernetes.io:1111/blah", "prefix.kubernetes.io:1111/blah", true),
        ("prefix.*.io:1111/foo", "prefix.kubernetes.io:1111/foo/bar", true),
        // A glob label never spans a dot: the hosts must have as many labels.
        ("*.kubernetes.io", "kubernetes.io", false),
        ("*.*.kubernetes.io", "prefix.kubernetes.io", false),
        ("*.*.kubernetes.io", "kubernetes.io", false),
        ("*kubernetes.io", "a.kubernetes.io", false),
        ("*kubernetes.io", "kubernetes.io", true),
        ("*.*.*.kubernetes.io", "a.b.c.kubernetes.io", true),
        ("kubernetes.io", "kubernetes.com", false),
        ("k*.io", "quay.io", false),
        // Ports must be equal, and no port is a port of its own.
        ("*.kubernetes.io:1234/blah", "prefix.kubernetes.io:1111/blah", false),
        ("prefix.*.io/foo", "prefix.kubernetes.io:1111/foo/bar", false),
        ("registry.local", "registry.local:5000/app", false),
        ("registry.local:5000", "registry.local/app", false),
        // The path is a plain string prefix, not a path prefix.
        ("registry.local/team", "registry.local/teamwork/app", true),
        ("registry.local/team/", "registry.local/team", false),
    ];
    for (glob, target, expected) in cases {
        assert_eq!(urls_match(glob, target), expected, "{glob:?} against {target:?}");
    }
}

#[test]
fn keys_written_with_schemes_globs_ports_and_api_paths_match_images_below_them() {
    let cases = [
        ("https://hello.kubernetes.io", "hello.kubernetes.io"),
        ("https://*.docker.io", "prefix.docker.io"),
        ("https://prefix.*.io", "prefix.docker.io"),
        ("https://prefix.docker.*", "prefix.docker.io"),
        ("https://*.docker.io/path", "prefix.docker.io/path"),
        ("https://prefix.*.io/path", "prefix.docker.io/path/subpath"),
        ("https://prefix.docker.*/path", "prefix.docker.io/path"),
        ("https://*.docker.io:8888", "prefix.docker.io:8888"),
        ("https://prefix.*.io:8888", "prefix.docker.io:8888"),
        ("https://prefix.docker.*:8888", "prefix.docker.io:8888"),
        ("https://*.docker.io/path:1111", "prefix.docker.io/path:1111"),
        ("https://*.docker.io/v1/", "prefix.docker.io/path:1111"),
        ("https://*.docker.io/v2/", "prefix.docker.io/path:1111"),
        ("https://prefix.docker.*/path:1111", "prefix.docker.io/path:1111"),
        ("prefix.docker.io:1111", "prefix.docker.io:1111/path"),
        ("*.docker.io:1111", "prefix.docker.io:1111/path"),
    ];
    for (key, image) in cases {
        let found = keyring_with(key).lookup(&format!("{image}/foo/bar"));
        assert_eq!(usernames(&found), ["foo"], "key {key:?}, image {image:?}");
    }
}

#[test]
fn keys_that_do_not_cover_an_image_give_it_nothing() {
    let cases = [
        ("https://hello.kubernetes.io", "world.mesos.org/foo/bar"),
        ("https://*.docker.com", "prefix.docker.io"),
        ("https://suffix.*.io", "prefix.docker.io"),
        ("https://prefix.docker.c*", "prefix.docker.io"),
        ("https://prefix.*.io/path:1111", "prefix.docker.io/path/subpath:1111"),
        ("suffix.*.io", "prefix.docker.io"),
    ];
    for (key, image) in cases {
        let found = keyring_with(key).lookup(&format!("{image}/foo/bar"));
        assert!(found.is_empty(), "key {key:?} must not cover {image:?}");
    }
}

#[test]
fn docker_hub_credentials_apply_to_docker_hub_images_only() {
    let keyring = keyring_with("https://index.docker.io/v1/");
    assert!(keyring.lookup("world.mesos.org/foo/bar").is_empty());
    for image in ["google/docker-registry", "jenkins", "docker.io/library/busybox", "index.docker.io/team/app"] {
        assert_eq!(usernames(&keyring.lookup(image)), ["foo"], "{image:?} is on Docker Hub");
    }
    let found = keyring.lookup("index.docker.io/v1//google/docker-registry");
    assert_eq!(usernames(&found)[0], "foo");
}

#[test]
fn docker_hub_fallback_applies_only_when_no_key_matched() {
    let mut keyring = Keyring::default();
    keyring.add("https://index.docker.io/v1/", credential("hub"));
    keyring.add("docker.io/team", credential("team"));
    assert_eq!(usernames(&keyring.lookup("docker.io/team/app")), ["team"]);
    assert_eq!(usernames(&keyring.lookup("docker.io/other/app")), ["hub"]);
}

#[test]
fn which_images_are_on_the_default_registry() {
    for image in ["foo/bar", "docker.io/foo/bar", "index.docker.io/foo/bar", "foo"] {
        assert!(is_default_registry(image), "{image:?}");
    }
    for image in ["", "registry.tld/foo/bar", "registry:5000/foo/bar", "myhostdocker.io/foo/bar"] {
        assert!(!is_default_registry(image), "{image:?}");
    }
}

#[test]
fn every_matching_key_contributes_the_most_specific_first() {
    let mut keyring = Keyring::default();
    keyring.add("bar.example.com/pong", credential("grace"));
    keyring.add("bar.example.com", credential("ada"));
    let cases: [(&str, &[&str]); 7] = [
        ("bar.example.com", &["ada"]),
        ("bar.example.com/pong", &["grace", "ada"]),
        ("bar.example.com/ping", &["ada"]),
        ("bar.example.com/pongz", &["grace", "ada"]),
        ("bar.example.com/pong/pang", &["grace", "ada"]),
        ("example.com", &[]),
        ("foo.example.com", &[]),
    ];
    for (image, expected) in cases {
        assert_eq!(usernames(&keyring.lookup(image)), expected, "{image:?}");
    }
}

#[test]
fn a_registry_key_with_an_api_path_covers_the_whole_registry() {
    let keyring = keyring_with("https://quay.io/v1/");
    for image in ["quay.io", "quay.io/foo", "quay.io/foo/bar"] {
        assert_eq!(usernames(&keyring.lookup(image)), ["foo"], "{image:?}");
    }
}

#[test]
fn credentials_under_one_key_keep_the_order_they_were_added() {
    let mut keyring = Keyring::default();
    keyring.add("registry.local", credential("first"));
    keyring.add("https://registry.local/v2/", credential("second"));
    keyring.add("http://registry.local", credential("third"));
    assert_eq!(keyring.len(), 1, "three spellings of one key");
    assert_eq!(usernames(&keyring.lookup("registry.local/app")), ["first", "second", "third"]);
}

#[test]
fn keys_are_normalised_as_the_kubelet_stores_them() {
    let cases = [
        ("https://quay.io/v1/", Some("quay.io")),
        ("https://*.docker.io/v2/", Some("*.docker.io")),
        ("http://foo.example.com/a/", Some("foo.example.com/a/")),
        ("prefix.docker.io:1111", Some("prefix.docker.io:1111")),
        ("https://index.docker.io/v1/", Some("index.docker.io")),
        ("registry.local/v2", Some("registry.local/v2")),
        ("Registry.Local", Some("Registry.Local")),
        ("registry.local:port", None),
        ("registry local", None),
        ("%invalid%", None),
        ("registry.local/%zz", None),
    ];
    for (location, expected) in cases {
        assert_eq!(normalise_key(location).as_deref(), expected, "{location:?}");
    }
}

#[test]
fn a_key_that_is_not_a_url_is_skipped_and_matches_nothing() {
    let mut keyring = Keyring::default();
    assert!(!keyring.add("registry local", credential("spaced")));
    assert!(keyring.add("*[.local", credential("bad-glob")), "a bad glob is a valid URL");
    assert!(keyring.lookup("a.local/app").is_empty());
    assert!(keyring.lookup("*[.local/app").is_empty(), "a malformed glob matches not even itself");
}

#[test]
fn a_keyring_for_one_image_answers_for_it_as_a_full_keyring_does() {
    let keys = [
        "https://index.docker.io/v1/",
        "docker.io/team",
        "registry.local",
        "registry.local/team",
        "registry.local:5000",
        "*.registry.local",
        "https://*.docker.io/v2/",
        "%invalid%",
        "*[.local",
    ];
    let images = [
        "docker.io/library/busybox",
        "docker.io/team/app",
        "registry.local/team/app",
        "registry.local/other",
        "registry.local:5000/app",
        "a.registry.local/app",
        "prefix.docker.io/x",
        "jenkins",
        "not a url",
    ];
    for image in images {
        let mut full = Keyring::default();
        let mut only = Keyring::for_image(image);
        for (index, key) in keys.iter().enumerate() {
            full.add(key, credential(&format!("user-{index}")));
            only.add(key, credential(&format!("user-{index}")));
        }
        assert_eq!(usernames(&only.lookup(image)), usernames(&full.lookup(image)), "{image:?}");
        assert!(only.len() <= full.len());
    }
}
