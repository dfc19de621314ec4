//! The deployment artifacts: the DaemonSet against the Kubernetes schemas, and the Dockerfile's
//! image built offline with buildah and run with the DaemonSet's args, mounts, capabilities and
//! probes.

mod support;

use std::{
    path::Path,
    process::{Command, Output},
    time::Duration,
};

use support::{
    daemonset::{
        BUILDAH_LIMIT, Background, BuiltImage, DAEMONSET, Mount, Probe, args, container, daemonset, flag, host_path,
        image_name, repo, run_bounded, text, volume_mounts,
    },
    fake_runtime::{FakeImageService, FakeRuntime},
    process::{free_port, http_get, require_tool},
};

/// The Kubernetes releases the DaemonSet is checked against (kubernetes-validate ships their
/// schemas): one about two years old and the newest it has.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.31.0", "1.37.0"];

#[test]
fn the_daemonset_passes_strict_validation_against_the_kubernetes_schemas() {
    let Some(validate) = require_tool("kubernetes-validate") else { return };
    for version in KUBERNETES_VERSIONS {
        let output = kubernetes_validate(&validate, version, &repo().join(DAEMONSET));
        assert!(output.status.success(), "kubernetes-validate {version} refused {DAEMONSET}:\n{}", text(&output));
        assert!(text(&output).contains("passed"), "{}", text(&output));
        eprintln!("{}", text(&output).trim());
    }
}

#[test]
fn strict_validation_refuses_a_daemonset_with_an_unknown_field() {
    let Some(validate) = require_tool("kubernetes-validate") else { return };
    let mut daemonset = daemonset();
    let container = daemonset["spec"]["template"]["spec"]["containers"][0].as_mapping_mut().expect("a container");
    container.insert("imagePullPolicyy".into(), "Always".into());
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("daemonset.yaml");
    std::fs::write(&file, serde_yaml_ng::to_string(&daemonset).expect("yaml")).expect("write");

    let output = kubernetes_validate(&validate, KUBERNETES_VERSIONS[1], &file);
    assert!(!output.status.success(), "an unknown field passed:\n{}", text(&output));
    assert!(text(&output).contains("'imagePullPolicyy' was unexpected"), "{}", text(&output));
}

#[test]
fn the_daemonsets_agents_may_pull_and_read_but_only_root_may_remove() {
    let args = args(&container(&daemonset()));
    assert_eq!(flag(&args, "--default-role").as_deref(), Some("pull"), "agents pull: EnsureImageExists");
    assert!(flag(&args, "--role").is_none(), "no caller but root is admin");
}

#[test]
fn the_daemonsets_daemon_collects_no_images_of_its_own_beside_the_kubelets_gc() {
    let args = args(&container(&daemonset()));
    assert_eq!(flag(&args, "--image-gc-high-threshold").as_deref(), Some("100"), "periodic GC off: {args:?}");
    let max_age = flag(&args, "--image-maximum-gc-age");
    assert!(max_age.is_none() || max_age.as_deref() == Some("0s"), "no collection by age either: {args:?}");
}

#[test]
fn the_daemonset_exposes_the_metrics_port_its_daemon_listens_on() {
    let container = container(&daemonset());
    let listen = flag(&args(&container), "--metrics-listen").expect("--metrics-listen");
    let port: u64 = listen.rsplit_once(':').expect("ADDR:PORT").1.parse().expect("a port");
    let ports = container["ports"].as_sequence().expect("ports");
    let metrics = ports.iter().find(|p| p["name"] == "metrics").expect("a port named metrics");
    assert_eq!(metrics["containerPort"].as_u64(), Some(port), "{ports:?}");
}

#[test]
fn the_image_builds_offline_from_the_test_binary_and_prints_its_version() {
    let Some(image) = BuiltImage::build(&image_name()) else { return };
    assert_eq!(image.config("Cmd"), ["serve"]);
    let container = image.container();
    let mut argv = image.entrypoint();
    argv.push("--version".into());

    let output = run_bounded(image.run(&container, &[], &argv), BUILDAH_LIMIT, "cri-imaged --version");
    assert!(output.status.success(), "{}", text(&output));
    let version = String::from_utf8_lossy(&output.stdout);
    assert_eq!(version.trim(), format!("cri-imaged {}", env!("CARGO_PKG_VERSION")));
}

