//! A registry that demands authentication (users alice and bob, htpasswd), containerd in front
//! of it, and daemons started so that they see only what a test gives them.

use std::path::{Path, PathBuf};

use cri_imaged::api::{EnsureImageExistsRequest, PullSecret, image_manager_client::ImageManagerClient};
use tonic::transport::Channel;

use super::{process::DaemonProcess, stack::LocalStack, unix_channel};

/// The registry's users and their passwords.
pub const ALICE: (&str, &str) = ("alice", "s3cret-Alice-A1");
pub const BOB: (&str, &str) = ("bob", "hunter2-Bob-B2");

/// A registry only alice and bob may use, containerd in front of it, and a directory for daemons.
pub struct Private {
    pub stack: LocalStack,
    pub dir: tempfile::TempDir,
}

/// Starts the stack; `None` (outside CI) when this machine cannot run it.
pub fn private_registry() -> Option<Private> {
    let stack = LocalStack::start_with_htpasswd(&[ALICE, BOB])?;
    Some(Private { stack, dir: tempfile::tempdir().expect("tempdir") })
}

impl Private {
    /// Pushes `REGISTRY/name:tag` as alice (its one file holds the name, so that every image has
    /// its own id) and returns the image's full name.
    pub fn seed(&self, name_and_tag: &str) -> String {
        self.stack.seed_as(ALICE.0, ALICE.1, name_and_tag, name_and_tag);
        self.stack.image(name_and_tag)
    }

    /// A fresh directory for a daemon: its socket and log, `root/` (its `--root-dir`) and
    /// `home/` (its `$HOME` and working directory).
    pub fn daemon_dir(&self, name: &str) -> PathBuf {
        let dir = self.dir.path().join(name);
        for sub in ["root", "home"] {
            std::fs::create_dir_all(dir.join(sub)).expect("daemon dirs");
        }
        dir
    }

    /// The daemon in `dir` (see [`Private::daemon_dir`]) with `extra` flags, serving.
    pub async fn daemon(&self, dir: &Path, extra: &[&str]) -> (DaemonProcess, ImageManagerClient<Channel>) {
        self.daemon_logging(dir, extra, "info,cri_imaged=trace").await
    }

    pub async fn daemon_logging(
        &self,
        dir: &Path,
        extra: &[&str],
        rust_log: &str,
    ) -> (DaemonProcess, ImageManagerClient<Channel>) {
        let root_dir = dir.join("root");
        let flags = [&["--root-dir", root_dir.to_str().expect("utf-8 path")], extra].concat();
        let socket = dir.join("cri-imaged.sock");
        let runtime = &self.stack.containerd_socket;
        let daemon = DaemonProcess::spawn_at_home(&socket, runtime, &flags, rust_log, &dir.join("home"));
        daemon.wait_until_serving().await;
        let client = ImageManagerClient::new(unix_channel(&daemon.socket));
        (daemon, client)
    }

    /// A kubernetes.io/dockerconfigjson secret `default/name` (uid `uid-name`) for this registry.
    pub fn secret(&self, name: &str, (user, password): (&str, &str)) -> PullSecret {
        let auths =
            serde_json::json!({ "auths": { &self.stack.registry: { "username": user, "password": password } } });
        PullSecret {
            name: name.into(),
            namespace: "default".into(),
            docker_config_json: auths.to_string(),
            uid: format!("uid-{name}"),
            r#type: "kubernetes.io/dockerconfigjson".into(),
        }
    }
}

/// EnsureImageExists for `image` with `policy` from the pod `default/pod` (uid `uid-pod`) with
/// `secrets`.
pub fn for_pod(pod: &str, image: &str, secrets: Vec<PullSecret>, policy: i32) -> EnsureImageExistsRequest {
    let mut request = super::ensure(image, policy);
    let pod_ref = request.pod.as_mut().expect("pod");
    pod_ref.name = pod.into();
    pod_ref.uid = format!("uid-{pod}");
    request.pull_secrets = secrets;
    request
}
