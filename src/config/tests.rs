use std::{ffi::OsString, net::SocketAddr, num::NonZeroUsize, path::PathBuf, time::Duration};

use clap::{CommandFactory, Parser};

use super::*;
use crate::{
    ensure::ManagerConfig,
    gc::GcConfig,
    pull::ratelimit::{RateLimit, RateLimitMode},
    server::ServeLimits,
};

#[test]
fn serve_defaults_match_the_documented_ones() {
    let cli = Cli::try_parse_from(["cri-imaged", "serve"]).expect("defaults parse");
    let Command::Serve(args) = cli.command else { panic!("a serve command line") };
    assert_eq!(args.listen, PathBuf::from(DEFAULT_LISTEN));
    assert_eq!(args.runtime_endpoint.to_string(), DEFAULT_RUNTIME_ENDPOINT);
    assert_eq!(args.runtime_request_timeout, Duration::from_secs(120));
    assert_eq!(args.shutdown_timeout, Duration::from_secs(30));
    assert_eq!(args.health_probe_interval, Duration::from_secs(5));
    assert_eq!(args.health_probe_timeout, Duration::from_secs(3));
    assert!(args.presence_cache);
    assert_eq!(args.presence_cache_max_staleness, crate::presence::DEFAULT_MAX_STALENESS);
    assert_eq!(args.worker_threads.get(), 1);
    assert_eq!(args.gc_config(), Ok(GcConfig::default()));
    assert_eq!(args.serve_limits(), ServeLimits::default());
}

#[test]
fn image_gc_flags_take_the_kubelets_values_and_messages() {
    let parse = |flags: &[&str]| {
        let cli = Cli::try_parse_from([&["cri-imaged", "serve"], flags].concat()).expect("parses");
        let Command::Serve(args) = cli.command else { panic!("a serve command line") };
        args.gc_config()
    };
    let config = parse(&["--minimum-image-ttl-duration", "1m30s", "--image-maximum-gc-age", "168h"]).expect("valid");
    assert_eq!(config.policy.min_age, Duration::from_secs(90));
    assert_eq!(config.policy.max_age, Duration::from_secs(168 * 3600));
    let error =
        parse(&["--image-gc-high-threshold", "70", "--image-gc-low-threshold", "75"]).expect_err("low over high");
    assert_eq!(
        error.to_string(),
        "invalid configuration: imageGCLowThresholdPercent (--image-gc-low-threshold) 75 must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) 70"
    );
    let negative = parse(&["--image-gc-low-threshold", "-1"]).expect_err("negative");
    assert!(negative.to_string().ends_with("-1 must be between 0 and 100, inclusive"), "{negative}");
    assert!(parse(&["--image-gc-high-threshold", "100"]).expect("valid").policy.disabled());
}

#[test]
fn the_presence_cache_can_be_turned_off_and_zero_threads_is_refused() {
    let cli = Cli::try_parse_from(["cri-imaged", "serve", "--presence-cache=false"]).expect("flag parses");
    let Command::Serve(args) = cli.command else { panic!("a serve command line") };
    assert!(!args.presence_cache);
    let error = Cli::try_parse_from(["cri-imaged", "serve", "--worker-threads", "0"]).expect_err("zero threads");
    assert!(error.to_string().contains("--worker-threads"), "{error}");
}

fn manager_config(flags: &[&str]) -> Result<ManagerConfig, ConfigError> {
    let cli = Cli::try_parse_from(["cri-imaged", "serve"].iter().chain(flags)).expect("flags parse");
    let Command::Serve(args) = cli.command else { panic!("a serve command line") };
    args.manager_config()
}

fn max_parallel(flags: &[&str]) -> Option<usize> {
    manager_config(flags).expect("valid").scheduler.max_parallel.map(NonZeroUsize::get)
}

#[test]
fn pulls_run_ten_at_once_by_default_unlike_the_kubelets_serial_puller() {
    assert_eq!(max_parallel(&[]), Some(5));
    assert_eq!(max_parallel(&["--serialize-image-pulls=false"]), Some(5));
    assert_eq!(manager_config(&[]).expect("valid"), ManagerConfig::default());
}

#[test]
fn pulls_are_serial_or_capped_as_told() {
    assert_eq!(max_parallel(&["--serialize-image-pulls"]), Some(1));
    assert_eq!(max_parallel(&["--serialize-image-pulls=true"]), Some(1));
    assert_eq!(max_parallel(&["--max-parallel-image-pulls", "3"]), Some(3));
    assert_eq!(max_parallel(&["--serialize-image-pulls=false", "--max-parallel-image-pulls", "3"]), Some(3));
}

