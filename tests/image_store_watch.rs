//! CRI-O's image store as the presence cache's change signal: a real containers/storage store
//! (vfs, private to the test) changed behind cri-imaged's back by skopeo and buildah. No CRI
//! runtime here serves such a store, so the watcher is shown against the real store, and the
//! daemon against a scripted runtime without containerd's events (as CRI-O) whose ImageFsInfo
//! names the store and whose images change together with it.

mod support;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use cri_imaged::api::{GetStatusRequest, PullPolicy, image_manager_client::ImageManagerClient};
use cri_imaged::presence::image_store::StoreWatch;
use support::{
    call, ensure,
    fake_runtime::{FakeImageService, FakeRuntime},
    process::{DaemonProcess, metric, metrics_listen},
    reason, unix_channel,
};
use tonic::Code;

const IF_NOT_PRESENT: i32 = PullPolicy::IfNotPresent as i32;
const NEVER: i32 = PullPolicy::Never as i32;
const IMAGE: &str = "localhost/store-watch:1";

/// A containers/storage store of its own (vfs driver, roots under a temporary directory), with an
/// OCI layout of a small image to copy into it.
struct Store {
    dir: tempfile::TempDir,
}

impl Store {
    /// The store, created by copying `IMAGE` into it.
    fn new() -> Self {
        let store = Self { dir: tempfile::tempdir().expect("tempdir") };
        let root = store.dir.path();
        std::fs::write(root.join("policy.json"), r#"{"default":[{"type":"insecureAcceptAnything"}]}"#).expect("policy");
        let conf =
            format!("[storage]\ndriver = \"vfs\"\nrunroot = \"{0}/run\"\ngraphroot = \"{0}/root\"\n", root.display());
        std::fs::write(root.join("storage.conf"), conf).expect("storage.conf");
        write_layout(&root.join("layout"));
        store.copy(IMAGE);
        store
    }

    /// The image store's directory: where CRI-O's ImageFsInfo points (`overlay-images` there).
    fn images_dir(&self) -> PathBuf {
        self.dir.path().join("root/vfs-images")
    }

    fn transport(&self, image: &str) -> String {
        let root = self.dir.path();
        format!("containers-storage:[vfs@{0}/root+{0}/run]{image}", root.display())
    }

    fn run(&self, program: &str, args: &[&str]) {
        let output = Command::new(program)
            .args(args)
            .env("CONTAINERS_STORAGE_CONF", self.dir.path().join("storage.conf"))
            .output()
            .unwrap_or_else(|error| panic!("{program} runs (make deps installs it): {error}"));
        assert!(output.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    }

    /// `skopeo copy` of the layout into the store as `image`.
    fn copy(&self, image: &str) {
        let policy = self.dir.path().join("policy.json");
        let layout = format!("oci:{}", self.dir.path().join("layout").display());
        let policy = policy.to_str().expect("a UTF-8 path");
        self.run("skopeo", &["--policy", policy, "copy", "--quiet", &layout, &self.transport(image)]);
    }

    fn buildah(&self, args: &[&str]) {
        let root = self.dir.path();
        let (graph, run) = (root.join("root"), root.join("run"));
        let roots = ["--storage-driver", "vfs", "--root", graph.to_str().expect("UTF-8"), "--runroot"];
        let mut all: Vec<&str> = roots.to_vec();
        all.push(run.to_str().expect("UTF-8"));
        all.extend_from_slice(args);
        self.run("buildah", &all);
    }
}

/// An OCI layout holding one image with no layers: enough for a store to record it.
fn write_layout(layout: &Path) {
    use sha2::{Digest, Sha256};
    let blobs = layout.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).expect("layout");
    let blob = |bytes: &str| {
        let digest = format!("{:x}", Sha256::digest(bytes.as_bytes()));
        std::fs::write(blobs.join(&digest), bytes).expect("blob");
        (digest, bytes.len())
    };
    let (config, config_size) =
        blob(r#"{"architecture":"amd64","os":"linux","config":{},"rootfs":{"type":"layers","diff_ids":[]}}"#);
    let (manifest, manifest_size) = blob(&format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:{config}","size":{config_size}}},"layers":[]}}"#
    ));
    let index = format!(
        r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:{manifest}","size":{manifest_size}}}]}}"#
    );
    std::fs::write(layout.join("index.json"), index).expect("index");
    std::fs::write(layout.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).expect("oci-layout");
}

#[tokio::test]
async fn a_watch_on_a_real_store_has_each_change_queued_by_the_time_the_tool_returns() {
    let store = Store::new();
    let watch = StoreWatch::open(&store.images_dir()).expect("the store is watched");
    assert!(!watch.drain().expect("read"), "nothing changed yet");
    let steps: [(&str, &dyn Fn()); 3] = [
        ("skopeo copy", &|| store.copy("localhost/store-watch:2")),
        ("buildah tag", &|| store.buildah(&["tag", IMAGE, "localhost/store-watch:3"])),
        ("buildah rmi", &|| store.buildah(&["rmi", "--force", IMAGE])),
    ];
    for (what, step) in steps {
        step();
        // Read at once, without waiting for the fd to be readable: the barrier the cache uses.
        assert!(watch.drain().expect("read"), "{what} is seen");
        assert!(!watch.drain().expect("read"), "{what} is seen once");
    }
}

/// Reading the store takes its lock (containers/storage opens `images.lock` read-write and closes
/// it unwritten, as CRI-O does at every ImageStatus): no change, or the cache would be emptied at
/// every runtime call; a change after the reads is still seen.
#[tokio::test]
async fn readers_of_a_real_store_change_nothing() {
    let store = Store::new();
    let watch = StoreWatch::open(&store.images_dir()).expect("the store is watched");
    store.buildah(&["images"]);
    store.buildah(&["inspect", "--type", "image", IMAGE]);
    assert!(!watch.drain().expect("read"), "reads are no change");
    store.buildah(&["tag", IMAGE, "localhost/store-watch:4"]);
    assert!(watch.drain().expect("read"), "a tag after them is seen");
}

/// A daemon over a runtime without image events (as CRI-O) whose ImageFsInfo names the store.
async fn daemon_over(store: &Store, flags: &[&str]) -> (FakeRuntime, DaemonProcess, u16, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), FakeImageService::default());
    runtime.service.add_image(IMAGE, "sha256:store-watch", 4096);
    runtime.service.script.lock().unwrap().image_fs = Some(store.images_dir());
    let (port, listen) = metrics_listen();
    let mut all = vec!["--metrics-listen", listen.as_str()];
    all.extend_from_slice(flags);
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &runtime.socket, &all).await;
    let watching = || async move {
        tokio::task::spawn_blocking(move || metric(port, "cri_imaged_presence_cache_watching")).await.expect("metrics")
    };
    for _ in 0..250 {
        if watching().await == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(watching().await, 1.0, "{}", daemon.log_text());
    (runtime, daemon, port, dir)
}

