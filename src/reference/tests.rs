// Cases ported from github.com/distribution/reference reference_test.go and normalize_test.go at commit 0965666a6ade2e06035fe352e38344be1e68951a (v0.6.0+22).

use super::*;

const SHA256_FF: &str = "sha256:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff";
const SHA512_FF: &str = "sha512:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff";
const SHA256_BUSYBOX: &str = "sha256:e6693c20186f837fc393390135d8a598a96a833917917789d63766cab6c59582";
const HEX64: &str = "1a3f5e7d9c1b3a5f7e9d1c3b5a7f9e1d3c5b7a9f1e3d5d7c9b1a3f5e7d9c1b3a";

fn parse_ok(input: &str) -> ImageReference {
    match ImageReference::parse(input) {
        Ok(r) => r,
        Err(e) => panic!("parse({input:?}) failed: {e}"),
    }
}

fn normalized_ok(input: &str) -> ImageReference {
    match ImageReference::parse_normalized(input) {
        Ok(r) => r,
        Err(e) => panic!("parse_normalized({input:?}) failed: {e}"),
    }
}

/// One successful `Parse` row: Go's `repository` column is `Name()`.
struct Accepted<'a> {
    input: &'a str,
    name: &'a str,
    domain: &'a str,
    tag: Option<&'a str>,
    digest: Option<&'a str>,
}

const fn ok<'a>(
    input: &'a str,
    name: &'a str,
    domain: &'a str,
    tag: Option<&'a str>,
    digest: Option<&'a str>,
) -> Accepted<'a> {
    Accepted { input, name, domain, tag, digest }
}

