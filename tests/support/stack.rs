//! A real containerd (CRI) and a loopback registry, started by `scripts/local-stack.sh`.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Command,
};

use super::process::{in_ci, require_tool};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/local-stack.sh");

/// A running stack; stopped when dropped.
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
}

impl LocalStack {
    /// Starts the stack. Outside CI, returns `None` (saying why) when the machine cannot run it:
    /// not root, or containerd, docker-registry, skopeo or grpcurl missing. In CI that fails.
    pub fn start() -> Option<Self> {
        for tool in ["containerd", "docker-registry", "skopeo", "grpcurl"] {
            require_tool(tool)?;
        }
        if !is_root() {
            assert!(!in_ci(), "the containerd tests need root in CI");
            eprintln!("SKIPPED: containerd needs root (outside CI)");
            return None;
        }
        // Short path: containerd's sockets must fit in a unix socket address.
        let dir = tempfile::Builder::new().prefix("cri-e2e").tempdir_in("/tmp").expect("stack dir");
        run_script(&["start", &path_str(dir.path())]);
        let env = read_env(&dir.path().join("stack.env"));
        let get = |key: &str| env.get(key).cloned().unwrap_or_else(|| panic!("stack.env lacks {key}"));
        Some(Self {
            registry: get("REGISTRY"),
            containerd_socket: PathBuf::from(get("CONTAINERD_SOCK")),
            registry_log: PathBuf::from(get("REGISTRY_LOG")),
            containerd_log: PathBuf::from(get("CONTAINERD_LOG")),
            dir,
        })
    }

    /// Builds a one-layer image whose file holds `content`, pushes it as `REGISTRY/name:tag`, and
    /// returns its manifest digest.
    pub fn seed(&self, name_and_tag: &str, content: &str) -> String {
        let stdout = run_script(&["seed", &path_str(self.dir.path()), name_and_tag, content]);
        let digest = stdout.trim().to_owned();
        assert!(digest.starts_with("sha256:"), "seed printed {stdout:?}");
        digest
    }

    /// Pushes the images critest's "Image Manager" specs pull, which containerd then resolves
    /// from the loopback registry as `gcr.io/k8s-staging-cri-tools/…`.
    pub fn seed_critest(&self) {
        run_script(&["seed-critest", &path_str(self.dir.path())]);
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
}

impl Drop for LocalStack {
    fn drop(&mut self) {
        let _ = Command::new(SCRIPT).args(["stop", &path_str(self.dir.path())]).status();
    }
}

fn run_script(args: &[&str]) -> String {
    let output = Command::new(SCRIPT).args(args).output().expect("local-stack.sh runs");
    assert!(
        output.status.success(),
        "local-stack.sh {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
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
