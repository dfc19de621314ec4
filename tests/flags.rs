//! The real binary's command line: every refused flag is one `cri-imaged: …` message naming the
//! flag, the value and what is accepted; exit 2 when the command line does not parse, 1 when the
//! values parse but do not work together.

mod support;

use std::time::Duration;

use support::process::{DaemonProcess, free_port, http_get};

/// Exit status of a command line refused while parsing.
const USAGE_ERROR: i32 = 2;
/// Exit status of a configuration refused once parsed, or a start that failed.
const FAILURE: i32 = 1;

/// Runs `cri-imaged serve` with `flags` (on sockets in a temp dir, no runtime) until it exits by
/// itself, at most 10 s; its exit code and stderr.
async fn refused(flags: &[&str]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut daemon = DaemonProcess::spawn(&dir.path().join("s.sock"), &dir.path().join("r.sock"), flags);
    let status = daemon.wait_for_exit(Duration::from_secs(10)).await;
    assert!(!dir.path().join("s.sock").exists(), "{flags:?}: nothing was served");
    (status.code(), daemon.log_text())
}

/// Asserts one error line in the daemon's style that says each of `says`.
fn assert_one_style(flags: &[&str], stderr: &str, says: &[&str]) {
    assert!(stderr.starts_with("cri-imaged: "), "{flags:?}: {stderr}");
    assert!(!stderr.lines().any(|line| line.starts_with("error:")), "{flags:?}: one style only: {stderr}");
    for said in says {
        assert!(stderr.contains(said), "{flags:?}: {said:?} missing from:\n{stderr}");
    }
}

#[tokio::test]
async fn a_value_its_flag_does_not_take_is_a_usage_error_naming_the_flag_the_value_and_what_is_accepted() {
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--worker-threads", "0"],
            &["invalid value '0' for '--worker-threads <N>'", "expected a whole number, 1 or more"],
        ),
        (
            &["--registry-qps", "-1"],
            &["invalid value '-1' for '--registry-qps <QPS>'", "expected a number of pulls a second, 0 or more"],
        ),
        (
            &["--registry-qps-per-host", "docker.io=0:5"],
            &[
                "invalid value 'docker.io=0:5' for '--registry-qps-per-host <HOST=QPS:BURST>'",
                "QPS \"0\" is not accepted for a host: expected a number of pulls a second above 0",
            ],
        ),
        (
            &["--registry-qps-per-host", "docker.io=2"],
            &[
                "invalid value 'docker.io=2' for '--registry-qps-per-host",
                "expected HOST=QPS:BURST, e.g. docker.io=2:5",
            ],
        ),
        (
            &["--metrics-listen", "localhost"],
            &["invalid value 'localhost' for '--metrics-listen <ADDR>'", "expected IP:PORT or HOST:PORT"],
        ),
        (
            &["--metrics-listen", "no-such-host.invalid:9757"],
            &[
                "invalid value 'no-such-host.invalid:9757' for '--metrics-listen <ADDR>'",
                "cannot resolve \"no-such-host.invalid\"",
            ],
        ),
        (
            &["--presence-cache-max-staleness", "-1s"],
            &["invalid value '-1s' for '--presence-cache-max-staleness <DURATION>'", "write a whole number and a unit"],
        ),
        (
            &["--shutdown-timeout", "0s"],
            &["invalid value '0s' for '--shutdown-timeout <DURATION>'", "must be greater than zero"],
        ),
        (
            &["--image-maximum-gc-age", "a week"],
            &["invalid value 'a week' for '--image-maximum-gc-age <DURATION>'", "e.g. 0s, 90s, 2m, 1m30s or 168h"],
        ),
        (
            &["--image-gc-high-threshold", "most"],
            &["invalid value 'most' for '--image-gc-high-threshold <PERCENT>'", "from 0 to 100"],
        ),
        (&["--registry-rate-limit-mode", "queue"], &["invalid value 'queue'", "[possible values: fail, wait]"]),
        (&["--no-such-flag"], &["unexpected argument '--no-such-flag' found"]),
        (
            &["--regsitry-qps", "1"],
            &["unexpected argument '--regsitry-qps' found", "tip: a similar argument exists: '--registry-qps'"],
        ),
    ];
    for (flags, says) in cases {
        let (code, stderr) = refused(flags).await;
        assert_eq!(code, Some(USAGE_ERROR), "{flags:?}: {stderr}");
        assert_one_style(flags, &stderr, says);
    }
}

#[test]
fn a_mistyped_command_is_refused_naming_the_one_meant() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_cri-imaged")).arg("serv").output().expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(USAGE_ERROR), "{stderr}");
    assert_one_style(&["serv"], &stderr, &["unrecognized subcommand 'serv'", "a similar subcommand exists: 'serve'"]);
}