#[test]
fn registry_limits_come_from_their_flags() {
    let config = manager_config(&[
        "--registry-qps=0",
        "--registry-rate-limit-mode=wait",
        "--registry-qps-per-host=docker.io=1:2",
        "--registry-qps-per-host=quay.io=3:4",
    ])
    .expect("valid");
    assert_eq!(config.rate_limits.each_host, None, "0 QPS is no limit");
    assert_eq!(config.rate_limits.mode, RateLimitMode::Wait);
    let hosts: Vec<&str> = config.rate_limits.per_host.iter().map(|(host, _)| host.as_str()).collect();
    assert_eq!(hosts, ["docker.io", "quay.io"]);
    let zero_burst = manager_config(&["--registry-burst=0"]).expect_err("a burst of 0 under a limit");
    assert_eq!(zero_burst, ConfigError::ZeroBurst { qps: 5.0 });
    assert_eq!(
        zero_burst.to_string(),
        "invalid configuration: --registry-burst 0 needs --registry-qps 0 (no limit); with --registry-qps 5 the burst must be 1 or more"
    );
    assert!(manager_config(&["--registry-qps=0", "--registry-burst=0"]).is_ok(), "no limit, no burst");
}

#[test]
fn contradictory_pull_flags_are_refused() {
    let both = manager_config(&["--serialize-image-pulls=true", "--max-parallel-image-pulls", "4"]);
    assert_eq!(both, Err(ConfigError::ParallelWhileSerialized(4)));
    let backwards = manager_config(&["--image-pull-backoff-initial", "10m", "--image-pull-backoff-max", "90s"]);
    assert_eq!(
        backwards.expect_err("initial over max").to_string(),
        "invalid configuration: --image-pull-backoff-initial 10m must not exceed --image-pull-backoff-max 90s"
    );
}

/// clap's message for `flags`, as the daemon prints it.
fn usage_message(flags: &[&str]) -> String {
    let error = Cli::try_parse_from(["cri-imaged", "serve"].iter().chain(flags)).expect_err("refused");
    usage_error(&error).expect("an error, not help")
}

#[test]
fn a_refused_value_names_its_flag_the_value_and_what_is_accepted() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--worker-threads", "0"],
            "invalid value '0' for '--worker-threads <N>': expected a whole number, 1 or more",
        ),
        (&["--max-parallel-image-pulls", "0"], "'--max-parallel-image-pulls <N>': expected a whole number, 1 or more"),
        (&["--image-pull-backoff-max-entries", "0"], "expected a whole number, 1 or more"),
        (
            &["--registry-qps", "-1"],
            "invalid value '-1' for '--registry-qps <QPS>': expected a number of pulls a second, 0 or more",
        ),
        (&["--registry-qps", "inf"], "invalid value 'inf' for '--registry-qps <QPS>'"),
        (
            &["--registry-burst", "-1"],
            "invalid value '-1' for '--registry-burst <N>': expected a whole number, 0 or more",
        ),
        (
            &["--registry-qps-per-host", "docker.io=0:5"],
            "QPS \"0\" is not accepted for a host: expected a number of pulls a second above 0",
        ),
        (
            &["--registry-qps-per-host", "docker.io=2:0"],
            "BURST \"0\" is not accepted: expected a whole number of pulls, 1 or more",
        ),
        (&["--registry-qps-per-host", "docker.io"], "expected HOST=QPS:BURST, e.g. docker.io=2:5"),
        (&["--registry-qps-per-host", "=2:5"], "the HOST before '=' is empty"),
        (
            &["--image-gc-high-threshold", "lots"],
            "'--image-gc-high-threshold <PERCENT>': expected a whole number of percent, from 0 to 100",
        ),
        (
            &["--presence-cache-max-staleness", "-1s"],
            "invalid value '-1s' for '--presence-cache-max-staleness <DURATION>': \"-1s\" is not a duration",
        ),
        (&["--shutdown-timeout", "0s"], "\"0s\" must be greater than zero: write a whole number and a unit"),
        (&["--request-body-timeout", "18446744073709551615s"], "is too long: at most 8760h (a year)"),
        (&["--max-connections", "99999999999"], "expected a whole number from 1 to 1000000"),
        (
            &["--minimum-image-ttl-duration", "5"],
            "\"5\" is not a duration: expected 0 or more as Go writes it, e.g. 0s, 90s, 2m, 1m30s or 168h",
        ),
        (
            &["--image-maximum-gc-age", "-1h"],
            "invalid value '-1h' for '--image-maximum-gc-age <DURATION>': \"-1h\" must not be negative",
        ),
        (
            &["--minimum-image-ttl-duration", "-1m30s"],
            "invalid value '-1m30s' for '--minimum-image-ttl-duration <DURATION>': \"-1m30s\" must not be negative",
        ),
        (
            &["--preloaded-images-verification-allowlist", "alpine:3"],
            "invalid value 'alpine:3' for '--preloaded-images-verification-allowlist <IMAGE>': neither tag nor digest is accepted in an image reference: alpine:3; expected a name without tag or digest, e.g. alpine",
        ),
        (&["--runtime-endpoint", ""], "expected unix:///path/to.sock or an absolute socket path"),
        (
            &["--metrics-listen", "localhost"],
            "expected IP:PORT or HOST:PORT, e.g. 127.0.0.1:9757, [::1]:9757 or localhost:9757",
        ),
        (&["--metrics-listen", "localhost:http"], "port \"http\" is not accepted: expected a number from 0 to 65535"),
    ];
    for (flags, expected) in cases {
        let message = usage_message(flags);
        assert!(message.starts_with("cri-imaged: "), "{flags:?}: {message}");
        assert!(message.contains(expected), "{flags:?}: {message}");
    }
}

