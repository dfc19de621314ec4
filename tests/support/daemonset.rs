//! The DaemonSet's manifest (deploy/kubernetes/daemonset.yaml) as the tests read it, and its
//! container image built by scripts/build-image.sh with buildah, in a store of its own.

use std::{
    collections::BTreeSet,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Output, Stdio},
    sync::mpsc,
    time::Duration,
};

use serde_yaml_ng::Value;

use super::process::{http_get, in_ci, require_tool};

pub const DAEMONSET: &str = "deploy/kubernetes/daemonset.yaml";

/// The longest an image build may take (it copies the debug binary, about 120 MB, a few times).
const BUILD_LIMIT: Duration = Duration::from_secs(180);

/// The longest one `buildah` call other than the build may take, beyond what it runs.
pub const BUILDAH_LIMIT: Duration = Duration::from_secs(30);

/// The repository's root.
pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

pub fn daemonset() -> Value {
    let text = std::fs::read_to_string(repo().join(DAEMONSET)).expect("the DaemonSet");
    serde_yaml_ng::from_str(&text).expect("the DaemonSet is YAML")
}

/// The DaemonSet's one container.
pub fn container(daemonset: &Value) -> Value {
    let containers = daemonset["spec"]["template"]["spec"]["containers"].as_sequence().expect("containers");
    assert_eq!(containers.len(), 1, "one container");
    containers[0].clone()
}

pub fn image_name() -> String {
    container(&daemonset())["image"].as_str().expect("image").to_owned()
}

pub fn args(container: &Value) -> Vec<String> {
    let args = container["args"].as_sequence().expect("args");
    args.iter().map(|arg| arg.as_str().expect("a string").to_owned()).collect()
}

/// The value of `--name=VALUE` among `args` (the DaemonSet writes every flag so).
pub fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter().find_map(|arg| arg.strip_prefix(name)?.strip_prefix('=')).map(str::to_owned)
}

pub fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