/// The daemon runs from the image as the DaemonSet runs it: the image's entrypoint and the
/// DaemonSet's args, each volume mount a host directory at its mount path (read-only where the
/// DaemonSet says), every capability dropped; a fake runtime serves on the runtime endpoint's
/// host side. The probes are the kubelet's HTTP GETs, on the metrics port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_the_image_the_daemonsets_probes_follow_the_runtime_while_the_socket_stays_live() {
    let daemonset = daemonset();
    let container = container(&daemonset);
    let Some(image) = BuiltImage::build(container["image"].as_str().expect("image")) else { return };
    let ctr = image.container();

    let volumes = tempfile::tempdir().expect("tempdir");
    // Each hostPath volume a path of its own here: a directory, or (a socket) where the fake
    // runtime listens, before the container starts.
    let mounts: Vec<Mount> = volume_mounts(&daemonset)
        .into_iter()
        .map(|mount| {
            let host = volumes.path().join(&mount.name);
            if mount.host_type != "Socket" {
                std::fs::create_dir(&host).expect("a volume's host directory");
            }
            Mount { host, path: mount.mount_path, read_only: mount.read_only }
        })
        .collect();
    let args = args(&container);
    let endpoint = flag(&args, "--runtime-endpoint").expect("--runtime-endpoint");
    let runtime_socket = host_path(&mounts, endpoint.strip_prefix("unix://").unwrap_or(&endpoint));
    let runtime = FakeRuntime::start_with_events(&runtime_socket, FakeImageService::default());

    // The DaemonSet's args, with the metrics on a free loopback port (buildah's chroot shares the
    // host's network) and quick runtime probes, so that health turns within a second.
    let metrics_port = free_port();
    let mut argv = image.entrypoint();
    argv.extend(args.iter().map(|arg| match arg.split_once('=') {
        Some(("--metrics-listen", _)) => format!("--metrics-listen=127.0.0.1:{metrics_port}"),
        _ => arg.clone(),
    }));
    for quick in ["--health-probe-interval=200ms", "--health-probe-timeout=200ms"] {
        assert!(flag(&args, quick.split_once('=').unwrap().0).is_none(), "the DaemonSet sets {quick}: adapt the test");
        argv.push(quick.into());
    }
    // What the container's root filesystem holds once buildah has set it up (its /etc/hosts, the
    // mount points), so that anything written there later shows.
    let version = [image.entrypoint(), vec!["--version".into()]].concat();
    let set_up = run_bounded(image.run(&ctr, &mounts, &version), BUILDAH_LIMIT, "cri-imaged --version");
    assert!(set_up.status.success(), "{}", text(&set_up));
    let files_before = image.files(&ctr);
    let log = volumes.path().join("daemon.log");
    let daemon = Background::spawn(image.run(&ctr, &mounts, &argv), &log);

    let readiness = Probe::of(&container, "readinessProbe");
    let liveness = Probe::of(&container, "livenessProbe");
    let probe = |probe: &Probe, success| {
        let probe = probe.clone();
        tokio::task::spawn_blocking(move || probe.wait_for(metrics_port, success, Duration::from_secs(20)))
    };
    let ready = probe(&readiness, true).await.expect("probed");
    assert!(ready.starts_with("HTTP/1.1 200"), "never ready: {ready}\ndaemon log:\n{}", daemon.log());
    let live = probe(&liveness, true).await.expect("probed");
    assert!(live.starts_with("HTTP/1.1 200"), "not live: {live}\ndaemon log:\n{}", daemon.log());
    let metrics = tokio::task::spawn_blocking(move || http_get(metrics_port, "/metrics")).await.expect("metrics");
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");

    // containerd goes away: unready, still live (never restarted for the runtime's sake).
    runtime.stop().await;
    let unready = probe(&readiness, false).await.expect("probed");
    assert!(unready.starts_with("HTTP/1.1 503"), "still ready without a runtime: {unready}\nlog:\n{}", daemon.log());
    assert!(unready.contains("NOT_SERVING"), "the answer says why (the pod's events show it): {unready}");
    let live = probe(&liveness, true).await.expect("probed");
    assert!(live.starts_with("HTTP/1.1 200"), "not live without a runtime: {live}\nlog:\n{}", daemon.log());
    // The DaemonSet's daemon leaves image GC to the kubelet.
    assert!(daemon.log().contains("Disable image GC"), "{}", daemon.log());

    let listen = flag(&args, "--listen").expect("--listen");
    assert_ne!(listen, "/run/cri-imaged/cri-imaged.sock", "never the socket a kubelet is pointed at");
    let socket = host_path(&mounts, listen.as_str());
    assert!(socket.exists(), "the socket is on the host at {}", socket.display());
    let log = daemon.log();
    drop(daemon);
    let files = image.files(&ctr);
    let written: Vec<_> = files.difference(&files_before).collect();
    assert!(written.is_empty(), "written outside the volumes (readOnlyRootFilesystem): {written:?}; log:\n{log}");
}

fn kubernetes_validate(validate: &Path, version: &str, file: &Path) -> Output {
    let mut command = Command::new(validate);
    command.args(["--strict", "--kubernetes-version", version]).arg(file);
    run_bounded(command, Duration::from_secs(60), "kubernetes-validate")
}
