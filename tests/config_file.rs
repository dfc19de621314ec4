//! The real binary with `--config FILE`: the file's values take effect under the command line's,
//! a file it cannot use stops the start naming the line, and SIGHUP applies a changed file while
//! serving, or refuses a bad one and keeps the running configuration.

mod support;

use std::{path::Path, time::Duration};

use cri_imaged::api::{GetStatusRequest, ReloadRefusal, image_manager_client::ImageManagerClient};
use support::{process::DaemonProcess, unix_channel};

/// The registry buckets GetStatus shows: (host, qps, burst), the default bucket's host empty.
async fn buckets(socket: &Path) -> (String, Vec<(String, f64, u32)>) {
    let mut client = ImageManagerClient::new(unix_channel(socket));
    let status = client.get_status(GetStatusRequest::default()).await.expect("GetStatus answers").into_inner();
    let buckets = status.rate_limits.into_iter().map(|bucket| (bucket.host, bucket.qps, bucket.burst)).collect();
    (status.rate_limit_mode, buckets)
}

/// GetStatus's word on the last reload, when it was refused.
async fn reload_refused(socket: &Path) -> Option<ReloadRefusal> {
    let mut client = ImageManagerClient::new(unix_channel(socket));
    client.get_status(GetStatusRequest::default()).await.expect("GetStatus answers").into_inner().reload_refused
}

/// `cri-imaged status` as the real binary prints it through a pipe.
fn status_text(socket: &Path) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_cri-imaged"))
        .args(["status", "--socket", socket.to_str().expect("utf-8")])
        .output()
        .expect("cri-imaged runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("UTF-8")
}

/// Waits until the log says `text` `count` times; the log.
async fn logged(daemon: &DaemonProcess, text: &str, count: usize) -> String {
    daemon.wait_for_log(text, |log| log.matches(text).count() >= count).await
}

#[tokio::test]
async fn the_file_sets_what_the_flags_leave_and_sighup_applies_a_changed_file_while_serving() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (socket, config) = (dir.path().join("s.sock"), dir.path().join("config.yaml"));
    std::fs::write(&config, "registry-qps: 2\nregistry-burst: 3\nimage-gc-period: 1m\n").expect("config written");
    let config_flag = config.to_str().expect("utf-8");
    let flags = ["--config", config_flag, "--registry-burst", "4"];
    let daemon = DaemonProcess::start(&socket, &dir.path().join("r.sock"), &flags).await;
    assert_eq!(buckets(&socket).await, ("fail".to_owned(), vec![(String::new(), 2.0, 4)]), "the flag wins the burst");

    let changed = "registry-qps: 1\nregistry-rate-limit-mode: wait\nregistry-qps-per-host: [registry.local:5000=3:6]\n\
                   image-pull-backoff-initial: 1s\nimage-gc-period: 2m\nworker-threads: 2\n";
    std::fs::write(&config, changed).expect("config rewritten");
    daemon.signal("-HUP");
    let log = logged(&daemon, "configuration reloaded; credential files read again", 1).await;
    assert_eq!(
        buckets(&socket).await,
        ("wait".to_owned(), vec![(String::new(), 1.0, 4), ("registry.local:5000".to_owned(), 3.0, 6)]),
        "applied while serving; the command line still wins"
    );
    for applied in ["registry-qps", "registry-rate-limit-mode", "image-pull-backoff-initial", "image-gc-period"] {
        let line = log.lines().find(|line| line.contains("applied") && line.contains(&format!("flag={applied} ")));
        assert!(line.is_some(), "{applied} is logged as applied:\n{log}");
    }
    let waiting = log.lines().find(|line| line.contains("flag=worker-threads"));
    assert!(
        waiting.is_some_and(|line| line.contains("WARN") && line.contains("next start")),
        "a flag a reload cannot change says so:\n{log}"
    );
    assert!(!log.contains("flag=registry-burst"), "unchanged: the command line set it");

    std::fs::write(&config, "registry-qps: 9\nregistry-qps-per-host: docker.io=0:1\n").expect("bad config written");
    daemon.signal("-HUP");
    let log = logged(&daemon, "configuration reload refused", 1).await;
    let refusal = log.lines().find(|line| line.contains("configuration reload refused")).expect("logged");
    assert!(
        refusal.contains("config.yaml:2: registry-qps-per-host") && refusal.contains("QPS \"0\" is not accepted"),
        "names the line, the field and the reason: {refusal}"
    );
    assert_eq!(buckets(&socket).await.1[0], (String::new(), 1.0, 4), "the running configuration is kept");
    let refused = reload_refused(&socket).await.expect("GetStatus says the last reload was refused");
    assert!(refused.reason.contains("config.yaml:2: registry-qps-per-host"), "why, as logged: {refused:?}");
    let at = std::time::SystemTime::try_from(refused.at.expect("when")).expect("a time");
    assert!(at.elapsed().expect("in the past") < Duration::from_secs(60), "when: {at:?}");
    // grpc-go's view of the same fields (grpcurl, by the server's reflection, default flags).
    if let Some(grpcurl) = support::process::require_tool("grpcurl") {
        let (ok, out, err) =
            support::process::grpcurl(&grpcurl, &socket, &[], &["imagemanager.v1.ImageManager/GetStatus"]);
        assert!(ok, "grpcurl GetStatus: {err}");
        let answer: serde_json::Value = serde_json::from_str(&out).expect("grpcurl prints JSON");
        let reason = answer["reloadRefused"]["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("config.yaml:2: registry-qps-per-host"), "reloadRefused as grpcurl reads it: {out}");
        assert!(answer["reloadRefused"]["at"].as_str().is_some_and(|at| at.ends_with('Z')), "{out}");
        // No runtime answers here: no change signal, so every presence check asks the runtime.
        assert_eq!(answer["presenceCacheSignal"], "none", "{out}");
    }
    let status = status_text(&socket);
    let line = status.lines().find(|line| line.starts_with("reload ")).unwrap_or_else(|| panic!("{status}"));
    assert!(
        line.contains("last reload refused ")
            && line.contains(" ago (at ")
            && line.contains("QPS \"0\" is not accepted"),
        "the person at the terminal sees it too: {line}"
    );

    std::fs::write(&config, "image-pull-backoff-initial: 10m\nimage-pull-backoff-max: 1m\n").expect("written");
    daemon.signal("-HUP");
    let log = logged(&daemon, "configuration reload refused", 2).await;
    assert!(log.contains("--image-pull-backoff-initial 10m must not exceed --image-pull-backoff-max 1m"), "{log}");
    assert_eq!(buckets(&socket).await.1.len(), 2, "still the last good configuration");
    let refused = reload_refused(&socket).await.expect("still refused");
    assert!(refused.reason.contains("must not exceed --image-pull-backoff-max 1m"), "the newest: {refused:?}");

    std::fs::write(&config, "registry-qps: 1\n").expect("a good config written");
    daemon.signal("-HUP");
    logged(&daemon, "configuration reloaded; credential files read again", 2).await;
    assert_eq!(reload_refused(&socket).await, None, "a reload that succeeded ends it");
    assert!(!status_text(&socket).lines().any(|line| line.starts_with("reload ")));

    let (status, log) = daemon.terminate().await;
    assert!(status.success(), "serving all along, then a clean stop:\n{log}");
}

