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
        Some(Self::start_in(stack_dir()?, &[]))
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
            dir,
        }
    }

    /// Builds a one-layer image whose file holds `content`, pushes it as `REGISTRY/name:tag`, and
    /// returns its manifest digest.
    pub fn seed(&self, name_and_tag: &str, content: &str) -> String {
        let stdout = run_script(&["seed", &path_str(self.dir.path()), name_and_tag, content]);
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
    for tool in ["containerd", "docker-registry", "skopeo", "grpcurl"] {
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