fn status_calls(runtime: &FakeRuntime) -> usize {
    runtime.service.script.lock().unwrap().status_calls
}

#[tokio::test]
async fn on_a_runtime_without_events_a_removal_behind_our_back_is_never_missed_by_a_strict_check() {
    let store = Store::new();
    let (runtime, daemon, _, _dir) = daemon_over(&store, &["--presence-cache-max-staleness=0s"]).await;
    let mut client = ImageManagerClient::new(unix_channel(&daemon.socket));
    let status = client.get_status(GetStatusRequest::default()).await.expect("status").into_inner();
    assert_eq!(status.presence_cache_signal, format!("image store {}", store.images_dir().display()));
    call(&mut client, ensure(IMAGE, IF_NOT_PRESENT)).await.expect("present");
    let asked = status_calls(&runtime);
    call(&mut client, ensure(IMAGE, IF_NOT_PRESENT)).await.expect("present");
    assert_eq!(status_calls(&runtime), asked, "answered from memory, proven current by the store's watch");
    // The runtime's images and its store change together, as CRI-O's do.
    runtime.service.script.lock().unwrap().images.remove(IMAGE);
    store.buildah(&["rmi", "--force", IMAGE]);
    let refused = call(&mut client, ensure(IMAGE, NEVER)).await.expect_err("the image was removed");
    assert_eq!((refused.code(), reason(&refused).as_str()), (Code::FailedPrecondition, "ErrImageNeverPull"));
}

#[tokio::test]
async fn without_a_store_on_the_image_filesystem_image_store_path_names_it() {
    let store = Store::new();
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), FakeImageService::default());
    runtime.service.script.lock().unwrap().image_fs = Some(elsewhere.path().to_owned());
    let path = store.images_dir().display().to_string();
    let flags = ["--image-store-path", path.as_str()];
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &runtime.socket, &flags).await;
    let mut client = ImageManagerClient::new(unix_channel(&daemon.socket));
    let mut signal = String::new();
    for _ in 0..250 {
        let status = client.get_status(GetStatusRequest::default()).await.expect("status").into_inner();
        signal = status.presence_cache_signal;
        if status.presence_cache_watching {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(signal, format!("image store {path}"), "{}", daemon.log_text());
}

#[tokio::test]
async fn with_neither_signal_every_check_asks_the_runtime() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), FakeImageService::default());
    runtime.service.add_image(IMAGE, "sha256:store-watch", 4096);
    runtime.service.script.lock().unwrap().image_fs = Some(dir.path().to_owned());
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &runtime.socket, &[]).await;
    let mut client = ImageManagerClient::new(unix_channel(&daemon.socket));
    for _ in 0..3 {
        let asked = status_calls(&runtime);
        call(&mut client, ensure(IMAGE, IF_NOT_PRESENT)).await.expect("present");
        assert_eq!(status_calls(&runtime), asked + 1, "asked the runtime");
    }
    let status = client.get_status(GetStatusRequest::default()).await.expect("status").into_inner();
    assert_eq!((status.presence_cache_watching, status.presence_cache_signal.as_str()), (false, "none"));
}