#[test]
fn parse_accepts_and_splits_the_go_reference_table() {
    let with_tag_and_digest = format!("test:5000/repo:tag@{SHA256_FF}");
    let with_digest = format!("test:5000/repo@{SHA256_FF}");
    let many_components = format!("{}a", "a/".repeat(127));
    let many_components_tagged = format!("{many_components}:tag-puts-this-over-max");
    let max_path = format!("example.com/{}", "a".repeat(255));
    let max_path_tagged = format!("{max_path}:tag");
    let punycode_sha256 = format!("xn--7o8h.com/myimage:xn--7o8h.com@{SHA256_FF}");
    // v0.6.0's form of the same row; upstream HEAD switched it to sha256 only because
    // its tests no longer import crypto/sha512. Our digest rules accept sha512.
    let punycode_sha512 = format!("xn--7o8h.com/myimage:xn--7o8h.com@{SHA512_FF}");
    let v6_digest = format!("[2001:db8::1]:5000/repo@{SHA256_FF}");
    let v6_tag_digest = format!("[2001:db8::1]:5000/repo:tag@{SHA256_FF}");
    let serialization_digest = "sha256:1234567890098765432112345667890098765432112345667890098765432112";
    let serialization_input = format!("other.com/named@{serialization_digest}");
    let sha384 = format!("sha384:{}", "f".repeat(96));
    let sha384_input = format!("validname@{sha384}");

    let rows = [
        // TestReferenceParse
        ok("test_com", "test_com", "", None, None),
        ok("test.com:tag", "test.com", "", Some("tag"), None),
        ok("test.com:5000", "test.com", "", Some("5000"), None),
        ok("test.com/repo:tag", "test.com/repo", "test.com", Some("tag"), None),
        ok("test:5000/repo", "test:5000/repo", "test:5000", None, None),
        ok("test:5000/repo:tag", "test:5000/repo", "test:5000", Some("tag"), None),
        ok(&with_digest, "test:5000/repo", "test:5000", None, Some(SHA256_FF)),
        ok(&with_tag_and_digest, "test:5000/repo", "test:5000", Some("tag"), Some(SHA256_FF)),
        ok("lowercase:Uppercase", "lowercase", "", Some("Uppercase"), None),
        ok(&many_components_tagged, &many_components, "a", Some("tag-puts-this-over-max"), None),
        ok("sub-dom1.foo.com/bar/baz/quux", "sub-dom1.foo.com/bar/baz/quux", "sub-dom1.foo.com", None, None),
        ok(
            "sub-dom1.foo.com/bar/baz/quux:some-long-tag",
            "sub-dom1.foo.com/bar/baz/quux",
            "sub-dom1.foo.com",
            Some("some-long-tag"),
            None,
        ),
        ok(
            "b.gcr.io/test.example.com/my-app:test.example.com",
            "b.gcr.io/test.example.com/my-app",
            "b.gcr.io",
            Some("test.example.com"),
            None,
        ),
        ok("xn--n3h.com/myimage:xn--n3h.com", "xn--n3h.com/myimage", "xn--n3h.com", Some("xn--n3h.com"), None),
        ok(&punycode_sha256, "xn--7o8h.com/myimage", "xn--7o8h.com", Some("xn--7o8h.com"), Some(SHA256_FF)),
        ok(&punycode_sha512, "xn--7o8h.com/myimage", "xn--7o8h.com", Some("xn--7o8h.com"), Some(SHA512_FF)),
        ok("foo_bar.com:8080", "foo_bar.com", "", Some("8080"), None),
        ok("foo/foo_bar.com:8080", "foo/foo_bar.com", "foo", Some("8080"), None),
        ok("192.168.1.1", "192.168.1.1", "", None, None),
        ok("192.168.1.1:tag", "192.168.1.1", "", Some("tag"), None),
        ok("192.168.1.1:5000", "192.168.1.1", "", Some("5000"), None),
        ok("192.168.1.1/repo", "192.168.1.1/repo", "192.168.1.1", None, None),
        ok("192.168.1.1:5000/repo", "192.168.1.1:5000/repo", "192.168.1.1:5000", None, None),
        ok("192.168.1.1:5000/repo:5050", "192.168.1.1:5000/repo", "192.168.1.1:5000", Some("5050"), None),
        ok("[2001:db8::1]/repo", "[2001:db8::1]/repo", "[2001:db8::1]", None, None),
        ok(
            "[2001:db8:1:2:3:4:5:6]/repo:tag",
            "[2001:db8:1:2:3:4:5:6]/repo",
            "[2001:db8:1:2:3:4:5:6]",
            Some("tag"),
            None,
        ),
        ok("[2001:db8::1]:5000/repo", "[2001:db8::1]:5000/repo", "[2001:db8::1]:5000", None, None),
        ok("[2001:db8::1]:5000/repo:tag", "[2001:db8::1]:5000/repo", "[2001:db8::1]:5000", Some("tag"), None),
        ok(&v6_digest, "[2001:db8::1]:5000/repo", "[2001:db8::1]:5000", None, Some(SHA256_FF)),
        ok(&v6_tag_digest, "[2001:db8::1]:5000/repo", "[2001:db8::1]:5000", Some("tag"), Some(SHA256_FF)),
        ok("[2001:db8::]:5000/repo", "[2001:db8::]:5000/repo", "[2001:db8::]:5000", None, None),
        ok("[::1]:5000/repo", "[::1]:5000/repo", "[::1]:5000", None, None),
        ok(&max_path_tagged, &max_path, "example.com", Some("tag"), None),
        // TestDomainAndPath (WithName inputs; Parse splits them the same way)
        ok("test.com/foo", "test.com/foo", "test.com", None, None),
        ok("test_com/foo", "test_com/foo", "", None, None),
        ok("test:8080/foo", "test:8080/foo", "test:8080", None, None),
        ok("test.com:8080/foo", "test.com:8080/foo", "test.com:8080", None, None),
        ok("test-com:8080/foo", "test-com:8080/foo", "test-com:8080", None, None),
        ok("xn--n3h.com:18080/foo", "xn--n3h.com:18080/foo", "xn--n3h.com:18080", None, None),
        // TestSerialization (the parse half of each row)
        ok("example.com:8000/named", "example.com:8000/named", "example.com:8000", None, None),
        ok("example.com:8000/named:tagged", "example.com:8000/named", "example.com:8000", Some("tagged"), None),
        ok(&serialization_input, "other.com/named", "other.com", None, Some(serialization_digest)),
        // go-digest registers sha384 too (not in the Go tables)
        ok(&sha384_input, "validname", "", None, Some(sha384.as_str())),
    ];

    for row in &rows {
        let input = row.input;
        let r = parse_ok(input);
        assert_eq!(r.to_string(), input, "parse({input:?}): Display must round-trip");
        assert_eq!(r.name(), row.name, "parse({input:?}): name");
        assert_eq!(r.domain(), row.domain, "parse({input:?}): domain");
        let want_path =
            if row.domain.is_empty() { row.name.to_string() } else { row.name[row.domain.len() + 1..].to_string() };
        assert_eq!(r.path(), want_path, "parse({input:?}): path");
        assert_eq!(r.tag(), row.tag, "parse({input:?}): tag");
        assert_eq!(r.digest(), row.digest, "parse({input:?}): digest");
    }
}