#[test]
fn help_and_version_are_not_errors() {
    for flag in ["--help", "--version"] {
        let error = Cli::try_parse_from(["cri-imaged", flag]).expect_err("clap stops there");
        assert_eq!(usage_error(&error), None, "{flag}");
    }
}

#[test]
fn metrics_listen_takes_an_address_or_a_host_name() {
    assert_eq!(parse_listen_address("127.0.0.1:9757"), Ok(SocketAddr::from(([127, 0, 0, 1], 9757))));
    assert_eq!(parse_listen_address("[::1]:9757"), "[::1]:9757".parse().map_err(|_| ValueError::NotAnAddress));
    assert_eq!(parse_listen_address("localhost:9757"), Ok(SocketAddr::from(([127, 0, 0, 1], 9757))));
    assert!(matches!(parse_listen_address("no-such-host.invalid:1"), Err(ValueError::Unresolved { .. })));
}

#[test]
fn a_host_limit_takes_a_host_with_its_port_a_rate_and_a_burst() {
    let (host, limit) = parse_host_limit("registry.local:5000=2.5:4").expect("valid");
    assert_eq!(host, "registry.local:5000");
    assert_eq!(limit, RateLimit { qps: 2.5, burst: std::num::NonZeroU32::new(4).expect("non-zero") });
    assert_eq!(parse_host_limit("docker.io=x:10"), Err(ValueError::HostQps("x".to_owned())));
    assert_eq!(parse_host_limit("docker.io=5"), Err(ValueError::NotAHostLimit));
}

fn load_with_file(text: &str, flags: &[&str]) -> Result<Loaded, LoadError> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, text).expect("config written");
    let config = path.to_str().expect("utf-8").to_owned();
    let argv = ["cri-imaged", "serve", "--config", &config].into_iter().chain(flags.iter().copied());
    let argv = argv.map(OsString::from);
    load(&argv.collect::<Vec<_>>())
}

fn serve_args(loaded: Loaded) -> ServeArgs {
    let Command::Serve(args) = loaded.cli.command else { panic!("a serve command line") };
    args
}

fn no_file() -> Loaded {
    load(&["cri-imaged", "serve"].map(OsString::from)).expect("defaults load")
}

#[test]
fn the_file_sets_what_the_command_line_leaves_and_a_flag_wins_over_it() {
    let text = "registry-qps: 2\nregistry-burst: 3\nregistry-qps-per-host: [docker.io=1:1]\n";
    let args = serve_args(load_with_file(text, &["--registry-burst", "7"]).expect("valid"));
    assert_eq!(args.registry_qps, 2.0, "from the file");
    assert_eq!(args.registry_burst, 7, "the flag wins");
    assert_eq!(args.registry_qps_per_host.len(), 1);
    assert_eq!(args.shutdown_timeout, Duration::from_secs(30), "the default where neither says");
    let flag_list = ["--registry-qps-per-host", "quay.io=2:2"];
    let args = serve_args(load_with_file(text, &flag_list).expect("valid"));
    let hosts: Vec<&str> = args.registry_qps_per_host.iter().map(|(host, _)| host.as_str()).collect();
    assert_eq!(hosts, ["quay.io"], "a repeatable flag replaces the file's list, not adds to it");
}

