//! Pods, containers and images of a [`LocalStack`] through CRI, with the real crictl (cri-tools
//! v1.26.1, `../shared/tools/crictl`) and the stack's `crictl.yaml`.
//!
//! Every container runs in a pod of its own: host network (there is no CNI), the stack's cgroup,
//! the sandbox image as its pause container. Nothing here pulls an image implicitly: pull first
//! (through cri-imaged or [`LocalStack::pull`]); only RunPodSandbox pulls the sandbox image, as
//! containerd does for the kubelet.

use std::{path::PathBuf, process::Command, sync::atomic::Ordering};

use serde_json::{Value, json};

use super::{process::require_shared_tool, stack::LocalStack};

/// The longest any one crictl call may take before it is killed and the test fails.
const CRICTL_LIMIT_SECONDS: &str = "60";

/// A container made by [`LocalStack::run_container`] or [`LocalStack::create_container`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    /// The CRI container id.
    pub id: String,
    /// The id of its pod sandbox (a pod of its own).
    pub pod_id: String,
    /// The image it was created from, as given.
    pub image: String,
}

/// One image of CRI ListImages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedImage {
    /// The image id (`sha256:` of its config).
    pub id: String,
    pub repo_tags: Vec<String>,
    pub repo_digests: Vec<String>,
    /// containerd's size: manifest, config and the compressed layers, in bytes.
    pub size: u64,
    pub pinned: bool,
}

/// One container of CRI ListContainers (all states).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedContainer {
    pub id: String,
    pub pod_id: String,
    /// The image as the container's spec names it.
    pub image: String,
    /// The image id the runtime resolved it to.
    pub image_ref: String,
    /// `CONTAINER_CREATED`, `CONTAINER_RUNNING`, `CONTAINER_EXITED` or `CONTAINER_UNKNOWN`.
    pub state: String,
}

/// CRI ImageFsInfo's first filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageFsInfo {
    /// containerd 1.6: its snapshotter's directory, `ROOT/io.containerd.snapshotter.v1.native`.
    pub mountpoint: PathBuf,
    /// The snapshots' bytes, as containerd last measured them: it does so every 10 s
    /// (`stats_collect_period`), so this lags behind pulls, and it leaves out the content store.
    pub used_bytes: u64,
    pub inodes_used: u64,
}

impl LocalStack {
    /// `crictl --config DIR/crictl.yaml`, killed if it runs for more than a minute.
    pub fn crictl(&self) -> Command {
        let crictl = require_shared_tool("crictl").expect("crictl is needed for containers (../shared/tools)");
        let mut command = Command::new("timeout");
        command.args(["--kill-after=5", CRICTL_LIMIT_SECONDS]).arg(crictl).arg("--config").arg(&self.crictl_config);
        command
    }