/// One failing `Parse` row with the error Go expects.
struct Rejected<'a> {
    input: &'a str,
    err: ReferenceError,
}

#[test]
fn parse_rejects_the_go_reference_table_with_its_error() {
    use ReferenceError::*;
    let at_digest_only = format!("@{SHA256_FF}");
    let unknown_algorithm = format!("validname@invaliddigest:{}", "f".repeat(64));
    let too_long_tagged = format!("domain/{}:tag", "a".repeat(256));
    let too_long_name = format!("example.com/{}", "a".repeat(256));
    let upper_hex = format!("repo@sha256:{}", "F".repeat(64));
    let short_sha512 = format!("repo@sha512:{}", "f".repeat(64));

    let rows = [
        // TestReferenceParse
        Rejected { input: "", err: NameEmpty },
        Rejected { input: ":justtag", err: InvalidFormat },
        Rejected { input: &at_digest_only, err: InvalidFormat },
        Rejected { input: "repo@sha256:ffffffffffffffffffffffffffffffffff", err: InvalidDigestLength },
        Rejected { input: &unknown_algorithm, err: UnsupportedDigestAlgorithm },
        Rejected { input: "Uppercase:tag", err: ContainsUppercase },
        Rejected { input: "test:5000/Uppercase/lowercase:tag", err: ContainsUppercase },
        Rejected { input: &too_long_tagged, err: NameTooLong },
        Rejected { input: "aa/asdf$$^/aa", err: InvalidFormat },
        Rejected { input: "[2001:db8::1]", err: InvalidFormat },
        Rejected { input: "[2001:db8::1]:5000", err: InvalidFormat },
        Rejected { input: "[2001:db8::1]:tag", err: InvalidFormat },
        Rejected { input: "[fe80::1%eth0]:5000/repo", err: InvalidFormat },
        Rejected { input: "[fe80::1%@invalidzone]:5000/repo", err: InvalidFormat },
        // TestWithNameFailure (the row whose Parse error equals its WithName error)
        Rejected { input: &too_long_name, err: NameTooLong },
        // go-digest Validate, not in the Go tables: the reference grammar allows
        // [0-9a-fA-F]{32,} but sha256 hex must be 64 lowercase, sha512 128.
        Rejected { input: &upper_hex, err: InvalidDigestChars },
        Rejected { input: &short_sha512, err: InvalidDigestLength },
    ];

    for row in &rows {
        let input = row.input;
        match ImageReference::parse(input) {
            Ok(r) => panic!("parse({input:?}) succeeded as {r}, want {:?}", row.err),
            Err(e) => assert_eq!(e, row.err, "parse({input:?}): error"),
        }
    }
}

#[test]
fn normalized_parse_accepts_and_rejects_the_go_name_lists() {
    let hex_with_domain = format!("docker.io/{HEX64}");
    let valid = [
        // TestValidateReferenceName
        "docker/docker",
        "library/debian",
        "debian",
        "localhost/library/debian",
        "localhost/debian",
        "LOCALDOMAIN/library/debian",
        "LOCALDOMAIN/debian",
        "docker.io/docker/docker",
        "docker.io/library/debian",
        "docker.io/debian",
        "index.docker.io/docker/docker",
        "index.docker.io/library/debian",
        "index.docker.io/debian",
        "127.0.0.1:5000/docker/docker",
        "127.0.0.1:5000/library/debian",
        "127.0.0.1:5000/debian",
        "192.168.0.1",
        "192.168.0.1:80",
        "192.168.0.1:8/debian",
        "192.168.0.2:25000/debian",
        "thisisthesongthatneverendsitgoesonandonandonthisisthesongthatnev",
        "[fc00::1]:5000/docker",
        "[fc00::1]:5000/docker/docker",
        "[fc00:1:2:3:4:5:6:7]:5000/library/debian",
        &hex_with_domain,
        "Docker/docker",
        "DOCKER/docker",
        // TestValidateRemoteName
        "docker-rules/docker",
        "docker---rules/docker",
        "doc/docker",
        "d/docker",
        "jess/t",
        "dock__er/docker",
    ];
    let long_namespace =
        format!("{}/docker", ["this_is_not_a_valid_namespace_because_its_lenth_is_greater_than_255"; 4].join("_"));
    let invalid = [
        // TestValidateReferenceName
        "https://github.com/docker/docker",
        "docker/Docker",
        "-docker",
        "-docker/docker",
        "-docker.io/docker/docker",
        "docker///docker",
        "docker.io/docker/Docker",
        "docker.io/docker///docker",
        "[fc00::1]",
        "[fc00::1]:5000",
        "fc00::1:5000/debian",
        "[fe80::1%eth0]:5000/debian",
        "[2001:db8:3:4::192.0.2.33]:5000/debian",
        HEX64,
        // TestValidateRemoteName
        "docker-/docker",
        "-docker-/docker",
        "____/____",
        "_docker/_docker",
        "dock..er/docker",
        "dock_.er/docker",
        "dock-.er/docker",
        "docker/",
        &long_namespace,
        // TestInvalidReferenceComponents
        "-foo",
    ];

    for input in valid {
        if let Err(e) = ImageReference::parse_normalized(input) {
            panic!("parse_normalized({input:?}) should accept, got: {e}");
        }
    }
    for input in invalid {
        if let Ok(r) = ImageReference::parse_normalized(input) {
            panic!("parse_normalized({input:?}) should reject, got {r}");
        }
    }
}

