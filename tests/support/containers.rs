//! Pods, containers and images of a [`LocalStack`] through CRI, straight on its containerd, with
//! Python grpcio as the client (`support::clients`).
//!
//! Every container runs in a pod of its own: host network (there is no CNI), the stack's cgroup,
//! the sandbox image as its pause container. Nothing here pulls an image implicitly: pull first
//! (through cri-imaged or [`LocalStack::pull`]); only RunPodSandbox pulls the sandbox image, as
//! containerd does for the kubelet.

use std::{path::PathBuf, sync::atomic::Ordering};

use serde_json::{Value, json};

use super::{clients::Client, stack::LocalStack};

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
    /// A CRI call on containerd's socket, with grpcio; panics, with the status, unless it succeeds.
    pub fn cri(&self, method: &str, request: Value) -> Value {
        Client::Grpcio.ok(&self.containerd_socket, method, request)
    }

    /// containerd's version as its CRI `Version` says it: (major, minor).
    pub fn runtime_version(&self) -> (u32, u32) {
        let answer = self.cri("runtime.v1.RuntimeService/Version", json!({}));
        let version = text(&answer, "runtime_version");
        let mut numbers = version.trim_start_matches('v').split(['.', '~', '-', '+']).map(|part| part.parse().ok());
        match (numbers.next().flatten(), numbers.next().flatten()) {
            (Some(major), Some(minor)) => (major, minor),
            _ => panic!("containerd's version {version:?} does not read"),
        }
    }

    /// CRI PullImage straight on containerd (not through cri-imaged); returns the image id.
    pub fn pull(&self, image: &str) -> String {
        let pulled = self.cri("runtime.v1.ImageService/PullImage", json!({ "image": { "image": image } }));
        let id = text(&pulled, "image_ref");
        assert!(id.starts_with("sha256:"), "PullImage answered {pulled}");
        id
    }

    /// Whether containerd has `image` (CRI ImageStatus, straight on containerd).
    pub fn present(&self, image: &str) -> bool {
        let status = self.cri("runtime.v1.ImageService/ImageStatus", json!({ "image": { "image": image } }));
        status.get("image").is_some()
    }

    /// CRI RemoveImage of `image` (a name or an id) straight on containerd.
    pub fn remove_image(&self, image: &str) {
        self.cri("runtime.v1.ImageService/RemoveImage", json!({ "image": { "image": image } }));
    }

    /// CRI ListImages.
    pub fn list_images(&self) -> Vec<ListedImage> {
        let listed = self.cri("runtime.v1.ImageService/ListImages", json!({}));
        array(&listed, "images")
            .iter()
            .map(|image| ListedImage {
                id: text(image, "id"),
                repo_tags: strings(image, "repo_tags"),
                repo_digests: strings(image, "repo_digests"),
                size: number(&image["size"]),
                pinned: image["pinned"].as_bool().unwrap_or(false),
            })
            .collect()
    }

    /// CRI ImageFsInfo.
    pub fn image_fs_info(&self) -> ImageFsInfo {
        let info = self.cri("runtime.v1.ImageService/ImageFsInfo", json!({}));
        let filesystem = array(&info, "image_filesystems").first().unwrap_or_else(|| panic!("no filesystem: {info}"));
        ImageFsInfo {
            mountpoint: PathBuf::from(text(&filesystem["fs_id"], "mountpoint")),
            used_bytes: number(&filesystem["used_bytes"]["value"]),
            inodes_used: number(&filesystem["inodes_used"]["value"]),
        }
    }

    /// The sandbox image as the runtime's verbose CRI Status names it (`config.sandboxImage`).
    pub fn runtime_sandbox_image(&self) -> String {
        let status = self.cri("runtime.v1.RuntimeService/Status", json!({ "verbose": true }));
        let config: Value = serde_json::from_str(&text(&status["info"], "config"))
            .unwrap_or_else(|error| panic!("the verbose status's config is not JSON ({error}): {status}"));
        text(&config, "sandboxImage")
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
        self.create_container_mounting(image, &[])
    }

    /// As [`Self::create_container`], the container mounting each of `volumes` (images present
    /// already, by id as the kubelet gives them) read-only as an image volume (KEP-4639).
    pub fn create_container_mounting(&self, image: &str, volumes: &[&str]) -> Container {
        let ordinal = self.next_pod.fetch_add(1, Ordering::Relaxed);
        let name = format!("pod-{ordinal}");
        let pod_dir = self.dir().join("pods").join(&name);
        std::fs::create_dir_all(&pod_dir).expect("pod dir");
        let pod = json!({
            "metadata": { "name": name, "namespace": "cri-imaged-test", "uid": format!("{name}-uid"), "attempt": 0 },
            "log_directory": pod_dir,
            "linux": {
                "cgroup_parent": self.cgroup_parent,
                // No CNI here, so the host's network namespace.
                "security_context": { "namespace_options": { "network": "NODE" } },
            },
        });
        let mounts: Vec<Value> = volumes
            .iter()
            .enumerate()
            .map(|(n, volume)| json!({ "container_path": format!("/volume-{n}"), "readonly": true, "image": { "image": volume } }))
            .collect();
        let container = json!({
            "metadata": { "name": "main", "attempt": 0 },
            "image": { "image": image },
            "log_path": "main.log",
            "linux": {},
            "mounts": mounts,
        });
        let ran = self.cri("runtime.v1.RuntimeService/RunPodSandbox", json!({ "config": pod }));
        let pod_id = text(&ran, "pod_sandbox_id");
        let request = json!({ "pod_sandbox_id": pod_id, "config": container, "sandbox_config": pod });
        let id = text(&self.cri("runtime.v1.RuntimeService/CreateContainer", request), "container_id");
        Container { id, pod_id, image: image.to_owned() }
    }

    /// CRI StartContainer.
    pub fn start_container(&self, container: &Container) {
        self.cri("runtime.v1.RuntimeService/StartContainer", json!({ "container_id": container.id }));
    }

    /// CRI StopContainer with timeout 0: SIGKILL at once (the sleeping entrypoint ignores
    /// SIGTERM, as any PID 1 without a handler). The container stays, EXITED, until removed.
    pub fn stop_container(&self, container: &Container) {
        self.cri("runtime.v1.RuntimeService/StopContainer", json!({ "container_id": container.id, "timeout": 0 }));
    }

    /// Removes the container and its pod (StopPodSandbox kills what runs; RemovePodSandbox).
    pub fn remove_container(&self, container: Container) {
        let pod = json!({ "pod_sandbox_id": container.pod_id });
        self.cri("runtime.v1.RuntimeService/StopPodSandbox", pod.clone());
        self.cri("runtime.v1.RuntimeService/RemovePodSandbox", pod);
    }

    /// The container's CRI state (ContainerStatus), e.g. `CONTAINER_RUNNING`.
    pub fn container_state(&self, container: &Container) -> String {
        let status = self.cri("runtime.v1.RuntimeService/ContainerStatus", json!({ "container_id": container.id }));
        // The first enum value is left out of protobuf JSON, as every default is.
        status["status"]["state"].as_str().unwrap_or("CONTAINER_CREATED").to_owned()
    }

    /// CRI ListContainers, every state.
    pub fn list_containers(&self) -> Vec<ListedContainer> {
        let listed = self.cri("runtime.v1.RuntimeService/ListContainers", json!({}));
        array(&listed, "containers")
            .iter()
            .map(|container| ListedContainer {
                id: text(container, "id"),
                pod_id: text(container, "pod_sandbox_id"),
                image: text(&container["image"], "image"),
                image_ref: text(container, "image_ref"),
                state: container["state"].as_str().unwrap_or("CONTAINER_CREATED").to_owned(),
            })
            .collect()
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