pub fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// Runs `command` in a process group of its own to its end, at most `limit`; past that the
/// whole group is killed and the test fails, naming `what`.
pub fn run_bounded(mut command: Command, limit: Duration, what: &str) -> Output {
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

pub fn kill_group(pid: u32, signal: &str) {
    let mut kill = Command::new("kill");
    kill.arg(format!("-{signal}")).arg("--").arg(format!("-{pid}")).stderr(Stdio::null());
    let _ = kill.status();
}

/// One of the container's volume mounts with its volume, a hostPath (the DaemonSet has no other).
#[derive(Debug, Clone)]
pub struct VolumeMount {
    pub name: String,
    pub mount_path: String,
    pub read_only: bool,
    /// The volume's path on the node.
    pub host_path: String,
    /// The hostPath's `type` (`Directory`, `DirectoryOrCreate`, `Socket`, ...).
    pub host_type: String,
}

/// The volume mounts of the DaemonSet's container, with their volumes.
pub fn volume_mounts(daemonset: &Value) -> Vec<VolumeMount> {
    let volumes = daemonset["spec"]["template"]["spec"]["volumes"].as_sequence().expect("volumes");
    let container = container(daemonset);
    let mounts = container["volumeMounts"].as_sequence().expect("volumeMounts");
    mounts
        .iter()
        .map(|mount| {
            let name = mount["name"].as_str().expect("a mount's name").to_owned();
            let volume = volumes.iter().find(|volume| volume["name"] == name.as_str()).expect("the mount's volume");
            let host = &volume["hostPath"];
            VolumeMount {
                mount_path: mount["mountPath"].as_str().expect("mountPath").to_owned(),
                read_only: mount["readOnly"].as_bool().unwrap_or(false),
                host_path: host["path"].as_str().unwrap_or_else(|| panic!("{name} is a hostPath")).to_owned(),
                host_type: host["type"].as_str().unwrap_or_default().to_owned(),
                name,
            }
        })
        .collect()
}

/// A host directory or file bind-mounted at `path` in the container.
pub struct Mount {
    pub host: PathBuf,
    pub path: String,
    pub read_only: bool,
}

/// The host side of the container's `path`, through the mount that holds it.
pub fn host_path(mounts: &[Mount], path: &str) -> PathBuf {
    let mount = mounts
        .iter()
        .filter(|mount| Path::new(path).starts_with(&mount.path))
        .max_by_key(|mount| mount.path.len())
        .unwrap_or_else(|| panic!("no volume mount holds {path}"));
    match Path::new(path).strip_prefix(&mount.path).expect("under the mount") {
        // The mount itself (a file: `host.join("")` would add a slash).
        rest if rest.as_os_str().is_empty() => mount.host.clone(),
        rest => mount.host.join(rest),
    }
}

/// An image built by scripts/build-image.sh from the test build's binary, in an image store of
/// its own that goes with it.
pub struct BuiltImage {
    store: tempfile::TempDir,
    tag: String,
}

impl BuiltImage {
    /// Builds the image as `tag`; outside CI, `None` (saying so) when a tool or root is missing.
    pub fn build(tag: &str) -> Option<Self> {
        for tool in ["buildah", "python3"] {
            require_tool(tool)?;
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
    pub fn buildah(&self) -> Command {
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
    pub fn config(&self, field: &str) -> Vec<String> {
        let mut inspect = self.buildah();
        inspect.args(["inspect", "--type", "image", &self.tag]);
        let output = run_bounded(inspect, BUILDAH_LIMIT, "buildah inspect");
        assert!(output.status.success(), "{}", text(&output));
        let image: serde_json::Value = serde_json::from_slice(&output.stdout).expect("buildah inspect prints JSON");
        serde_json::from_value(image["OCIv1"]["config"][field].clone()).unwrap_or_else(|_| panic!("{field}: {image}"))
    }

    pub fn entrypoint(&self) -> Vec<String> {
        let entrypoint = self.config("Entrypoint");
        assert_eq!(entrypoint, ["/usr/local/bin/cri-imaged"]);
        entrypoint
    }

    /// A working container of the image (its name).
    pub fn container(&self) -> String {
        let mut from = self.buildah();
        from.args(["from", "--pull-never", &self.tag]);
        let output = run_bounded(from, BUILDAH_LIMIT, "buildah from");
        assert!(output.status.success(), "{}", text(&output));
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// Every path in `container`'s root filesystem (the volumes' contents are not in it).
    pub fn files(&self, container: &str) -> BTreeSet<PathBuf> {
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
    pub fn run(&self, container: &str, mounts: &[Mount], argv: &[String]) -> Command {
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
pub struct Background {
    child: Child,
    log: PathBuf,
}

impl Background {
    pub fn spawn(mut command: Command, log: &Path) -> Self {
        let out = std::fs::File::create(log).expect("log file");
        let err = out.try_clone().expect("log file");
        let child = command.stdin(Stdio::null()).stdout(out).stderr(err).process_group(0).spawn().expect("starts");
        Self { child, log: log.to_owned() }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the process to exit, at most `limit`; `None` if it is still running.
    pub fn wait(&mut self, limit: Duration) -> Option<ExitStatus> {
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
pub struct Probe {
    path: String,
}

impl Probe {
    pub fn of(container: &Value, name: &str) -> Self {
        let get = &container[name]["httpGet"];
        assert_eq!(get["port"].as_str(), Some("metrics"), "{name} is an httpGet on the metrics port: {get:?}");
        Self { path: get["path"].as_str().unwrap_or_else(|| panic!("{name}'s path")).to_owned() }
    }

    /// GETs the probe's path on `port` until the answer is a success (2xx, as the kubelet counts
    /// one) or not, as `success` says, at most `limit`; returns the last response.
    pub fn wait_for(&self, port: u16, success: bool, limit: Duration) -> String {
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