    /// Runs crictl with `args`; panics, with its output, unless it succeeds. Returns its stdout.
    pub fn crictl_run(&self, args: &[&str]) -> String {
        let output = self.crictl().args(args).output().expect("crictl runs");
        assert!(
            output.status.success(),
            "crictl {args:?} failed ({}):\n{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// CRI PullImage straight on containerd (not through cri-imaged); returns the image id.
    pub fn pull(&self, image: &str) -> String {
        let stdout = self.crictl_run(&["pull", image]);
        let id = stdout.split_whitespace().last().unwrap_or_default().to_owned();
        assert!(id.starts_with("sha256:"), "crictl pull printed {stdout:?}");
        id
    }

    /// CRI RemoveImage of `image` (a name or an id) straight on containerd.
    pub fn remove_image(&self, image: &str) {
        self.crictl_run(&["rmi", image]);
    }

    /// CRI ListImages.
    pub fn list_images(&self) -> Vec<ListedImage> {
        let listed = self.crictl_json(&["images", "-o", "json"]);
        array(&listed, "images")
            .iter()
            .map(|image| ListedImage {
                id: text(image, "id"),
                repo_tags: strings(image, "repoTags"),
                repo_digests: strings(image, "repoDigests"),
                size: number(&image["size"]),
                pinned: image["pinned"].as_bool().unwrap_or(false),
            })
            .collect()
    }

    /// CRI ImageFsInfo.
    pub fn image_fs_info(&self) -> ImageFsInfo {
        let info = self.crictl_json(&["imagefsinfo", "-o", "json"]);
        let status = &info["status"];
        ImageFsInfo {
            mountpoint: PathBuf::from(text(&status["fsId"], "mountpoint")),
            used_bytes: number(&status["usedBytes"]["value"]),
            inodes_used: number(&status["inodesUsed"]["value"]),
        }
    }

    /// The sandbox image as the runtime's verbose CRI Status names it (`config.sandboxImage`).
    pub fn runtime_sandbox_image(&self) -> String {
        let info = self.crictl_json(&["info", "-o", "json"]);
        text(&info["config"], "sandboxImage")
    }

    /// A running container of `image` (present already: nothing is pulled), in a pod of its own:
    /// RunPodSandbox, CreateContainer, StartContainer. Its entrypoint must keep running (the
    /// images of [`LocalStack::seed_sized`] sleep until killed).
    pub fn run_container(&self, image: &str) -> Container {
        let container = self.create_container(image);
        self.start_container(&container);
        container
    }

    /// A container of `image` (present already) created but not started, in a running pod of
    /// its own: RunPodSandbox, CreateContainer.
    pub fn create_container(&self, image: &str) -> Container {
        let ordinal = self.next_pod.fetch_add(1, Ordering::Relaxed);
        let name = format!("pod-{ordinal}");
        let pod_dir = self.dir().join("pods").join(&name);
        std::fs::create_dir_all(&pod_dir).expect("pod dir");
        let pod = json!({
            "metadata": { "name": name, "namespace": "cri-imaged-test", "uid": format!("{name}-uid"), "attempt": 0 },
            "log_directory": pod_dir,
            "linux": {
                "cgroup_parent": self.cgroup_parent,
                // NODE: no CNI here, so the host's network namespace
                "security_context": { "namespace_options": { "network": 2 } },
            },
        });
        let container = json!({
            "metadata": { "name": "main", "attempt": 0 },
            "image": { "image": image },
            "log_path": "main.log",
            "linux": {},
        });
        let pod_config = pod_dir.join("pod.json");
        let container_config = pod_dir.join("container.json");
        std::fs::write(&pod_config, pod.to_string()).expect("write the pod config");
        std::fs::write(&container_config, container.to_string()).expect("write the container config");
        let (pod_config, container_config) = (path_str(&pod_config), path_str(&container_config));

        let pod_id = self.crictl_run(&["runp", &pod_config]).trim().to_owned();
        let id = self.crictl_run(&["create", "--no-pull", &pod_id, &container_config, &pod_config]).trim().to_owned();
        assert!(!pod_id.is_empty() && !id.is_empty(), "crictl printed no ids: pod {pod_id:?}, container {id:?}");
        Container { id, pod_id, image: image.to_owned() }
    }

    /// CRI StartContainer.
    pub fn start_container(&self, container: &Container) {
        self.crictl_run(&["start", &container.id]);
    }

    /// CRI StopContainer with timeout 0: SIGKILL at once (the sleeping entrypoint ignores
    /// SIGTERM, as any PID 1 without a handler). The container stays, EXITED, until removed.
    pub fn stop_container(&self, container: &Container) {
        self.crictl_run(&["stop", "--timeout", "0", &container.id]);
    }

    /// Removes the container and its pod (StopPodSandbox kills what runs; RemovePodSandbox).
    pub fn remove_container(&self, container: Container) {
        self.crictl_run(&["rmp", "--force", &container.pod_id]);
    }

    /// The container's CRI state (ContainerStatus), e.g. `CONTAINER_RUNNING`.
    pub fn container_state(&self, container: &Container) -> String {
        let status = self.crictl_json(&["inspect", "-o", "json", &container.id]);
        text(&status["status"], "state")
    }

    /// CRI ListContainers, every state.
    pub fn list_containers(&self) -> Vec<ListedContainer> {
        let listed = self.crictl_json(&["ps", "--all", "-o", "json"]);
        array(&listed, "containers")
            .iter()
            .map(|container| ListedContainer {
                id: text(container, "id"),
                pod_id: text(container, "podSandboxId"),
                image: text(&container["image"], "image"),
                image_ref: text(container, "imageRef"),
                state: text(container, "state"),
            })
            .collect()
    }

    fn crictl_json(&self, args: &[&str]) -> Value {
        let stdout = self.crictl_run(args);
        serde_json::from_str(&stdout)
            .unwrap_or_else(|error| panic!("crictl {args:?} printed no JSON ({error}): {stdout}"))
    }
}

fn array<'a>(value: &'a Value, key: &str) -> &'a [Value] {
    value[key].as_array().map(Vec::as_slice).unwrap_or_default()
}

fn text(value: &Value, key: &str) -> String {
    value[key].as_str().unwrap_or_else(|| panic!("no string {key:?} in {value}")).to_owned()
}

fn strings(value: &Value, key: &str) -> Vec<String> {
    array(value, key).iter().filter_map(Value::as_str).map(str::to_owned).collect()
}

/// A uint64 of protobuf JSON: a string, or (from some printers) a number; absent is 0.
fn number(value: &Value) -> u64 {
    match value {
        Value::String(digits) => digits.parse().unwrap_or_else(|_| panic!("not a number: {digits:?}")),
        Value::Number(number) => number.as_u64().unwrap_or_else(|| panic!("not a u64: {number}")),
        Value::Null => 0,
        other => panic!("not a number: {other}"),
    }
}

fn path_str(path: &std::path::Path) -> String {
    path.to_str().expect("utf-8 stack path").to_owned()
}
