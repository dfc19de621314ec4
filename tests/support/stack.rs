//! A real containerd (CRI, runc) and a loopback registry, started by `scripts/local-stack.sh`.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Command,
};

use super::{
    clients::Client,
    process::{in_ci, require_tool},
};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/local-stack.sh");

/// How to start a [`LocalStack`] (see [`LocalStack::start_with`]).
#[derive(Debug, Clone, Default)]
pub struct StackOptions {
    /// Size in MiB of a tmpfs, mounted by the script at `DIR/image-fs` (and unmounted on stop),
    /// that holds containerd's whole root: content store, snapshots, metadata. CRI ImageFsInfo
    /// then names a directory on it, and statfs of that directory gives this capacity. At least 4.
    /// `None`: containerd's root is an ordinary directory on the disk that holds `/tmp`.
    pub image_fs_mib: Option<u64>,
}

impl StackOptions {
    /// With containerd's root on a tmpfs of `mib` MiB.
    pub fn image_fs_mib(mut self, mib: u64) -> Self {
        self.image_fs_mib = Some(mib);
        self
    }
}

/// A running stack; stopped when dropped: pods and containers removed (none outlives the stack),
/// containerd and the registry stopped, the image filesystem unmounted.
pub struct LocalStack {
    dir: tempfile::TempDir,
    /// `127.0.0.1:PORT` of the registry.
    pub registry: String,
    /// containerd's CRI socket.
    pub containerd_socket: PathBuf,
    /// The registry's access log.
    pub registry_log: PathBuf,
    /// containerd's log, which names every CRI PullImage it serves.
    pub containerd_log: PathBuf,
    /// containerd's `root`: content store, snapshots (on the tmpfs with [`StackOptions::image_fs_mib`]).
    pub containerd_root: PathBuf,
    /// The tmpfs holding [`LocalStack::containerd_root`], if the stack was started with one.
    pub image_fs: Option<PathBuf>,
    /// The cgroup (cgroupfs path) this stack's pods go under; stop kills what is left in it.
    pub cgroup_parent: String,
    /// containerd's sandbox image, pushed by the script as `REGISTRY/pause:3.9` (none on a
    /// registry with auth: such a stack runs no pods).
    sandbox_image: Option<String>,
    /// The ordinal of the next pod, for unique pod names.
    pub(super) next_pod: std::sync::atomic::AtomicU64,
}

impl LocalStack {
    /// Starts the stack. Outside CI, returns `None` (saying why) when the machine cannot run it:
    /// not root, or containerd, runc, gcc, docker-registry, skopeo or grpcurl missing. In CI that
    /// fails.
    pub fn start() -> Option<Self> {
        Some(Self::start_in(stack_dir()?, &[]))
    }

    /// Starts the stack with `options`. Skips and fails as [`LocalStack::start`] does, and also
    /// without Python grpcio, through which the container, image-list and ImageFsInfo helpers
    /// (`support::containers`) talk to containerd.
    pub fn start_with(options: StackOptions) -> Option<Self> {
        let dir = stack_dir()?;
        if !Client::Grpcio.installed() {
            return None;
        }
        let mib = options.image_fs_mib.map(|mib| mib.to_string());
        let mut flags = Vec::new();
        if let Some(mib) = &mib {
            flags.extend(["--image-fs-mib", mib.as_str()]);
        }
        Some(Self::start_in(dir, &flags))
    }

    /// Starts the stack with a registry that demands HTTP Basic auth from `users` (name,
    /// password), written as bcrypt entries by `htpasswd -Bbn`; the registry logs at debug level
    /// so that every login is named in its log (see [`LocalStack::auth_attempts`]). Skips and
    /// fails as [`LocalStack::start`] does, and also without `htpasswd` (Debian's apache2-utils).
    pub fn start_with_htpasswd(users: &[(&str, &str)]) -> Option<Self> {
        let htpasswd = require_tool("htpasswd")?;
        let dir = stack_dir()?;
        let mut entries = String::new();
        for (user, password) in users {
            let output = Command::new(&htpasswd).args(["-Bbn", user, password]).output().expect("htpasswd runs");
            assert!(output.status.success(), "htpasswd -Bbn {user}: {}", String::from_utf8_lossy(&output.stderr));
            entries.push_str(String::from_utf8_lossy(&output.stdout).trim());
            entries.push('\n');
        }
        let file = dir.path().join("users.htpasswd");
        std::fs::write(&file, entries).expect("write the htpasswd file");
        Some(Self::start_in(dir, &["--htpasswd", &path_str(&file)]))
    }