/// The error Go's ParseNormalizedNamed returns (derived from normalize.go at the commit
/// above; normalize_test.go itself only asserts `err != nil` for these inputs).
#[test]
fn normalized_parse_reports_the_error_go_returns() {
    use ReferenceError::*;
    let long_namespace =
        format!("{}/docker", ["this_is_not_a_valid_namespace_because_its_lenth_is_greater_than_255"; 4].join("_"));
    let hex_redis = "dbcc1c35ac38df41fd2f5e4130b32ffdb93ebae8b3dbe638c23575912276fc9c";
    let rows = [
        Rejected { input: HEX64, err: HexIdentifier(HEX64.to_string()) },
        Rejected { input: hex_redis, err: HexIdentifier(hex_redis.to_string()) },
        // the remote name is what follows the domain split, up to the first ':'
        Rejected { input: "docker/Docker", err: RemoteNameNotLowercase("docker/Docker".into()) },
        Rejected { input: "docker.io/docker/Docker", err: RemoteNameNotLowercase("docker/Docker".into()) },
        Rejected { input: "index.docker.io/Foo/bar", err: RemoteNameNotLowercase("Foo/bar".into()) },
        Rejected { input: "Uppercase:tag", err: RemoteNameNotLowercase("library/Uppercase".into()) },
        Rejected { input: "docker.io/Busybox:latest", err: RemoteNameNotLowercase("library/Busybox".into()) },
        Rejected { input: "localhost:5000/Foo:tag", err: RemoteNameNotLowercase("Foo".into()) },
        Rejected { input: &long_namespace, err: NameTooLong },
        // "" becomes "docker.io/library/", which is not a valid reference
        Rejected { input: "", err: InvalidFormat },
        Rejected { input: "docker///docker", err: InvalidFormat },
    ];
    for row in &rows {
        let input = row.input;
        match ImageReference::parse_normalized(input) {
            Ok(r) => panic!("parse_normalized({input:?}) succeeded as {r}, want {:?}", row.err),
            Err(e) => assert_eq!(e, row.err, "parse_normalized({input:?}): error"),
        }
    }
}

/// One TestParseRepositoryInfo row: every spelling must normalise to the same reference.
struct RepositoryInfo {
    remote_name: &'static str,
    familiar_name: &'static str,
    full_name: &'static str,
    ambiguous_name: Option<&'static str>,
    domain: &'static str,
}

const fn info(
    remote_name: &'static str,
    familiar_name: &'static str,
    full_name: &'static str,
    ambiguous_name: Option<&'static str>,
    domain: &'static str,
) -> RepositoryInfo {
    RepositoryInfo { remote_name, familiar_name, full_name, ambiguous_name, domain }
}