#[tokio::test]
async fn a_file_the_daemon_cannot_use_stops_the_start_naming_the_file_line_and_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.yaml");
    let config_flag = config.to_str().expect("utf-8").to_owned();
    let cases: &[(&str, &str)] = &[
        (
            "registry-qps: 1\nregistryBurst: 4\n",
            "config.yaml:2: unknown field `registryBurst`: the fields are the serve flags without their dashes, e.g. `registry-burst`",
        ),
        (
            "worker-threads: 0\n",
            "config.yaml:1: worker-threads: invalid value \"0\": expected a whole number, 1 or more",
        ),
        ("registry-qps: [\n", "config.yaml: not valid YAML"),
        (
            "registry-qps: 1\nminimum-image-ttl-duration: -1m\n",
            "config.yaml:2: minimum-image-ttl-duration: invalid value \"-1m\": \"-1m\" must not be negative",
        ),
        (
            "image-maximum-gc-age: -168h\n",
            "config.yaml:1: image-maximum-gc-age: invalid value \"-168h\": \"-168h\" must not be negative",
        ),
        (
            "preloaded-images-verification-allowlist:\n  - alpine\n  - alpine:3\n",
            "config.yaml:1: preloaded-images-verification-allowlist: invalid value \"alpine:3\": neither tag nor digest is accepted in an image reference: alpine:3",
        ),
    ];
    for (text, says) in cases {
        std::fs::write(&config, text).expect("config written");
        let mut daemon =
            DaemonProcess::spawn(&dir.path().join("s.sock"), &dir.path().join("r.sock"), &["--config", &config_flag]);
        let status = daemon.wait_for_exit(Duration::from_secs(10)).await;
        let stderr = daemon.log_text();
        assert_eq!(status.code(), Some(2), "{text:?}: {stderr}");
        assert!(
            stderr.starts_with("cri-imaged: ") && stderr.contains(says),
            "{text:?}: {says:?} missing from {stderr}"
        );
    }
}

