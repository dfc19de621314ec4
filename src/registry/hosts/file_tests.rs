use super::*;

/// containerd's own example (core/remotes/docker/config/hosts_test.go, TestParseHostFile).
const CONTAINERD_EXAMPLE: &str = r#"
server = "https://test-default.registry"
ca = "/etc/path/default"
[header]
  x-custom-1 = "custom header"

[host."https://mirror.registry"]
  capabilities = ["pull"]
  ca = "/etc/certs/mirror.pem"
  skip_verify = false
  [host."https://mirror.registry".header]
    x-custom-2 = ["value1", "value2"]

[host."https://mirror-bak.registry/us"]
  capabilities = ["pull"]
  skip_verify = true

[host."http://mirror.registry"]
  capabilities = ["pull"]

[host."https://test-1.registry"]
  capabilities = ["pull", "resolve", "push"]
  ca = ["/etc/certs/test-1-ca.pem", "/etc/certs/special.pem"]
  client = [["/etc/certs/client.cert", "/etc/certs/client.key"],["/etc/certs/client.pem", ""]]

[host."https://non-compliant-mirror.registry/v2/upstream"]
  capabilities = ["pull"]
  override_path = true
"#;

fn url(plain_http: bool, authority: &str, root: &str) -> Option<HostUrl> {
    Some(HostUrl { plain_http, authority: authority.into(), root: root.into() })
}

const PULL: Option<Capabilities> = Some(Capabilities { resolve: false, pull: true });

#[test]
fn containerds_example_reads_as_containerd_reads_it_mirrors_first_in_order_the_server_last() {
    let parsed = parse(CONTAINERD_EXAMPLE, Path::new("/etc/containerd/certs.d/test-default.registry")).expect("parsed");
    let urls: Vec<_> = parsed.hosts.iter().map(|host| host.url.clone()).collect();
    assert_eq!(
        urls,
        [
            url(false, "mirror.registry", "/v2"),
            url(false, "mirror-bak.registry", "/us/v2"),
            url(true, "mirror.registry", "/v2"),
            url(false, "test-1.registry", "/v2"),
            url(false, "non-compliant-mirror.registry", "/v2/upstream"),
            url(false, "test-default.registry", "/v2"),
        ]
    );
    let mirror = &parsed.hosts[0];
    assert_eq!(mirror.capabilities, PULL);
    assert_eq!(mirror.ca, [PathBuf::from("/etc/certs/mirror.pem")]);
    assert_eq!(mirror.skip_verify, Some(false));
    assert_eq!(mirror.headers, [("x-custom-2".into(), "value1".into()), ("x-custom-2".into(), "value2".into())]);
    assert_eq!(parsed.hosts[1].skip_verify, Some(true));
    assert_eq!(parsed.hosts[3].capabilities, Some(Capabilities::ALL));
    assert_eq!(parsed.hosts[3].ca.len(), 2);
    let server = parsed.hosts.last().expect("the server");
    assert_eq!((server.capabilities, server.ca.as_slice()), (None, &[PathBuf::from("/etc/path/default")][..]));
    assert_eq!(server.headers, [("x-custom-1".into(), "custom header".into())]);
    // Client certificates are known to containerd, not honoured here: said, not refused.
    assert_eq!(parsed.ignored, [r#"host."https://test-1.registry".client"#]);
}

#[test]
fn without_a_server_the_top_level_is_the_default_host_and_paths_are_the_files_directory() {
    let text = r#"
[host."docker-mirror.internal"]
  capabilities = ["pull", "resolve"]
  ca = "docker-mirror.crt"
  dial_timeout = "3s"
"#;
    let parsed = parse(text, Path::new("/etc/containerd/certs.d/docker.io")).expect("parsed");
    assert_eq!(parsed.hosts.len(), 2);
    let mirror = &parsed.hosts[0];
    // No scheme is https, as containerd takes it.
    assert_eq!(mirror.url, url(false, "docker-mirror.internal", "/v2"));
    assert_eq!(mirror.ca, [PathBuf::from("/etc/containerd/certs.d/docker.io/docker-mirror.crt")]);
    assert_eq!(mirror.dial_timeout, Some(Duration::from_secs(3)));
    assert_eq!(parsed.hosts[1].url, None);
    assert_eq!(parse("", Path::new("/d")).expect("empty").hosts.len(), 1);
}

#[test]
fn the_local_stacks_file_and_dotted_keys_read_too() {
    // What tests/support writes (containerd 1.6 needs the empty [host]).
    let parsed = parse("server = \"http://127.0.0.1:5001\"\n\n[host]\n", Path::new("/d")).expect("parsed");
    assert_eq!(parsed.hosts.len(), 1);
    assert_eq!(parsed.hosts[0].url, url(true, "127.0.0.1:5001", "/v2"));
    let dotted = "host.\"https://m.example\".capabilities = [\"resolve\"]\nserver = \"https://r.example/\"\n";
    let parsed = parse(dotted, Path::new("/d")).expect("parsed");
    assert_eq!(parsed.hosts[0].capabilities, Some(Capabilities { resolve: true, pull: false }));
    assert_eq!(parsed.hosts[1].url, url(false, "r.example", "/v2"));
}

#[test]
fn unknown_keys_are_passed_over_and_named_but_a_wrong_type_or_capability_refuses_the_file() {
    let parsed = parse("server = \"https://r\"\nmirrors = 3\n[host.\"https://m\"]\nauth = \"x\"\n", Path::new("/d"))
        .expect("parsed");
    assert_eq!(parsed.ignored, [r#"host."https://m".auth"#, "mirrors"]);
    let refused = |text: &str| parse(text, Path::new("/d")).expect_err(text).to_string();
    assert!(refused("capabilities = [\"fetch\"]").contains("unknown capability \"fetch\""));
    assert!(refused("skip_verify = \"yes\"").contains("skip_verify: expected true or false"));
    assert!(refused("ca = 3").contains("ca: expected a string or a list of strings"));
    assert!(refused("server = \"ftp://x\"").contains("is not an http or https URL"));
    assert!(refused("server = \"https://user:pw@x\"").contains("is not an http or https URL"));
    assert!(refused("[host.\"https://m\"]\ndial_timeout = \"soon\"").contains("not a Go duration"));
    assert!(refused("server = ").starts_with("not TOML"));
}

#[test]
fn hostile_files_end_without_panic() {
    for text in ["[host]\n[host.x]\n", "host = 1", "[[host]]\n", "header = 1", "[header]\nx = 1", "\u{0}"] {
        let _ = parse(text, Path::new("/d"));
    }
}
