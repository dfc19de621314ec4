use std::path::{Path, PathBuf};

use super::*;
use crate::registry::HostsConfig;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/registries_conf/registries.conf")
}

fn mirror(location: &str) -> ConfHost {
    ConfHost { location: location.into(), insecure: false }
}

#[test]
fn a_v2_file_names_each_registrys_mirrors_location_insecure_and_blocked() {
    let text = std::fs::read_to_string(fixture()).expect("fixture");
    let parsed = parse(&text).expect("parses");
    assert_eq!(
        parsed.registries,
        vec![
            ConfRegistry {
                prefix: "docker.io".into(),
                location: mirror("docker.io"),
                mirrors: vec![mirror("mirror.example.com:5000"), mirror("127.0.0.1:5001")],
                blocked: false,
            },
            ConfRegistry {
                prefix: "registry.internal:5000".into(),
                location: ConfHost { location: "registry.internal:5000".into(), insecure: true },
                mirrors: vec![],
                blocked: false,
            },
            ConfRegistry {
                prefix: "evil.example.com".into(),
                location: mirror("evil.example.com"),
                mirrors: vec![],
                blocked: true,
            },
        ]
    );
    assert_eq!(parsed.ignored, vec!["registry[3] (quay.io/team)".to_owned()], "a namespace prefix is passed over");
}

#[test]
fn bad_files_say_which_line_or_field() {
    let line = parse("[[registry]]\nprefix = \"a.io\"\nlocation = = 1\n").expect_err("not TOML");
    assert!(matches!(line, RegistriesConfError::Toml { line: 3, .. }), "{line}");
    assert_eq!(
        parse("[[registry]]\nprefix = \"a.io\"\ninsecure = \"yes\"\n").expect_err("a string"),
        RegistriesConfError::Type { key: "registry[0].insecure".into(), expected: "true or false" }
    );
    assert_eq!(
        parse("[[registry]]\nprefix = \"a.io\"\n[[registry.mirror]]\nlocation = 5\n").expect_err("a number"),
        RegistriesConfError::Type { key: "registry[0].mirror[0].location".into(), expected: "a string" }
    );
    assert_eq!(
        parse("[[registry]]\ninsecure = true\n").expect_err("no name"),
        RegistriesConfError::Unnamed { key: "registry[0]".into() }
    );
    assert_eq!(
        parse("[registries.search]\nregistries = [\"docker.io\"]\n").expect_err("v1"),
        RegistriesConfError::Version1
    );
    let unknown = parse("[[registry]]\nprefix = \"a.io\"\nfuture = 1\n").expect("unknown keys are passed over");
    assert_eq!(unknown.ignored, vec!["registry[0].future".to_owned()]);
}

#[test]
fn drop_ins_override_by_prefix_in_lexical_order_and_blocked_hosts_are_never_asked() {
    let hosts = HostsConfig::load_either(Path::new("/nonexistent/certs.d"), &fixture());
    let authorities = |domain: &str| -> Vec<(bool, String)> {
        hosts.endpoints(domain).iter().map(|endpoint| (endpoint.plain_http, endpoint.authority())).collect()
    };
    // 10-mirror.conf replaced the file's Docker Hub entry: its one mirror, then Docker Hub.
    assert_eq!(
        authorities("docker.io"),
        vec![(true, "127.0.0.1:5002".into()), (false, "registry-1.docker.io:443".into())]
    );
    // Insecure: TLS unverified first, then plain HTTP.
    assert_eq!(
        authorities("registry.internal:5000"),
        vec![(false, "registry.internal:5000".into()), (true, "registry.internal:5000".into())]
    );
    assert!(hosts.endpoints("evil.example.com").is_empty(), "blocked in the file");
    assert!(hosts.endpoints("ghcr.io").is_empty(), "blocked by a drop-in");
    assert_eq!(authorities("other.example.com"), vec![(false, "other.example.com:443".into())], "as by default");
}

#[test]
fn hosts_toml_directories_win_over_a_registries_conf() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hosts = HostsConfig::load_either(dir.path(), &fixture());
    assert!(!hosts.endpoints("evil.example.com").is_empty(), "a node with hosts.toml directories is containerd's");
    let unread = HostsConfig::load_either(Path::new("/nonexistent/certs.d"), Path::new(""));
    assert!(!unread.endpoints("evil.example.com").is_empty(), "an empty --registries-conf is never read");
}

#[test]
fn a_registries_conf_that_is_not_a_regular_file_is_not_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("registries.conf");
    nix_mkfifo(&fifo);
    let hosts = HostsConfig::load_either(Path::new("/nonexistent/certs.d"), &fifo);
    assert_eq!(hosts.endpoints("docker.io").len(), 1, "defaults: the FIFO was refused without blocking");
}

fn nix_mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo").arg(path).status().expect("mkfifo runs");
    assert!(status.success());
}