#[tokio::test]
async fn a_reload_of_a_fifo_a_device_or_a_deeply_nested_file_is_refused_at_once_and_the_daemon_stays_reloadable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (socket, config) = (dir.path().join("s.sock"), dir.path().join("config.yaml"));
    std::fs::write(&config, "registry-qps: 2\n").expect("config written");
    let (port, listen) = support::process::metrics_listen();
    let flags = ["--config", config.to_str().expect("utf-8"), "--metrics-listen", &listen];
    let daemon = DaemonProcess::start(&socket, &dir.path().join("r.sock"), &flags).await;
    type MakeFile<'a> = &'a dyn Fn(&Path);
    let hostile: [(&str, MakeFile); 3] = [
        ("it is a FIFO, not a regular file", &|path| {
            let made = std::process::Command::new("mkfifo").arg(path).status().expect("mkfifo runs");
            assert!(made.success());
        }),
        ("it is a character device, not a regular file", &|path| {
            std::os::unix::fs::symlink("/dev/zero", path).expect("link");
        }),
        ("nested deeper than 16 levels", &|path| {
            let deep = format!("registry-qps-per-host: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
            std::fs::write(path, deep).expect("written");
        }),
    ];
    for (refusals, (says, make)) in hostile.iter().enumerate() {
        std::fs::remove_file(&config).expect("removed");
        make(&config);
        let began = tokio::time::Instant::now();
        daemon.signal("-HUP");
        let log = logged(&daemon, "configuration reload refused", refusals + 1).await;
        assert!(began.elapsed() < Duration::from_secs(5), "{says}: refused after {:?}", began.elapsed());
        let refusal = log.lines().rfind(|line| line.contains("configuration reload refused")).expect("logged");
        assert!(refusal.contains(says), "{says}: {refusal}");
    }
    let refused = tokio::task::spawn_blocking(move || {
        support::process::metric_with_label(port, "cri_imaged_config_reloads_total", r#"result="refused""#)
    })
    .await
    .expect("metrics");
    assert_eq!(refused, 3.0);
    assert_eq!(buckets(&socket).await.1[0], (String::new(), 2.0, 10), "the running configuration is kept");

    std::fs::remove_file(&config).expect("removed");
    std::fs::write(&config, "registry-qps: 3\n").expect("config written");
    daemon.signal("-HUP");
    logged(&daemon, "configuration reloaded; credential files read again", 1).await;
    assert_eq!(buckets(&socket).await.1[0], (String::new(), 3.0, 10), "the next reload applies");
    let began = tokio::time::Instant::now();
    let (status, log) = daemon.terminate().await;
    assert!(status.success() && began.elapsed() < Duration::from_secs(5), "a prompt, clean stop:\n{log}");
}

#[tokio::test]
async fn a_missing_file_is_said_not_to_exist_and_a_policy_the_file_sets_is_named_by_its_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "registry-qps: 2\nsignature-policy: /nonexistent/policy.json\n").expect("config written");
    let config_flag = config.to_str().expect("utf-8").to_owned();
    let cases: [(&[&str], i32, String); 5] = [
        (
            &["--config", &config_flag],
            1,
            format!("{config_flag}:2: signature-policy /nonexistent/policy.json: the file does not exist"),
        ),
        (
            &["--signature-policy", "/nonexistent/policy.json"],
            1,
            "--signature-policy /nonexistent/policy.json: the file does not exist".to_owned(),
        ),
        (
            &["--signature-policy-dir", "/nonexistent/policies"],
            1,
            "--signature-policy-dir /nonexistent/policies: the directory does not exist".to_owned(),
        ),
        (
            &["--config", "/nonexistent/config.yaml"],
            2,
            "cannot read the config file /nonexistent/config.yaml: the file does not exist".to_owned(),
        ),
        (
            &["--node-docker-config", "/nonexistent/config.json"],
            1,
            "cannot read the node docker config /nonexistent/config.json: the file does not exist".to_owned(),
        ),
    ];
    for (flags, code, says) in cases {
        let mut daemon = DaemonProcess::spawn(&dir.path().join("s.sock"), &dir.path().join("r.sock"), flags);
        let status = daemon.wait_for_exit(Duration::from_secs(10)).await;
        let stderr = daemon.log_text();
        assert_eq!(status.code(), Some(code), "{flags:?}: {stderr}");
        assert!(stderr.contains(&format!("cri-imaged: {says}")), "{flags:?}: {says:?} missing from {stderr}");
        assert!(!stderr.contains("entity not found"), "{stderr}");
    }
}