#[test]
fn normalized_parse_matches_the_go_normalize_table() {
    let rows = [
        info("fooo", "localhost/fooo", "localhost/fooo", Some("localhost/fooo"), "localhost"),
        info("fooo/bar", "localhost/fooo/bar", "localhost/fooo/bar", Some("localhost/fooo/bar"), "localhost"),
        info("fooo", "LOCALDOMAIN/fooo", "LOCALDOMAIN/fooo", Some("LOCALDOMAIN/fooo"), "LOCALDOMAIN"),
        info("fooo/bar", "LOCALDOMAIN/fooo/bar", "LOCALDOMAIN/fooo/bar", Some("LOCALDOMAIN/fooo/bar"), "LOCALDOMAIN"),
        info("fooo/bar", "fooo/bar", "docker.io/fooo/bar", Some("index.docker.io/fooo/bar"), "docker.io"),
        info("library/ubuntu", "ubuntu", "docker.io/library/ubuntu", Some("library/ubuntu"), "docker.io"),
        info("nonlibrary/ubuntu", "nonlibrary/ubuntu", "docker.io/nonlibrary/ubuntu", None, "docker.io"),
        info("other/library", "other/library", "docker.io/other/library", None, "docker.io"),
        info(
            "private/moonbase",
            "127.0.0.1:8000/private/moonbase",
            "127.0.0.1:8000/private/moonbase",
            None,
            "127.0.0.1:8000",
        ),
        info("privatebase", "127.0.0.1:8000/privatebase", "127.0.0.1:8000/privatebase", None, "127.0.0.1:8000"),
        info("private/moonbase", "example.com/private/moonbase", "example.com/private/moonbase", None, "example.com"),
        info("privatebase", "example.com/privatebase", "example.com/privatebase", None, "example.com"),
        info(
            "private/moonbase",
            "example.com:8000/private/moonbase",
            "example.com:8000/private/moonbase",
            None,
            "example.com:8000",
        ),
        info(
            "privatebasee",
            "example.com:8000/privatebasee",
            "example.com:8000/privatebasee",
            None,
            "example.com:8000",
        ),
        info(
            "library/ubuntu-12.04-base",
            "ubuntu-12.04-base",
            "docker.io/library/ubuntu-12.04-base",
            Some("index.docker.io/library/ubuntu-12.04-base"),
            "docker.io",
        ),
        info("library/foo", "foo", "docker.io/library/foo", Some("docker.io/foo"), "docker.io"),
        info("library/foo/bar", "library/foo/bar", "docker.io/library/foo/bar", None, "docker.io"),
        info("store/foo/bar", "store/foo/bar", "docker.io/store/foo/bar", None, "docker.io"),
        info("bar", "Foo/bar", "Foo/bar", None, "Foo"),
        info("bar", "FOO/bar", "FOO/bar", None, "FOO"),
    ];

    for row in &rows {
        let spellings = [Some(row.familiar_name), Some(row.full_name), row.ambiguous_name];
        for input in spellings.into_iter().flatten() {
            let r = normalized_ok(input);
            assert_eq!(r.familiar_name(), row.familiar_name, "parse_normalized({input:?}): familiar name");
            assert_eq!(r.to_string(), row.full_name, "parse_normalized({input:?}): Display");
            assert_eq!(r.name(), row.full_name, "parse_normalized({input:?}): name");
            assert_eq!(r.domain(), row.domain, "parse_normalized({input:?}): domain");
            assert_eq!(r.path(), row.remote_name, "parse_normalized({input:?}): path");
            assert_eq!(r.tag(), None, "parse_normalized({input:?}): tag");
            assert_eq!(r.digest(), None, "parse_normalized({input:?}): digest");
        }
    }
}

/// One TestNormalizedSplitHostname row.
struct Split {
    input: &'static str,
    domain: &'static str,
    path: &'static str,
}

#[test]
fn normalized_parse_splits_domain_and_path_like_go() {
    let rows = [
        Split { input: "test.com/foo", domain: "test.com", path: "foo" },
        Split { input: "test_com/foo", domain: "docker.io", path: "test_com/foo" },
        Split { input: "docker/migrator", domain: "docker.io", path: "docker/migrator" },
        Split { input: "test.com:8080/foo", domain: "test.com:8080", path: "foo" },
        Split { input: "test-com:8080/foo", domain: "test-com:8080", path: "foo" },
        Split { input: "foo", domain: "docker.io", path: "library/foo" },
        Split { input: "xn--n3h.com/foo", domain: "xn--n3h.com", path: "foo" },
        Split { input: "xn--n3h.com:18080/foo", domain: "xn--n3h.com:18080", path: "foo" },
        Split { input: "docker.io/foo", domain: "docker.io", path: "library/foo" },
        Split { input: "docker.io/library/foo", domain: "docker.io", path: "library/foo" },
        Split { input: "docker.io/library/foo/bar", domain: "docker.io", path: "library/foo/bar" },
    ];
    for row in &rows {
        let input = row.input;
        let r = normalized_ok(input);
        assert_eq!(r.domain(), row.domain, "parse_normalized({input:?}): domain");
        assert_eq!(r.path(), row.path, "parse_normalized({input:?}): path");
    }
}

