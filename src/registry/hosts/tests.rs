use std::fs;

use super::*;

fn write(dir: &Path, name: &str, text: &str) {
    let host = dir.join(name);
    fs::create_dir_all(&host).expect("host dir");
    fs::write(host.join("hosts.toml"), text).expect("hosts.toml");
}

fn places(endpoints: &[Endpoint]) -> Vec<String> {
    endpoints
        .iter()
        .map(|endpoint| {
            let scheme = if endpoint.plain_http { "http" } else { "https" };
            format!("{scheme}://{}{}", endpoint.authority(), endpoint.root)
        })
        .collect()
}

#[test]
fn without_settings_a_registry_is_reached_as_containerd_reaches_it_by_default() {
    let dir = tempfile::tempdir().expect("tempdir");
    for config in [HostsConfig::default(), HostsConfig::load(&dir.path().join("absent")), HostsConfig::load(dir.path())]
    {
        assert_eq!(places(&config.endpoints("docker.io")), ["https://registry-1.docker.io:443/v2"]);
        assert_eq!(places(&config.endpoints("127.0.0.1:5000")), ["http://127.0.0.1:5000/v2"]);
        assert!(config.endpoints("quay.io")[0].tls.is_system());
    }
}

#[test]
fn mirrors_come_first_in_the_files_order_each_with_its_capabilities_headers_and_ca() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(
        dir.path(),
        "docker.io",
        r#"
server = "https://registry-1.docker.io"
[host."https://pull-only.example.com"]
  capabilities = ["pull"]
  ca = "missing.crt"
[host."http://10.0.0.7:5000/cache"]
  capabilities = ["pull", "resolve"]
  [host."http://10.0.0.7:5000/cache".header]
    x-mirror = "a"
"#,
    );
    let config = HostsConfig::load(dir.path());
    let endpoints = config.endpoints("docker.io");
    assert_eq!(
        places(&endpoints),
        [
            "https://pull-only.example.com:443/v2",
            "http://10.0.0.7:5000/cache/v2",
            "https://registry-1.docker.io:443/v2"
        ]
    );
    assert_eq!(endpoints[0].capabilities, Capabilities { resolve: false, pull: true });
    assert_eq!(endpoints[1].headers[0].0.as_str(), "x-mirror");
    // A `ca` that does not read is said at each connection to that host, not at start.
    let broken = endpoints[0].tls.broken().expect("broken");
    assert!(broken.contains("missing.crt") && broken.contains("no such file"), "{broken}");
    assert!(endpoints[2].tls.is_system());
    // The settings are kept, not read again per verification.
    assert!(Arc::ptr_eq(&config.endpoints("docker.io")[0].tls, &endpoints[0].tls));
    assert_eq!(places(&config.endpoints("quay.io")), ["https://quay.io:443/v2"]);
}

#[test]
fn host_directories_are_looked_up_as_containerd_looks_them_up() {
    let (first, second) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    write(first.path(), "r.example:5000", "server = \"https://colon.example\"");
    write(first.path(), "r.example_5000_", "server = \"https://underscore.example\"");
    write(first.path(), "_default", "server = \"https://fallback.example\"");
    write(second.path(), "quay.io", "server = \"https://second.example\"");
    write(second.path(), "ghcr.io", "server = \"https://ghcr-second.example\"");
    fs::create_dir_all(first.path().join("ghcr.io")).expect("a directory without hosts.toml");
    let path = format!("{}:{}", first.path().display(), second.path().display());
    let config = HostsConfig::load(Path::new(&path));
    assert_eq!(places(&config.endpoints("r.example:5000")), ["https://underscore.example:443/v2"]);
    // The first directory's _default is before the second directory's host.
    assert_eq!(places(&config.endpoints("quay.io")), ["https://fallback.example:443/v2"]);
    // A host directory without hosts.toml is containerd's default host (with its *.crt files).
    assert_eq!(places(&config.endpoints("ghcr.io")), ["https://ghcr.io:443/v2"]);
}

#[test]
fn a_file_containerd_cannot_read_leaves_dockers_crt_files_as_it_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "r.example", "capabilities = [\"fetch\"]");
    fs::write(dir.path().join("r.example/ca.crt"), "not a certificate").expect("crt");
    let config = HostsConfig::load(dir.path());
    let endpoints = config.endpoints("r.example");
    assert_eq!(places(&endpoints), ["https://r.example:443/v2"]);
    let broken = endpoints[0].tls.broken().expect("a crt without a certificate");
    assert!(broken.contains("no PEM certificate"), "{broken}");
}

#[test]
fn the_settings_in_force_are_replaced_whole() {
    let hosts = RegistryHosts::default();
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "r.example", "server = \"http://r.example:8080\"");
    let before = hosts.current();
    hosts.replace(HostsConfig::load(dir.path()));
    assert_eq!(places(&before.endpoints("r.example")), ["https://r.example:443/v2"]);
    assert_eq!(places(&hosts.current().endpoints("r.example")), ["http://r.example:8080/v2"]);
}