    fn start_in(dir: tempfile::TempDir, start_flags: &[&str]) -> Self {
        let dir_arg = path_str(dir.path());
        run_script(&[&["start"], start_flags, &[dir_arg.as_str()]].concat());
        let env = read_env(&dir.path().join("stack.env"));
        let get = |key: &str| env.get(key).cloned().unwrap_or_else(|| panic!("stack.env lacks {key}"));
        Self {
            registry: get("REGISTRY"),
            containerd_socket: PathBuf::from(get("CONTAINERD_SOCK")),
            registry_log: PathBuf::from(get("REGISTRY_LOG")),
            containerd_log: PathBuf::from(get("CONTAINERD_LOG")),
            containerd_root: PathBuf::from(get("CONTAINERD_ROOT")),
            image_fs: env.get("IMAGE_FS").map(PathBuf::from),
            cgroup_parent: get("CGROUP_PARENT"),
            sandbox_image: env.get("SANDBOX_IMAGE").cloned(),
            next_pod: Default::default(),
            dir,
        }
    }

    /// The stack's directory (`DIR` of `local-stack.sh`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// containerd's sandbox ("pause") image, `REGISTRY/pause:3.9`: a static program that sleeps
    /// until killed (`/sleep-forever`), pushed by the script at start. containerd 1.6 pulls it
    /// on the first RunPodSandbox and does not mark it pinned. Panics on a stack with registry
    /// auth, which has none.
    pub fn sandbox_image(&self) -> String {
        self.sandbox_image.clone().expect("a stack with registry auth has no sandbox image")
    }

    /// Pushes `REGISTRY/name:tag`, a one-layer image of `/data` (`bytes` random, incompressible
    /// bytes; none for 0) and `/sleep-forever` (4 KiB, its entrypoint: a container of it runs
    /// until killed), and returns its manifest digest. Every call pushes a new image, even for
    /// the same size. Its CRI size (ListImages) is `bytes` plus about 2 KiB; a pull takes about
    /// twice `bytes` of the image filesystem (the compressed blob and the unpacked snapshot), and
    /// each container of it `bytes` more (native snapshotter: a container's rootfs is a copy).
    pub fn seed_sized(&self, name_and_tag: &str, bytes: u64) -> String {
        let stdout = run_script(&["seed-sized", &path_str(self.dir.path()), name_and_tag, &bytes.to_string()]);
        let digest = stdout.trim().to_owned();
        assert!(digest.starts_with("sha256:"), "seed-sized printed {stdout:?}");
        digest
    }

    /// (capacity, available) in bytes of the filesystem holding containerd's root, from statfs
    /// (`f_blocks` and `f_bavail` times `f_frsize`), as a garbage collector computes usage.
    pub fn image_fs_usage(&self) -> (u64, u64) {
        statfs(&self.containerd_root)
    }