#[test]
fn values_from_the_file_are_checked_together_as_flags_are() {
    let halves = load_with_file("image-credential-provider-config: /etc/p.yaml\n", &[]).expect("loads");
    assert_eq!(
        serve_args(halves).credential_providers().expect_err("half").to_string(),
        "invalid configuration: --image-credential-provider-config needs --image-credential-provider-bin-dir: the plugins' config and the directory they are in go together"
    );
    let backwards = load_with_file("image-pull-backoff-initial: 10m\nimage-pull-backoff-max: 90s\n", &[]);
    assert!(matches!(
        serve_args(backwards.expect("loads")).manager_config(),
        Err(ConfigError::BackoffInitialAboveMax { .. })
    ));
    let missing = load(&["cri-imaged", "serve", "--config", "/nonexistent/cri-imaged.yaml"].map(OsString::from));
    assert!(
        matches!(&missing, Err(LoadError::File(file::FileError::Read { .. }))),
        "{:?}",
        missing.map(|loaded| loaded.values)
    );
}

#[test]
fn the_shipped_config_file_has_every_flag_and_sets_only_the_defaults() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/cri-imaged.yaml");
    let text = std::fs::read_to_string(path).expect("the shipped config");
    let loaded = load(&["cri-imaged", "serve", "--config", path].map(OsString::from)).expect("the shipped file loads");
    assert_eq!(no_file().values.changes(&loaded.values), [], "every value is the default");
    let serve = Cli::command().find_subcommand("serve").expect("serve").clone();
    for long in serve.get_arguments().filter_map(clap::Arg::get_long).filter(|long| *long != file::CONFIG_FIELD) {
        let written = text.lines().any(|line| {
            let line = line.trim_start_matches(['#', ' ']);
            line.strip_prefix(long).is_some_and(|rest| rest.starts_with(':'))
        });
        assert!(written, "{long} is missing from {path}");
    }
}

#[test]
fn changes_name_each_flag_whose_value_differs() {
    let before = no_file().values;
    let same = load_with_file("registry-qps: 5.0\nimage-pull-backoff-max: 5m\nimage-gc-period: 300s\n", &[]);
    assert_eq!(before.changes(&same.expect("valid").values), [], "another spelling of the same value");
    let after = load_with_file("registry-qps: 2\nregistry-qps-per-host: [a.io=1:1, b.io=2:2]\n", &[]).expect("valid");
    let changes = before.changes(&after.values);
    let change = |flag: &str, from: &str, to: &str| Change { flag: flag.into(), from: from.into(), to: to.into() };
    assert_eq!(
        changes,
        [change("registry-qps", "5", "2"), change("registry-qps-per-host", "unset", "a.io=1:1, b.io=2:2")]
    );
    let mut running = before.clone();
    running.take("registry-qps", &after.values);
    assert_eq!(running.changes(&after.values).len(), 1, "only the per-host limits still differ");
    assert!(running.knows("registry-qps") && !running.knows("config") && !running.knows("no-such-flag"));
}

#[test]
fn a_bad_runtime_endpoint_is_a_usage_error_that_names_it() {
    let error = Cli::try_parse_from(["cri-imaged", "serve", "--runtime-endpoint", "tcp://10.0.0.1:1"])
        .expect_err("tcp is not supported");
    assert!(error.to_string().contains("tcp://10.0.0.1:1"), "{error}");
}

#[test]
fn big_pulls_make_way_above_64_mib_unless_set_to_0() {
    let yield_above = |flags: &[&str]| manager_config(flags).expect("valid").scheduler.yield_above;
    assert_eq!(yield_above(&[]), Some(64 << 20));
    assert_eq!(yield_above(&["--yield-pulls-above-mib", "1024"]), Some(1 << 30));
    assert_eq!(yield_above(&["--yield-pulls-above-mib", "0"]), None);
    let refused = Cli::try_parse_from(["cri-imaged", "serve", "--yield-pulls-above-mib", "-1"]).err();
    let refused = refused.expect("a negative size is refused").to_string();
    assert!(refused.contains("invalid value '-1' for '--yield-pulls-above-mib <MIB>'"), "{refused}");
}

#[test]
fn the_kubelets_root_dir_is_read_for_its_records_but_never_shared() {
    let args = |flags: &[&str]| {
        let argv: Vec<OsString> = ["cri-imaged", "serve"].iter().chain(flags).map(OsString::from).collect();
        serve_args(load(&argv).expect("loads"))
    };
    assert_eq!(args(&[]).kubelet_root_dir().expect("valid"), Some(PathBuf::from("/var/lib/kubelet")));
    assert_eq!(args(&["--kubelet-root-dir", ""]).kubelet_root_dir().expect("valid"), None, "empty: none read");
    let dir = tempfile::tempdir().expect("tempdir");
    let same = dir.path().to_str().expect("utf-8");
    let other_spelling = format!("{same}/.");
    let shared = args(&["--root-dir", same, "--kubelet-root-dir", &other_spelling]).kubelet_root_dir();
    let refused = shared.expect_err("shared").to_string();
    assert!(refused.contains("is the kubelet's --root-dir (--kubelet-root-dir)"), "{refused}");
}
