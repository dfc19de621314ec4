//! The DaemonSet's pod as a kubelet runs it, through containerd's CRI (RunPodSandbox,
//! CreateContainer, StartContainer from Python grpcio), with the container's config read from
//! deploy/kubernetes/daemonset.yaml itself: its image (built by scripts/build-image.sh and loaded
//! into containerd, as on a node), args, hostPath mounts (their host side in the test's stack),
//! securityContext, resources and namespaces. There is no API server and no CNI here: the pod has
//! the node's network (the metrics port moved to a free loopback port), and the test does what
//! the kubelet's probes would make it do.

mod support;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use serde_json::{Value, json};
use serde_yaml_ng::Value as Yaml;
use support::{
    daemonset::{
        BUILDAH_LIMIT, BuiltImage, Probe, VolumeMount, args, container, daemonset, flag, run_bounded, text,
        volume_mounts,
    },
    process::{free_port, metric, metric_with_label, require_tool},
    stack::LocalStack,
};
use tokio::time::Instant;

/// The kubelet's default masked and read-only paths of /proc and /sys (`procMount: Default`).
const MASKED_PATHS: [&str; 11] = [
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
const READONLY_PATHS: [&str; 5] = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"];

/// The shell image of the second container, beside the daemon's (which has no shell).
const SHELL_IMAGE: &str = "localhost/cri-imaged-test-shell:1";

/// The one `--liveness-runtime-timeout` of these tests, shorter than the DaemonSet's 60 s.
const LIVENESS_TIMEOUT: Duration = Duration::from_secs(10);

/// The pod's container can write into nothing of containerd's: a second container with the same
/// mounts and securityContext tries to create a file in every directory below every mount (the
/// submounts included) and to touch each mount that is a file; only the daemon's own two
/// directories take it. The same probe with the DaemonSet's former mount of containerd's state
/// directory (`/run/containerd`, `readOnly: true`) writes into a running container's root
/// filesystem: the probe finds what it looks for.
#[test]
fn the_daemonsets_pod_can_write_only_to_its_own_two_directories() {
    let Some(node) = Node::start() else { return };
    // Another pod's container, running: its root filesystem is a mount in containerd's state.
    let victim = node.stack.image("victim:1");
    node.stack.seed_sized("victim:1", 0);
    node.stack.pull(&victim);
    node.stack.run_container(&victim);
    let daemon = node.run_daemon("cri-imaged", 0, &[]);
    node.wait_ready(&daemon, Duration::from_secs(30));
    node.assert_confined(&daemon);

    let found = node.probe_writes(&[]);
    let own: Vec<String> = node.mounts.iter().filter(|mount| !mount.read_only).map(|m| m.mount_path.clone()).collect();
    assert_eq!(own, ["/run/cri-imaged", "/var/lib/cri-imaged"], "the daemon's own directories are its writable mounts");
    assert!(found.tried.len() >= node.mounts.len(), "every mount tried: {found:?}");
    let elsewhere: Vec<&String> =
        found.written.iter().filter(|path| !own.iter().any(|dir| Path::new(path).starts_with(dir))).collect();
    assert!(elsewhere.is_empty(), "written outside the daemon's directories: {elsewhere:?}\n{found:?}");
    for dir in &own {
        assert!(found.written.contains(dir), "the daemon's {dir} takes writes (the probe works): {found:?}");
    }
    let socket = node.mounts.iter().find(|mount| mount.host_type == "Socket").expect("the runtime's socket");
    assert!(found.tried.contains(&socket.mount_path), "{found:?}");

    // The DaemonSet's former mount: containerd's state directory, read-only at its top only.
    let state = node.stack.dir().join("containerd-state");
    let former = json!({ "container_path": "/run/containerd", "host_path": state, "readonly": true });
    let found = node.probe_writes(&[former]);
    let rootfs: Vec<&String> = found
        .written
        .iter()
        .filter(|path| path.starts_with("/run/containerd/io.containerd.runtime.v2.task/") && path.contains("/rootfs"))
        .collect();
    assert!(
        !rootfs.is_empty(),
        "a running container's rootfs is writable below a read-only /run/containerd: {found:?}"
    );
    eprintln!(
        "with /run/containerd mounted read-only, {} directories took a write, e.g. {}",
        found.written.len(),
        rootfs[0]
    );
}

/// Readiness follows containerd: 503 within seconds of it stopping (the manifest's probe
/// settings then make the pod unready within 30 s). The socket is mounted as a file, so a
/// restarted containerd's new socket is out of the container's reach: it stays unready, /livez
/// turns 503 after `--liveness-runtime-timeout`, and the container a kubelet then makes (a new
/// attempt in the same pod) is ready. No image GC pass runs meanwhile; `status` and
/// `gc --dry-run` answer without containerd's image filesystem mounted.
#[test]
fn the_daemonsets_probes_follow_containerd_and_a_new_container_reaches_its_new_socket() {
    let Some(node) = Node::start() else { return };
    let manifest = container(&node.daemonset);
    let readiness = Probe::of(&manifest, "readinessProbe");
    let liveness = Probe::of(&manifest, "livenessProbe");
    let daemon = node.run_daemon("cri-imaged", 0, &[]);
    node.wait_ready(&daemon, Duration::from_secs(30));
    let live = liveness.wait_for(daemon.port, true, Duration::from_secs(1));
    assert!(live.starts_with("HTTP/1.1 200"), "{live}");

    assert_eq!(metric(daemon.port, "cri_imaged_image_gc_passes_total"), 0.0, "no GC pass at start");
    // The image filesystem is not mounted: GetStatus leaves it out, a dry run says why it cannot
    // plan, and neither fills the log.
    let cli = |args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_cri-imaged"));
        command.args(args).arg("--socket").arg(&node.agents_socket);
        run_bounded(command, Duration::from_secs(30), "cri-imaged")
    };
    let status = cli(&["status", "-o", "json"]);
    assert!(status.status.success(), "{}", text(&status));
    let answer: Value = serde_json::from_slice(&status.stdout).unwrap_or_else(|_| panic!("{}", text(&status)));
    assert_eq!(answer["runtimeReachable"], true, "{answer}");
    assert!(answer.get("imageFs").is_none_or(Value::is_null), "no image filesystem to report: {answer}");
    let dry_run = cli(&["gc", "--dry-run"]);
    assert!(!dry_run.status.success(), "{}", text(&dry_run));
    assert!(text(&dry_run).contains("this daemon does not see that path"), "{}", text(&dry_run));
    assert_eq!(metric(daemon.port, "cri_imaged_image_gc_passes_total"), 1.0, "the dry run asked for, alone");

    // containerd stops.
    let stopped = Instant::now();
    support::process::signal_process("-TERM", node.stack.containerd_pid());
    while node.stack.processes().iter().any(|(_, name)| name == "containerd") {
        assert!(stopped.elapsed() < Duration::from_secs(15), "containerd did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
    let unready = readiness.wait_for(daemon.port, false, Duration::from_secs(20));
    let turned = stopped.elapsed();
    assert!(unready.starts_with("HTTP/1.1 503") && unready.contains("NOT_SERVING"), "{unready}");
    // The kubelet sees it within `failureThreshold` probes, `periodSeconds` apart.
    let kubelet = probe_seconds(&manifest["readinessProbe"], "periodSeconds")
        * probe_seconds(&manifest["readinessProbe"], "failureThreshold");
    eprintln!(
        "/readyz turned 503 {turned:.1?} after containerd stopped; the kubelet's probes see it within {kubelet} s more"
    );
    assert!(turned + Duration::from_secs(kubelet) <= Duration::from_secs(30), "the pod turns unready within 30 s");

    // containerd is back, with a new socket the container's mount does not show.
    node.stack.restart_containerd();
    let dead = liveness.wait_for(daemon.port, false, LIVENESS_TIMEOUT + Duration::from_secs(15));
    assert!(dead.starts_with("HTTP/1.1 503") && dead.contains("unreachable"), "{dead}\n{}", node.log(&daemon));
    let died = stopped.elapsed();
    eprintln!(
        "/livez turned 503 {died:.1?} after containerd stopped (--liveness-runtime-timeout={LIVENESS_TIMEOUT:?})"
    );
    assert!(died >= LIVENESS_TIMEOUT, "not before the timeout: {died:?}");
    let still = readiness.wait_for(daemon.port, true, Duration::ZERO);
    assert!(still.starts_with("HTTP/1.1 503"), "the old socket is dead: {still}");

    // What the kubelet does after `failureThreshold` failed liveness probes: stop the container
    // (its grace period) and make the next attempt in the same pod.
    let grace = node.daemonset["spec"]["template"]["spec"]["terminationGracePeriodSeconds"].as_u64().expect("grace");
    node.stack.cri("runtime.v1.RuntimeService/StopContainer", json!({ "container_id": daemon.id, "timeout": grace }));
    let log = node.log(&daemon);
    let again = node.run_daemon("cri-imaged", 1, &[]);
    node.wait_ready(&again, Duration::from_secs(30));
    eprintln!("the new container was ready {:.1?} after containerd stopped", stopped.elapsed());

    // Image GC never ran of itself, in either container.
    assert_eq!(metric(again.port, "cri_imaged_image_gc_passes_total"), 0.0, "no GC pass in the new container");
    let log = log + &node.log(&again);
    assert_eq!(log.matches("Disable image GC").count(), 2, "each container said so at start:\n{log}");
    assert!(!log.contains("Image garbage collection"), "no periodic pass, failed or not:\n{log}");
    let statvfs = log.lines().filter(|line| line.contains("statvfs")).count();
    assert!(statvfs <= 1, "the missing image filesystem logged {statvfs} times:\n{log}");
    eprintln!("the two containers logged {} lines, {statvfs} of them about the image filesystem", log.lines().count());
}

/// A caller in another PID namespace than the daemon's (the host's agents) is a client of its
/// own: one holding its whole share of connections leaves the next one served.
#[test]
fn callers_outside_the_pods_pid_namespace_each_have_their_own_connection_share() {
    let Some(node) = Node::start() else { return };
    let per_client = 4;
    let daemon = node.run_daemon("cri-imaged", 0, &[&format!("--max-connections-per-client={per_client}")]);
    node.wait_ready(&daemon, Duration::from_secs(30));
    let Some(setpriv) = require_tool("setpriv") else { return };
    // Two unprivileged processes on the host: the first holds its share open, the second asks.
    let nobody = |uid: u32| {
        let mut command = Command::new(&setpriv);
        command.args([&format!("--reuid={uid}"), "--regid=65534", "--clear-groups", "--"]);
        command
    };
    // Open to them: the socket, and the way to it through the test's private directories.
    let opened = |path: &Path, mode| std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode));
    opened(&node.agents_socket, 0o666).expect("chmod the socket");
    for dir in node.agents_socket.ancestors().skip(1).take_while(|dir| dir.starts_with(node.stack.dir())) {
        opened(dir, 0o755).expect("chmod a directory");
    }
    // Debian's Python (the standard library alone), which an unprivileged user can run.
    let python = Path::new("/usr/bin/python3");
    assert!(python.exists(), "{} is missing", python.display());
    let mut holder = nobody(65534);
    holder.arg(python).args(["-c", HOLD_SHARE]).arg(&node.agents_socket).arg(per_client.to_string());
    let mut holder = holder.stdout(std::process::Stdio::piped()).spawn().expect("the holder starts");
    let mut said = std::io::BufReader::new(holder.stdout.take().expect("stdout"));
    let mut line = || {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut said, &mut line).expect("the holder's output");
        line.trim().to_owned()
    };
    assert_eq!(line(), "held");
    assert_eq!(line(), "one more refused", "its share is full");
    let closed = || metric_with_label(daemon.port, "cri_imaged_connections_closed_total", "reason=\"client_share\"");
    assert_eq!(closed(), 1.0, "the holder's one more, for its share");
    let mut asker = nobody(65534);
    asker.arg(env!("CARGO_BIN_EXE_cri-imaged")).args(["status", "-o", "json", "--socket"]).arg(&node.agents_socket);
    let asked = run_bounded(asker, Duration::from_secs(30), "status from a second caller");
    let _ = holder.kill();
    let _ = holder.wait();
    assert!(asked.status.success(), "the second caller was refused: {}", text(&asked));
    assert_eq!(closed(), 1.0, "the second caller's connection counts against its own share");
}