    /// The live processes of this stack: containerd, the registry, the shims (`containerd-shim…
    /// -address DIR/containerd.sock`), runc (`--root DIR/runc`) and every process in the stack's
    /// cgroup (the containers), as (pid, command name). Zombies are not counted.
    pub fn processes(&self) -> Vec<(u32, String)> {
        let dir = self.dir.path();
        let own_args = [
            path_str(&self.containerd_socket),
            path_str(&dir.join("runc")),
            path_str(&dir.join("containerd.toml")),
            path_str(&dir.join("registry.yml")),
        ];
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
            let by_args = cmdline.split(|byte| *byte == 0).any(|arg| own_args.iter().any(|own| own.as_bytes() == arg));
            let cgroups = std::fs::read_to_string(entry.path().join("cgroup")).unwrap_or_default();
            if (by_args || in_cgroup(&cgroups, &self.cgroup_parent)) && alive(pid) {
                let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
                found.push((pid, comm.trim().to_owned()));
            }
        }
        found
    }

    /// containerd's pid now.
    pub fn containerd_pid(&self) -> u32 {
        let found = self.processes().into_iter().find(|(_, name)| name == "containerd");
        found.map(|(pid, _)| pid).expect("containerd runs")
    }

    /// Starts containerd again after it died, as it was; returns once its CRI answers.
    pub fn restart_containerd(&self) {
        run_script(&["restart-containerd", &path_str(self.dir.path())]);
    }

    /// The mount points at or below this stack's directory (the image filesystem, a running
    /// container's rootfs bind mount, a pod's /dev/shm).
    pub fn mounts(&self) -> Vec<PathBuf> {
        mounts_below(self.dir.path())
    }

    /// Builds a one-layer image whose file holds `content`, pushes it as `REGISTRY/name:tag`, and
    /// returns its manifest digest.
    pub fn seed(&self, name_and_tag: &str, content: &str) -> String {
        let stdout = run_script(&["seed", &path_str(self.dir.path()), name_and_tag, content]);
        let digest = stdout.trim().to_owned();
        assert!(digest.starts_with("sha256:"), "seed printed {stdout:?}");
        digest
    }

    /// As [`LocalStack::seed`], with `user` as the image config's `User` (`1002`, `www-data`).
    pub fn seed_with_user(&self, name_and_tag: &str, content: &str, user: &str) -> String {
        let stdout = run_script(&["seed", "--user", user, &path_str(self.dir.path()), name_and_tag, content]);
        let digest = stdout.trim().to_owned();
        assert!(digest.starts_with("sha256:"), "seed printed {stdout:?}");
        digest
    }

    /// As [`LocalStack::seed`], pushing as `user` with `password` (a registry started by
    /// [`LocalStack::start_with_htpasswd`] takes no anonymous push).
    pub fn seed_as(&self, user: &str, password: &str, name_and_tag: &str, content: &str) -> String {
        let credentials = format!("{user}:{password}");
        let args = ["seed", &path_str(self.dir.path()), name_and_tag, content];
        let stdout = run_script_with_env(&args, &[("REGISTRY_CREDS", &credentials)]);
        let digest = stdout.trim().to_owned();
        assert!(digest.starts_with("sha256:"), "seed printed {stdout:?}");
        digest
    }

    /// Makes containerd reach `127.0.0.1:PROXY_PORT` over plain HTTP by writing
    /// `DIR/certs.d/127.0.0.1:PROXY_PORT/hosts.toml`. With a proxy in front of
    /// [`LocalStack::registry`] there (`support::throttle::ThrottleProxy`), images named
    /// `127.0.0.1:PROXY_PORT/repository:tag` are pulled through it from the same registry.
    /// containerd reads certs.d on every pull: no restart is needed. The empty `[host]` table is
    /// what containerd 1.6 needs to parse a file of `server` alone (without it: "failed to decode
    /// hosts.toml" and its defaults, which for a loopback port also mean plain HTTP).
    pub fn route_through(&self, proxy_port: u16) {
        self.route_host(&format!("127.0.0.1:{proxy_port}"));
    }

    /// containerd's `config_path` (its registry host settings, `DIR/certs.d`): what a daemon that
    /// reads signatures is given as `--registry-config-path`, to reach registries as containerd does.
    pub fn registry_config_path(&self) -> PathBuf {
        self.dir.path().join("certs.d")
    }

    /// As [`LocalStack::route_through`], for any `host:port` (a registry on another address, such
    /// as a `support::netrig::NetRig`'s).
    pub fn route_host(&self, host: &str) {
        let dir = self.registry_config_path().join(host);
        std::fs::create_dir_all(&dir).expect("create the host's certs.d directory");
        let hosts = format!("server = \"http://{host}\"\n\n[host]\n");
        std::fs::write(dir.join("hosts.toml"), hosts).expect("write the host's hosts.toml");
    }

    /// `REGISTRY/name`.
    pub fn image(&self, name: &str) -> String {
        format!("{}/{name}", self.registry)
    }

    /// How many times containerd resolved `repository:tag` (a manifest request by tag).
    pub fn manifest_resolutions(&self, repository: &str, tag: &str) -> usize {
        let log = std::fs::read_to_string(&self.registry_log).expect("registry log");
        let needle = format!("/v2/{repository}/manifests/{tag} HTTP/");
        log.lines().filter(|line| line.contains(&needle) && line.contains("containerd/")).count()
    }

    /// How many CRI PullImage calls for `image` containerd has received (it logs each on arrival).
    pub fn runtime_pulls(&self, image: &str) -> usize {
        let log = std::fs::read_to_string(&self.containerd_log).expect("containerd log");
        let needle = format!(r#"msg="PullImage \"{image}\"""#);
        log.lines().filter(|line| line.contains(&needle)).count()
    }

    /// How many manifest requests (GET or HEAD) the registry has served for `repository`.
    pub fn manifest_requests(&self, repository: &str) -> usize {
        let log = std::fs::read_to_string(&self.registry_log).expect("registry log");
        let needle = format!("/v2/{repository}/manifests/");
        log.lines()
            .filter(|line| line.contains(&needle) && (line.contains("\"GET ") || line.contains("\"HEAD ")))
            .filter(|line| line.contains("containerd/"))
            .count()
    }

    /// How many of containerd's resolutions of `repository:tag` the registry answered with 200:
    /// on a registry with auth, each authenticated request comes after an anonymous one that gets
    /// 401, which [`LocalStack::manifest_resolutions`] counts too.
    pub fn successful_resolutions(&self, repository: &str, tag: &str) -> usize {
        let log = std::fs::read_to_string(&self.registry_log).expect("registry log");
        let request = format!("/v2/{repository}/manifests/{tag} HTTP/");
        log.lines()
            .filter(|line| line.contains(&request) && line.contains("containerd/"))
            .filter(|line| line.split_once("\" ").is_some_and(|(_, status)| status.starts_with("200 ")))
            .count()
    }

    /// How many of containerd's resolutions of `repository:tag` the registry refused with 401.
    /// On a registry with auth, an anonymous pull is one such request; a credentialed one makes
    /// one too (its first, anonymous request) before its authenticated one.
    pub fn refused_resolutions(&self, repository: &str, tag: &str) -> usize {
        let log = std::fs::read_to_string(&self.registry_log).expect("registry log");
        let request = format!("/v2/{repository}/manifests/{tag} HTTP/");
        log.lines()
            .filter(|line| line.contains(&request) && line.contains("containerd/"))
            .filter(|line| line.split_once("\" ").is_some_and(|(_, status)| status.starts_with("401 ")))
            .count()
    }

    /// The logins containerd's requests for `repository` made, in order, from the registry's log
    /// of a stack started by [`LocalStack::start_with_htpasswd`]: `fail USER` for credentials the
    /// registry refused (a wrong password or an unknown user), `ok USER` for accepted ones, repeats
    /// in a row shown once (containerd retries refused credentials 5 times, and an accepted pull
    /// asks for a manifest twice). An anonymous request leaves no line.
    pub fn auth_attempts(&self, repository: &str) -> Vec<String> {
        let log = std::fs::read_to_string(&self.registry_log).expect("registry log");
        let of_repository = [format!("vars.name={repository} "), format!("vars.name=\"{repository}\" ")];
        let mut attempts: Vec<String> = Vec::new();
        for line in log.lines() {
            let from_containerd = line.contains("useragent=containerd/") || line.contains("useragent=\"containerd/");
            if !from_containerd || !of_repository.iter().any(|field| line.contains(field.as_str())) {
                continue;
            }
            let attempt = if let Some(rest) = line.split_once(r#"msg="error authenticating user \""#) {
                rest.1.split_once(r#"\""#).map(|(user, _)| format!("fail {user}"))
            } else if line.contains(" msg=GetImageManifest ") {
                logrus_field(line, "auth.user.name").map(|user| format!("ok {user}"))
            } else {
                None
            };
            if let Some(attempt) = attempt
                && attempts.last() != Some(&attempt)
            {
                attempts.push(attempt);
            }
        }
        attempts
    }
}

/// The value of `key=value` (or `key="value"`) in a logrus text line.
fn logrus_field(line: &str, key: &str) -> Option<String> {
    let (_, rest) = line.split_once(&format!(" {key}="))?;
    match rest.strip_prefix('"') {
        Some(quoted) => quoted.split_once('"').map(|(value, _)| value.to_owned()),
        None => rest.split(' ').next().map(str::to_owned),
    }
}

impl Drop for LocalStack {
    fn drop(&mut self) {
        let _ = Command::new(SCRIPT).args(["stop", &path_str(self.dir.path())]).status();
    }
}

fn run_script(args: &[&str]) -> String {
    run_script_with_env(args, &[])
}

fn run_script_with_env(args: &[&str], env: &[(&str, &str)]) -> String {
    let output = Command::new(SCRIPT).args(args).envs(env.iter().copied()).output().expect("local-stack.sh runs");
    assert!(
        output.status.success(),
        "local-stack.sh {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A fresh directory for a stack, when this machine can run one (see [`LocalStack::start`]).
fn stack_dir() -> Option<tempfile::TempDir> {
    for tool in ["containerd", "runc", "gcc", "docker-registry", "skopeo", "grpcurl"] {
        require_tool(tool)?;
    }
    if !is_root() {
        assert!(!in_ci(), "the containerd tests need root in CI");
        eprintln!("SKIPPED: containerd needs root (outside CI)");
        return None;
    }
    // Short path: containerd's sockets must fit in a unix socket address.
    Some(tempfile::Builder::new().prefix("cri-e2e").tempdir_in("/tmp").expect("stack dir"))
}

fn read_env(path: &Path) -> HashMap<String, String> {
    let text = std::fs::read_to_string(path).expect("stack.env");
    text.lines()
        .filter_map(|line| line.split_once('='))
        .map(|(key, value)| (key.to_owned(), value.trim_matches('"').to_owned()))
        .collect()
}

fn path_str(path: &Path) -> String {
    path.to_str().expect("utf-8 temp path").to_owned()
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// (capacity, available) in bytes of the filesystem holding `path`: statfs through `stat -f`
/// (`%S` is `f_frsize`, `%b` `f_blocks`, `%a` `f_bavail`).
pub fn statfs(path: &Path) -> (u64, u64) {
    let output = Command::new("stat").args(["-f", "-c", "%S %b %a"]).arg(path).output().expect("stat runs");
    assert!(output.status.success(), "stat -f {}: {}", path.display(), String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8_lossy(&output.stdout);
    let numbers: Vec<u64> = text.split_whitespace().map(|n| n.parse().expect("stat -f prints numbers")).collect();
    let [block, blocks, available] = numbers[..] else { panic!("stat -f printed {text:?}") };
    (block * blocks, block * available)
}

/// Whether a process whose /proc/PID/cgroup reads `cgroups` is in `parent` or below it, in any
/// hierarchy (lines `ID:CONTROLLERS:PATH`).
fn in_cgroup(cgroups: &str, parent: &str) -> bool {
    cgroups
        .lines()
        .filter_map(|line| line.splitn(3, ':').nth(2))
        .any(|path| path.strip_prefix(parent).is_some_and(|rest| rest.is_empty() || rest.starts_with('/')))
}

/// Whether `pid` is a live process (not a zombie; the stack's shims are reparented to PID 1,
/// which may reap them a moment later).
pub fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
}

/// The mount points at or below `dir`, from this process's mountinfo.
pub fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(unescape_mountinfo(field)))
        .filter(|mount_point| mount_point.starts_with(dir))
        .collect()
}

/// A mountinfo field with its octal escapes (`\040` for a space) decoded.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(code) = field.get(i + 1..i + 4).and_then(|digits| u8::from_str_radix(digits, 8).ok())
        {
            out.push(code);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