/// One named row of TestParseAnyReference: input and its fully qualified String().
struct Equivalent {
    input: &'static str,
    display: &'static str,
}

#[test]
fn normalized_display_matches_the_go_any_reference_table() {
    let rows = [
        Equivalent { input: "redis", display: "docker.io/library/redis" },
        Equivalent { input: "redis:latest", display: "docker.io/library/redis:latest" },
        Equivalent { input: "docker.io/library/redis:latest", display: "docker.io/library/redis:latest" },
        Equivalent {
            input: "redis@sha256:dbcc1c35ac38df41fd2f5e4130b32ffdb93ebae8b3dbe638c23575912276fc9c",
            display: "docker.io/library/redis@sha256:dbcc1c35ac38df41fd2f5e4130b32ffdb93ebae8b3dbe638c23575912276fc9c",
        },
        Equivalent {
            input: "docker.io/library/redis@sha256:dbcc1c35ac38df41fd2f5e4130b32ffdb93ebae8b3dbe638c23575912276fc9c",
            display: "docker.io/library/redis@sha256:dbcc1c35ac38df41fd2f5e4130b32ffdb93ebae8b3dbe638c23575912276fc9c",
        },
        Equivalent { input: "dmcgowan/myapp", display: "docker.io/dmcgowan/myapp" },
        Equivalent { input: "dmcgowan/myapp:latest", display: "docker.io/dmcgowan/myapp:latest" },
        Equivalent { input: "docker.io/mcgowan/myapp:latest", display: "docker.io/mcgowan/myapp:latest" },
        Equivalent {
            input: "dmcgowan/myapp@sha256:dbcc1c35ac38df41fd2f5e4130b32ffdb93ebae8b3dbe638c23575912276fc9c",
            display: "docker.io/dmcgowan/myapp@sha256:dbcc1c35ac38df41fd2f5e4130b32ffdb93ebae8b3dbe638c23575912276fc9c",
        },
        Equivalent {
            input: "docker.io/dmcgowan/myapp@sha256:dbcc1c35ac38df41fd2f5e4130b32ffdb93ebae8b3dbe638c23575912276fc9c",
            display: "docker.io/dmcgowan/myapp@sha256:dbcc1c35ac38df41fd2f5e4130b32ffdb93ebae8b3dbe638c23575912276fc9c",
        },
        // 63 hex digits is a name, not an identifier
        Equivalent {
            input: "dbcc1c35ac38df41fd2f5e4130b32ffdb93ebae8b3dbe638c23575912276fc9",
            display: "docker.io/library/dbcc1c35ac38df41fd2f5e4130b32ffdb93ebae8b3dbe638c23575912276fc9",
        },
        Equivalent { input: "dbcc1", display: "docker.io/library/dbcc1" },
    ];
    for row in &rows {
        let input = row.input;
        let r = normalized_ok(input);
        assert_eq!(r.to_string(), row.display, "parse_normalized({input:?}): Display");
        // Go also checks the result equals Parse(equivalent).
        let canonical = parse_ok(row.display);
        assert_eq!(r.name(), canonical.name(), "parse_normalized({input:?}) vs parse: name");
        assert_eq!(r.domain(), canonical.domain(), "parse_normalized({input:?}) vs parse: domain");
        assert_eq!(r.path(), canonical.path(), "parse_normalized({input:?}) vs parse: path");
        assert_eq!(r.tag(), canonical.tag(), "parse_normalized({input:?}) vs parse: tag");
        assert_eq!(r.digest(), canonical.digest(), "parse_normalized({input:?}) vs parse: digest");
    }
}

#[test]
fn normalized_parse_keeps_both_tag_and_digest() {
    // TestParseReferenceWithTagAndDigest
    let digest = "sha256:86e0e091d0da6bde2456dbb48306f3956bbeb2eae1b5b9a43045843f69fe4aaa";
    let input = format!("busybox:latest@{digest}");
    let r = normalized_ok(&input);
    assert_eq!(r.to_string(), format!("docker.io/library/{input}"), "parse_normalized({input:?}): Display");
    assert_eq!(r.tag(), Some("latest"), "parse_normalized({input:?}): tag");
    assert_eq!(r.digest(), Some(digest), "parse_normalized({input:?}): digest");
    assert_eq!(r.familiar_name(), "busybox", "parse_normalized({input:?}): familiar name");
}