/// Holds `argv[2]` HTTP/2 connections to the socket `argv[1]` (the preface and SETTINGS sent: each
/// is a client's connection then), says `held`, tries one more and says whether it was served
/// (still open after 3 s) or refused (closed), and sleeps until killed.
const HOLD_SHARE: &str = r"
import socket, sys, time

def connect(path):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(b'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n' + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
    return s

def open_after(s, seconds):
    # A connection refused is closed (its end read); one served stays open, quiet.
    s.settimeout(seconds)
    try:
        while s.recv(4096):
            pass
        return False
    except socket.timeout:
        return True
    except OSError:
        return False

held = [connect(sys.argv[1]) for _ in range(int(sys.argv[2]))]
assert all(open_after(s, 0.5) for s in held), 'a connection within the share was refused'
print('held', flush=True)
print('one more served' if open_after(connect(sys.argv[1]), 3) else 'one more refused', flush=True)
time.sleep(60)
";

/// A LocalStack with the daemon's and the shell's images loaded, and the DaemonSet's hostPaths
/// on its side.
struct Node {
    stack: LocalStack,
    daemonset: Yaml,
    mounts: Vec<VolumeMount>,
    /// The host side of each mount, in `mounts`' order.
    host_paths: Vec<PathBuf>,
    /// The agents' socket on the host.
    agents_socket: PathBuf,
    /// The pod every daemon container of a test runs in, and its config.
    pod: (String, Value),
    _images: BuiltImage,
}

/// A container of the DaemonSet's pod and its metrics port.
struct Daemon {
    id: String,
    port: u16,
    log: PathBuf,
}

/// What the write probe found: every path it tried, and those that took a write.
#[derive(Debug, Default)]
struct Writes {
    tried: Vec<String>,
    written: Vec<String>,
}

impl Node {
    /// Outside CI, `None` (saying why) when the machine cannot run it; in CI that fails.
    fn start() -> Option<Self> {
        let daemonset = daemonset();
        let image = container(&daemonset)["image"].as_str().expect("image").to_owned();
        let busybox = require_tool("busybox")?;
        require_tool("ctr")?;
        let images = BuiltImage::build(&image)?;
        let stack = LocalStack::start_with(Default::default())?;
        shell_image(&images, &busybox);
        for tag in [image.as_str(), SHELL_IMAGE] {
            load(&images, tag, &stack);
        }

        let mounts = volume_mounts(&daemonset);
        let args = args(&container(&daemonset));
        let endpoint = flag(&args, "--runtime-endpoint").expect("--runtime-endpoint");
        let host_paths: Vec<PathBuf> = mounts
            .iter()
            .map(|mount| match mount.host_type.as_str() {
                "Socket" => {
                    assert_eq!(format!("unix://{}", mount.mount_path), endpoint, "the socket mounted is the runtime's");
                    stack.containerd_socket.clone()
                }
                "DirectoryOrCreate" => {
                    let dir = stack.dir().join("node").join(mount.host_path.trim_start_matches('/'));
                    std::fs::create_dir_all(&dir).expect("a hostPath directory");
                    dir
                }
                other => panic!("a hostPath of type {other:?} ({}): map it to the stack here", mount.name),
            })
            .collect();
        let listen = flag(&args, "--listen").expect("--listen");
        let agents_socket = mounts
            .iter()
            .zip(&host_paths)
            .find_map(|(mount, host)| Some(host.join(Path::new(&listen).strip_prefix(&mount.mount_path).ok()?)))
            .expect("the agents' socket is on a mount");

        let spec = &daemonset["spec"]["template"]["spec"];
        let name = daemonset["metadata"]["name"].as_str().expect("name");
        let pod_dir = stack.dir().join("pods").join(name);
        std::fs::create_dir_all(&pod_dir).expect("pod dir");
        let pod = json!({
            "metadata": {
                "name": format!("{name}-node1"),
                "namespace": daemonset["metadata"]["namespace"].as_str().expect("namespace"),
                "uid": format!("{name}-node1-uid"),
                "attempt": 0,
            },
            "log_directory": pod_dir,
            "linux": {
                "cgroup_parent": stack.cgroup_parent,
                "security_context": { "namespace_options": namespace_options(spec) },
            },
        });
        let ran = stack.cri("runtime.v1.RuntimeService/RunPodSandbox", json!({ "config": pod }));
        let pod_id = ran["pod_sandbox_id"].as_str().expect("pod_sandbox_id").to_owned();
        Some(Self { stack, daemonset, mounts, host_paths, agents_socket, pod: (pod_id, pod), _images: images })
    }

    /// The container's config as the kubelet makes it from the DaemonSet's, for `image` and
    /// `argv` (the shell's probe), or the DaemonSet's own (`None`), with `extra` mounts.
    fn container_config(&self, name: &str, attempt: u32, command: Option<Vec<String>>, extra: &[Value]) -> Value {
        let manifest = container(&self.daemonset);
        let spec = &self.daemonset["spec"]["template"]["spec"];
        let context = &manifest["securityContext"];
        let known = [
            "runAsUser",
            "runAsGroup",
            "runAsNonRoot",
            "privileged",
            "allowPrivilegeEscalation",
            "readOnlyRootFilesystem",
            "capabilities",
            "seccompProfile",
        ];
        for key in context.as_mapping().expect("securityContext").keys() {
            assert!(
                known.contains(&key.as_str().unwrap_or_default()),
                "securityContext.{key:?}: make it here as the kubelet does"
            );
        }
        let strings = |value: &Yaml| -> Vec<String> {
            value
                .as_sequence()
                .map(|list| list.iter().map(|s| s.as_str().expect("a string").to_owned()).collect())
                .unwrap_or_default()
        };
        let seccomp = match context["seccompProfile"]["type"].as_str() {
            Some("RuntimeDefault") => json!({ "profile_type": "RuntimeDefault" }),
            other => panic!("seccompProfile {other:?}: make it here as the kubelet does"),
        };
        // An extra mount replaces the DaemonSet's at or below its path.
        let replaced = |path: &str| {
            extra.iter().any(|mount| Path::new(path).starts_with(mount["container_path"].as_str().unwrap_or("")))
        };
        let mut mounts: Vec<Value> = self
            .mounts
            .iter()
            .zip(&self.host_paths)
            .filter(|(mount, _)| !replaced(&mount.mount_path))
            .map(|(mount, host)| json!({ "container_path": mount.mount_path, "host_path": host, "readonly": mount.read_only }))
            .collect();
        mounts.extend_from_slice(extra);
        // The DaemonSet's container runs the image's entrypoint with its args (set by the caller).
        let (image, command) = match command {
            Some(argv) => (SHELL_IMAGE.to_owned(), argv),
            None => (manifest["image"].as_str().expect("image").to_owned(), Vec::new()),
        };
        let memory = quantity(manifest["resources"]["limits"]["memory"].as_str().expect("a memory limit"));
        json!({
            "metadata": { "name": name, "attempt": attempt },
            "image": { "image": image },
            "command": command,
            "log_path": format!("{name}-{attempt}.log"),
            "mounts": mounts,
            "linux": {
                "resources": { "memory_limit_in_bytes": memory },
                "security_context": {
                    "namespace_options": namespace_options(spec),
                    "run_as_user": { "value": context["runAsUser"].as_i64().expect("runAsUser") },
                    "run_as_group": { "value": context["runAsGroup"].as_i64().expect("runAsGroup") },
                    "privileged": context["privileged"].as_bool().unwrap_or(false),
                    "no_new_privs": !context["allowPrivilegeEscalation"].as_bool().unwrap_or(true),
                    "readonly_rootfs": context["readOnlyRootFilesystem"].as_bool().unwrap_or(false),
                    "capabilities": {
                        "drop_capabilities": strings(&context["capabilities"]["drop"]),
                        "add_capabilities": strings(&context["capabilities"]["add"]),
                    },
                    "seccomp": seccomp,
                    "masked_paths": MASKED_PATHS,
                    "readonly_paths": READONLY_PATHS,
                },
            },
        })
    }

    /// Creates and starts a container in the pod; its id.
    fn run(&self, config: Value) -> String {
        let (pod_id, pod) = &self.pod;
        let request = json!({ "pod_sandbox_id": pod_id, "config": config, "sandbox_config": pod });
        let created = self.stack.cri("runtime.v1.RuntimeService/CreateContainer", request);

        let id = created["container_id"].as_str().expect("container_id").to_owned();
        self.stack.cri("runtime.v1.RuntimeService/StartContainer", json!({ "container_id": id }));
        id
    }

    /// The DaemonSet's container, attempt `attempt`: its args with the metrics on a free loopback
    /// port (the pod has the node's network here), a short --liveness-runtime-timeout, and `extra`.
    fn run_daemon(&self, name: &str, attempt: u32, extra: &[&str]) -> Daemon {
        let port = free_port();
        let mut args = args(&container(&self.daemonset));
        for arg in &mut args {
            match arg.split_once('=') {
                Some(("--metrics-listen", _)) => *arg = format!("--metrics-listen=127.0.0.1:{port}"),
                Some(("--liveness-runtime-timeout", _)) => {
                    *arg = format!("--liveness-runtime-timeout={}s", LIVENESS_TIMEOUT.as_secs());
                }
                _ => {}
            }
        }
        assert!(flag(&args, "--liveness-runtime-timeout").is_some(), "the DaemonSet sets --liveness-runtime-timeout");
        args.extend(extra.iter().map(|arg| (*arg).to_owned()));
        let mut config = self.container_config(name, attempt, None, &[]);
        config["args"] = json!(args);
        let id = self.run(config);
        Daemon {
            id,
            port,
            log: self.pod.1["log_directory"]
                .as_str()
                .map(PathBuf::from)
                .expect("log dir")
                .join(format!("{name}-{attempt}.log")),
        }
    }

    fn wait_ready(&self, daemon: &Daemon, limit: Duration) {
        let readiness = Probe::of(&container(&self.daemonset), "readinessProbe");
        let ready = readiness.wait_for(daemon.port, true, limit);
        assert!(ready.starts_with("HTTP/1.1 200"), "never ready: {ready}\n{}", self.log(daemon));
    }

    /// The container's output, from its CRI log (`TIME STREAM TAG TEXT` lines).
    fn log(&self, daemon: &Daemon) -> String {
        cri_log(&daemon.log)
    }

    /// The daemon runs as the securityContext says: root, no capability, no new privileges,
    /// seccomp filtering, in a PID namespace of its own.
    fn assert_confined(&self, daemon: &Daemon) {
        let status = self
            .stack
            .cri("runtime.v1.RuntimeService/ContainerStatus", json!({ "container_id": daemon.id, "verbose": true }));
        let info: Value =
            serde_json::from_str(status["info"]["info"].as_str().expect("verbose info")).expect("info JSON");
        let pid = info["pid"].as_u64().expect("the container's pid");
        let proc_status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
        for line in [
            "Uid:\t0\t0\t0\t0",
            "CapEff:\t0000000000000000",
            "CapPrm:\t0000000000000000",
            "NoNewPrivs:\t1",
            "Seccomp:\t2",
        ] {
            assert!(proc_status.lines().any(|l| l == line), "{line:?} not in:\n{proc_status}");
        }
        let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/pid")).expect("pid namespace");
        assert_ne!(ns(&pid.to_string()), ns("self"), "a PID namespace of its own");
    }

    /// Runs the shell's write probe in the pod with the daemon's mounts and `extra` ones (each
    /// in place of the daemon's at or below its path).
    fn probe_writes(&self, extra: &[Value]) -> Writes {
        let attempt = u32::try_from(extra.len()).expect("few");
        let config = |argv| self.container_config("write-probe", attempt, Some(argv), extra);
        let mounts = config(Vec::new())["mounts"].as_array().expect("mounts").clone();
        let targets = mounts.iter().map(|mount| mount["container_path"].as_str().expect("path").to_owned());
        let mut argv: Vec<String> = ["/bin/busybox", "sh", "-c", WRITE_PROBE, "probe"].map(str::to_owned).to_vec();
        argv.extend(targets);
        let id = self.run(config(argv));
        let started = Instant::now();
        loop {
            let status = self.stack.cri("runtime.v1.RuntimeService/ContainerStatus", json!({ "container_id": id }));
            if status["status"]["state"] == "CONTAINER_EXITED" {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(60), "the write probe did not end: {status}");
            std::thread::sleep(Duration::from_millis(100));
        }
        let log_dir = PathBuf::from(self.pod.1["log_directory"].as_str().expect("log dir"));
        let output = cri_log(&log_dir.join(format!("write-probe-{attempt}.log")));
        assert!(output.lines().any(|line| line == "DONE"), "the probe did not finish:\n{output}");
        let mut found = Writes::default();
        for line in output.lines() {
            if let Some(path) = line.strip_prefix("WROTE ") {
                found.tried.push(path.to_owned());
                found.written.push(path.to_owned());
            } else if let Some(path) = line.strip_prefix("REFUSED ") {
                found.tried.push(path.to_owned());
            }
        }
        found
    }
}

/// The write probe, in busybox's sh: for each argument, a directory (and every directory below
/// it, into submounts too) gets a file created and removed; a file (a socket) gets its times set.
const WRITE_PROBE: &str = r#"
for top in "$@"; do
    if [ -d "$top" ]; then
        /bin/busybox find "$top" -type d 2>/dev/null | while read -r dir; do
            if ( : > "$dir/.cri-imaged-write-probe" ) 2>/dev/null; then
                echo "WROTE $dir"; /bin/busybox rm -f "$dir/.cri-imaged-write-probe"
            else
                echo "REFUSED $dir"
            fi
        done
    elif /bin/busybox touch -c "$top" 2>/dev/null; then
        echo "WROTE $top"
    else
        echo "REFUSED $top"
    fi
done
echo DONE
"#;

/// The kubelet's namespace options for a pod `spec`: the node's network (with hostNetwork, and
/// here always: there is no CNI), PID (hostPID) and IPC (hostIPC); else a PID namespace per
/// container (one per pod with shareProcessNamespace) and the pod's IPC.
fn namespace_options(spec: &Yaml) -> Value {
    let on = |key: &str| spec[key].as_bool().unwrap_or(false);
    let pid = if on("hostPID") {
        "NODE"
    } else if on("shareProcessNamespace") {
        "POD"
    } else {
        "CONTAINER"
    };
    json!({ "network": "NODE", "pid": pid, "ipc": if on("hostIPC") { "NODE" } else { "POD" } })
}

/// Seconds of a probe's field, with the kubelet's defaults.
fn probe_seconds(probe: &Yaml, field: &str) -> u64 {
    probe[field].as_u64().unwrap_or(match field {
        "periodSeconds" => 10,
        "failureThreshold" => 3,
        _ => panic!("{field}"),
    })
}

/// A memory quantity (`128Mi`, `1Gi`, bytes) in bytes.
fn quantity(text: &str) -> i64 {
    let (digits, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let number: i64 = digits.parse().unwrap_or_else(|_| panic!("quantity {text}"));
    number
        * match unit {
            "" => 1,
            "Ki" => 1 << 10,
            "Mi" => 1 << 20,
            "Gi" => 1 << 30,
            other => panic!("quantity unit {other}"),
        }
}

/// A CRI container log's text: the fourth field of each `TIME STREAM TAG TEXT` line.
fn cri_log(path: &Path) -> String {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    log.lines().filter_map(|line| line.splitn(4, ' ').nth(3)).map(|text| format!("{text}\n")).collect()
}

/// A FROM-scratch image of a static busybox, as `SHELL_IMAGE`, in `images`' store.
fn shell_image(images: &BuiltImage, busybox: &Path) {
    let buildah = |args: &[&str]| {
        let mut command = images.buildah();
        command.args(args);
        let output = run_bounded(command, BUILDAH_LIMIT, "buildah");
        assert!(output.status.success(), "buildah {args:?}: {}", text(&output));
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    };
    let working = buildah(&["from", "scratch"]);
    buildah(&["copy", &working, &busybox.to_string_lossy(), "/bin/busybox"]);
    buildah(&["config", "--entrypoint", r#"["/bin/busybox"]"#, &working]);
    buildah(&["commit", "--quiet", &working, SHELL_IMAGE]);
}

/// Loads `tag` from `images`' store into the stack's containerd (the kubelet's namespace, k8s.io),
/// as a node is given an image with `ctr images import`.
fn load(images: &BuiltImage, tag: &str, stack: &LocalStack) {
    let archive = stack.dir().join("image.tar");
    let mut push = images.buildah();
    push.args(["push", "--quiet", tag]).arg(format!("oci-archive:{}:{tag}", archive.display()));
    let pushed = run_bounded(push, BUILDAH_LIMIT, "buildah push");
    assert!(pushed.status.success(), "{}", text(&pushed));
    let mut import = Command::new("ctr");
    import.arg("--address").arg(&stack.containerd_socket).args(["-n", "k8s.io", "images", "import"]).arg(&archive);
    let imported = run_bounded(import, Duration::from_secs(60), "ctr images import");
    assert!(imported.status.success(), "{}", text(&imported));
    std::fs::remove_file(&archive).expect("remove the archive");
    assert!(stack.present(tag), "containerd's CRI has {tag}:\n{}", text(&imported));
}