#[tokio::test]
async fn flags_that_parse_but_do_not_work_together_are_an_invalid_configuration_naming_both() {
    let cases: &[(&[&str], &[&str])] = &[
        (&["--registry-burst", "0"], &["invalid configuration: --registry-burst 0 needs --registry-qps 0 (no limit)"]),
        (
            &["--image-pull-backoff-initial", "10m", "--image-pull-backoff-max", "1m"],
            &["invalid configuration: --image-pull-backoff-initial 10m must not exceed --image-pull-backoff-max 1m"],
        ),
        (
            &["--serialize-image-pulls=true", "--max-parallel-image-pulls", "4"],
            &["invalid configuration: --max-parallel-image-pulls 4 needs --serialize-image-pulls=false"],
        ),
        (
            &["--image-gc-low-threshold", "101"],
            &[
                "invalid configuration: imageGCLowThresholdPercent (--image-gc-low-threshold) 101 must be between 0 and 100",
            ],
        ),
        (
            &["--minimum-image-ttl-duration", "2h", "--image-maximum-gc-age", "1h"],
            &["--image-maximum-gc-age must exceed --minimum-image-ttl-duration"],
        ),
        (
            &["--preloaded-images-verification-allowlist", "registry.local/app"],
            &[
                "--preloaded-images-verification-allowlist needs --image-pull-credentials-verification-policy NeverVerifyAllowlistedImages",
            ],
        ),
    ];
    for (flags, says) in cases {
        let (code, stderr) = refused(flags).await;
        assert_eq!(code, Some(FAILURE), "{flags:?}: {stderr}");
        assert_one_style(flags, &stderr, says);
    }
}

/// The kubelet refuses a negative image GC age (1.36: `imageMinimumGCAge … must not be negative`).
#[tokio::test]
async fn a_negative_image_gc_age_is_refused_at_start_naming_its_flag() {
    for (flag, value) in [("--minimum-image-ttl-duration", "-1m"), ("--image-maximum-gc-age", "-168h")] {
        let flags = [flag, value];
        let (code, stderr) = refused(&flags).await;
        assert_eq!(code, Some(USAGE_ERROR), "{flags:?}: {stderr}");
        let names = format!("invalid value '{value}' for '{flag} <DURATION>': \"{value}\" must not be negative");
        assert_one_style(&flags, &stderr, &[&names, "expected 0 or more"]);
    }
}

/// Short entries are taken as the kubelet normalises a pod's image (`alpine` is
/// `docker.io/library/alpine`); an entry with a tag or a digest, spaces, a bare `/*` or another
/// wildcard is refused before anything starts.
#[tokio::test]
async fn a_short_allowlist_entry_is_accepted_and_one_with_a_tag_or_a_digest_is_refused_at_start() {
    const POLICY: [&str; 2] = ["--image-pull-credentials-verification-policy", "NeverVerifyAllowlistedImages"];
    const ALLOWLIST: &str = "--preloaded-images-verification-allowlist";
    let dir = tempfile::tempdir().expect("tempdir");
    let mut flags = POLICY.to_vec();
    for entry in ["alpine", "myorg/app", "docker.io/library/nginx", "myorg/*", "registry.local/base/*"] {
        flags.extend([ALLOWLIST, entry]);
    }
    let daemon = DaemonProcess::start(&dir.path().join("s.sock"), &dir.path().join("r.sock"), &flags).await;
    let (status, log) = daemon.terminate().await;
    assert!(status.success(), "served with short entries, then a clean stop: {status:?}: {log}");

    let digest = "sha256:38a8906435c4dd5f4258899d46621bfd8eea3ad6ff494ee3c2f17ef0321625bd";
    let with_digest = format!("alpine@{digest}");
    let cases = [
        ("alpine:3", "neither tag nor digest is accepted in an image reference: alpine:3".to_owned()),
        (&with_digest, format!("neither tag nor digest is accepted in an image reference: {with_digest}")),
        ("alpine ", "leading/trailing spaces are not allowed: alpine ".to_owned()),
        ("/*", "at least registry hostname is required".to_owned()),
        ("registry.local/base*", "only patterns ending with '/*' are allowed: registry.local/base*".to_owned()),
    ];
    for (entry, reason) in cases {
        let flags = [POLICY[0], POLICY[1], ALLOWLIST, entry];
        let (code, stderr) = refused(&flags).await;
        assert_eq!(code, Some(USAGE_ERROR), "{entry:?}: {stderr}");
        let names = format!("invalid value '{entry}' for '{ALLOWLIST} <IMAGE>': ");
        assert_one_style(&flags, &stderr, &[&names, &reason, "expected a name without tag or digest, e.g. alpine"]);
    }
}

#[tokio::test]
async fn metrics_listen_takes_a_host_name_resolved_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let listen = format!("localhost:{port}");
    let daemon = DaemonProcess::start(
        &dir.path().join("cri-imaged.sock"),
        &dir.path().join("no-runtime.sock"),
        &["--metrics-listen", &listen],
    )
    .await;
    let metrics = tokio::task::spawn_blocking(move || http_get(port, "/metrics")).await.expect("scraped");
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(metrics.contains("cri_imaged_"), "{metrics}");
    let (status, log) = daemon.terminate().await;
    assert!(status.success(), "{status:?}: {log}");
}