/// One TestParseNamed row: Go's ParseNamed is ParseNormalizedNamed plus
/// "String() must equal the input", so a canonical input round-trips through Display.
struct Canonical {
    input: &'static str,
    canonical: Option<(&'static str, &'static str)>,
}

#[test]
fn normalized_display_is_the_input_only_for_canonical_names() {
    let rows = [
        Canonical { input: "test.com/foo", canonical: Some(("test.com", "foo")) },
        Canonical { input: "test:8080/foo", canonical: Some(("test:8080", "foo")) },
        Canonical { input: "test_com/foo", canonical: None },
        Canonical { input: "test.com", canonical: None },
        Canonical { input: "foo", canonical: None },
        Canonical { input: "library/foo", canonical: None },
        Canonical { input: "docker.io/library/foo", canonical: Some(("docker.io", "library/foo")) },
        // ambiguous: normalisation adds "library/"
        Canonical { input: "docker.io/foo", canonical: None },
    ];
    for row in &rows {
        let input = row.input;
        let r = normalized_ok(input);
        match row.canonical {
            Some((domain, path)) => {
                assert_eq!(r.to_string(), input, "parse_normalized({input:?}) should be canonical");
                assert_eq!(r.domain(), domain, "parse_normalized({input:?}): domain");
                assert_eq!(r.path(), path, "parse_normalized({input:?}): path");
            }
            None => assert_ne!(r.to_string(), input, "parse_normalized({input:?}) should not be canonical"),
        }
    }
}

/// One apply_default_tag row: `None` means "returned unchanged".
struct DefaultTag {
    input: &'static str,
    want: Option<&'static str>,
}

#[test]
fn default_tag_is_appended_only_without_tag_or_digest() {
    let digested = format!("busybox@{SHA256_BUSYBOX}");
    let tagged_and_digested = format!("gcr.io/library/busybox:latest@{SHA256_BUSYBOX}");
    let docker_ref_digested = format!("docker.io/library/busybox@{SHA256_BUSYBOX}");
    let rows = [
        DefaultTag { input: "busybox", want: Some("busybox:latest") },
        DefaultTag { input: "busybox:1.36", want: None },
        DefaultTag { input: "registry:5000/app", want: Some("registry:5000/app:latest") },
        DefaultTag { input: "registry:5000/app:v1", want: None },
        DefaultTag { input: "docker.io/library/busybox", want: Some("docker.io/library/busybox:latest") },
        DefaultTag { input: "library/busybox", want: Some("library/busybox:latest") },
        DefaultTag { input: "docker.io/busybox", want: Some("docker.io/busybox:latest") },
        DefaultTag { input: "gcr.io/library/busybox", want: Some("gcr.io/library/busybox:latest") },
        DefaultTag { input: "localhost/app", want: Some("localhost/app:latest") },
        DefaultTag { input: "[::1]:5000/app", want: Some("[::1]:5000/app:latest") },
        DefaultTag { input: "index.docker.io/library/busybox", want: Some("index.docker.io/library/busybox:latest") },
        DefaultTag { input: "busybox:latest", want: None },
        DefaultTag { input: "docker.io/busybox:latest", want: None },
    ];
    let unchanged = [digested.as_str(), tagged_and_digested.as_str(), docker_ref_digested.as_str()];

    for row in &rows {
        let input = row.input;
        let want = row.want.unwrap_or(input).to_string();
        assert_eq!(apply_default_tag(input), Ok(want), "apply_default_tag({input:?})");
    }
    for input in unchanged {
        assert_eq!(apply_default_tag(input), Ok(input.to_string()), "apply_default_tag({input:?})");
    }
}

#[test]
fn default_tag_fails_with_the_normalized_parse_error() {
    use ReferenceError::*;
    let rows = [
        Rejected { input: "", err: InvalidFormat },
        Rejected { input: "Busybox", err: RemoteNameNotLowercase("library/Busybox".into()) },
        Rejected { input: HEX64, err: HexIdentifier(HEX64.to_string()) },
        Rejected { input: "busybox:-latest", err: InvalidFormat },
        Rejected { input: "https://github.com/docker/docker", err: InvalidFormat },
    ];
    for row in &rows {
        let input = row.input;
        assert_eq!(apply_default_tag(input), Err(row.err.clone()), "apply_default_tag({input:?})");
        assert_eq!(
            apply_default_tag(input).err(),
            ImageReference::parse_normalized(input).err(),
            "apply_default_tag({input:?}) must fail exactly as parse_normalized"
        );
    }
}

/// One TestParseDockerRef row (ParseNormalizedNamed + TagNameOnly).
struct DockerRef {
    input: &'static str,
    want: &'static str,
}

#[test]
fn default_tag_then_normalized_display_matches_the_go_docker_ref_table() {
    // "both tag and digest" is left out: ParseDockerRef drops the tag, which
    // neither apply_default_tag nor parse_normalized does.
    let rows = [
        DockerRef { input: "busybox", want: "docker.io/library/busybox:latest" },
        DockerRef { input: "busybox:latest", want: "docker.io/library/busybox:latest" },
        DockerRef {
            input: "busybox@sha256:e6693c20186f837fc393390135d8a598a96a833917917789d63766cab6c59582",
            want: "docker.io/library/busybox@sha256:e6693c20186f837fc393390135d8a598a96a833917917789d63766cab6c59582",
        },
        DockerRef { input: "library/busybox", want: "docker.io/library/busybox:latest" },
        DockerRef { input: "docker.io/busybox", want: "docker.io/library/busybox:latest" },
        DockerRef { input: "docker.io/library/busybox", want: "docker.io/library/busybox:latest" },
        DockerRef { input: "docker.io/busybox:latest", want: "docker.io/library/busybox:latest" },
        DockerRef { input: "library/busybox:latest", want: "docker.io/library/busybox:latest" },
        DockerRef { input: "docker.io/library/busybox:latest", want: "docker.io/library/busybox:latest" },
        DockerRef { input: "gcr.io/library/busybox", want: "gcr.io/library/busybox:latest" },
    ];
    for row in &rows {
        let input = row.input;
        let tagged = match apply_default_tag(input) {
            Ok(s) => s,
            Err(e) => panic!("apply_default_tag({input:?}) failed: {e}"),
        };
        assert_eq!(normalized_ok(&tagged).to_string(), row.want, "docker ref of {input:?}");
        // Go also requires the output to be a valid reference for Parse.
        assert_eq!(parse_ok(row.want).to_string(), row.want, "parse of docker ref {:?}", row.want);
    }
}

#[test]
fn every_spelling_of_an_image_normalises_to_one() {
    for spelling in [
        "busybox",
        "busybox:latest",
        "library/busybox",
        "docker.io/library/busybox",
        "index.docker.io/library/busybox:latest",
    ] {
        assert_eq!(normalized(spelling).as_deref(), Some("docker.io/library/busybox:latest"), "{spelling}");
    }
    let digested = format!("registry.local:5000/app@sha256:{}", "a".repeat(64));
    assert_eq!(normalized(&digested), Some(digested.clone()), "a digest gets no tag");
    assert_eq!(normalized("Not A Name"), None);
}

#[test]
fn a_reference_longer_than_its_bound_is_refused_with_its_length_whatever_the_domain() {
    // The grammar bounds the path (255) and the tag (128), not the domain.
    let long_domain = format!("{}.example/app:1", "a".repeat(REFERENCE_LENGTH_MAX));
    assert_eq!(ImageReference::parse(&long_domain), Err(ReferenceError::TooLong(long_domain.len())));
    assert_eq!(ImageReference::parse_normalized(&long_domain), Err(ReferenceError::TooLong(long_domain.len())));
    let message = ReferenceError::TooLong(long_domain.len()).to_string();
    assert!(message.ends_with(&format!("{} bytes, more than 1024", long_domain.len())), "{message}");
    // The longest a registry can serve fits: a 253-byte host and port, a 255-byte path, a tag
    // and a sha512 digest.
    let host = ["a".repeat(63), "b".repeat(63), "c".repeat(63), "d".repeat(61)].join(".");
    let longest = format!("{host}:65535/{}:{}@sha512:{}", "p".repeat(255), "t".repeat(128), "f".repeat(128));
    assert!(longest.len() <= REFERENCE_LENGTH_MAX, "{}", longest.len());
    assert!(ImageReference::parse(&longest).is_ok());
}
