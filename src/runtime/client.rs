//! The CRI `runtime.v1.ImageService` client over a unix socket.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use crate::cri::{
    ContainerStatusRequest, ImageFsInfoRequest, ImageSpec, ImageStatusRequest, ListContainersRequest,
    ListImagesRequest, PullImageRequest, RemoveImageRequest, StatusRequest, image_service_client::ImageServiceClient,
    runtime_service_client::RuntimeServiceClient,
};
use bytes::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use super::containerd::content::content_client::ContentClient;
use super::forward::Forwarder;
use super::{
    ImageFsUsage, ImageRuntime, MAX_MESSAGE_BYTES, Messages, PresentImage, PullSpec, RuntimeEndpoint, RuntimeError,
    StoredImage, UsedImage,
};

/// The containerd namespace the CRI plugin keeps images in.
const CRI_NAMESPACE: &str = "k8s.io";

/// ListContainers answers for every container on the node, with its labels and annotations: at
/// 50,000 containers of about 1 KiB each, past the 16 MiB that is enough for anything else.
const LIST_CONTAINERS_MAX_BYTES: usize = 128 * 1024 * 1024;

/// ContainerStatus calls in flight at once while image GC learns new containers' mounts.
const STATUS_CALLS_AT_ONCE: usize = 8;

/// Whether `status` is tonic enforcing the `grpc-timeout` we sent (our client's timer, or a
/// runtime's server built on tonic): CANCELLED "Timeout expired", beside our own timer and often
/// first. That is our request deadline passing, not a cancellation.
fn is_client_timeout(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Cancelled && status.message() == tonic::TimeoutExpired(()).to_string()
}

/// A CRI image service client over a unix socket.
///
/// The channel connects on first use and reconnects after the runtime restarts (containerd
/// re-creates its socket), so the daemon can start before the runtime does.
#[derive(Clone)]
pub struct CriClient {
    channel: Channel,
    client: ImageServiceClient<Channel>,
    /// The runtime half of the CRI on the same socket: containers in use, the sandbox image.
    runtime_client: RuntimeServiceClient<Channel>,
    /// The pass-through's calls, on a connection of their own.
    forwarder: Arc<Forwarder>,
    request_timeout: Duration,
    /// The images each container mounts as volumes, by container id: a container's mounts are
    /// fixed when it is created, so each is asked once. Only listed containers are kept.
    mounted: Arc<Mutex<HashMap<String, Vec<UsedImage>>>>,
}

impl CriClient {
    /// A lazily connecting client; `request_timeout` bounds every call but pulls.
    pub fn new(endpoint: &RuntimeEndpoint, request_timeout: Duration) -> Self {
        let path = endpoint.path().to_owned();
        // The URI is a placeholder: the connector below dials the socket.
        let channel =
            Endpoint::from_static("http://localhost").connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
            }));
        let client = ImageServiceClient::new(channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let runtime_client = RuntimeServiceClient::new(channel.clone())
            .max_decoding_message_size(LIST_CONTAINERS_MAX_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let forwarder = Arc::new(Forwarder::new(endpoint.path().to_owned(), MAX_MESSAGE_BYTES));
        Self { channel, client, runtime_client, forwarder, request_timeout, mounted: Arc::default() }
    }

    /// The images the containers `ids` mount as volumes (KEP-4639: CRI ContainerStatus
    /// `mounts[].image`, which ListContainers does not carry), asking only about containers not
    /// asked about before. A container gone meanwhile mounts nothing; any other failure fails the
    /// whole answer, so that image GC keeps everything when unsure. A mount that names no
    /// runtime handler counts under its container's (`ids` pairs each id with it).
    async fn mounted_images(&self, ids: Vec<(String, String)>) -> Result<Vec<UsedImage>, RuntimeError> {
        use futures_util::StreamExt;
        let unknown: Vec<(String, String)> = {
            let mut mounted = self.mounted.lock().unwrap_or_else(PoisonError::into_inner);
            let listed: std::collections::HashSet<&String> = ids.iter().map(|(id, _)| id).collect();
            mounted.retain(|id, _| listed.contains(id));
            ids.iter().filter(|(id, _)| !mounted.contains_key(id)).cloned().collect()
        };
        let asked = futures_util::stream::iter(unknown)
            .map(|(id, container_handler)| async move {
                let request = self.request(ContainerStatusRequest { container_id: id.clone(), verbose: false });
                match self.bounded(self.runtime_client.clone().container_status(request)).await {
                    Ok(response) => {
                        let mounts = response.status.map(|status| status.mounts).unwrap_or_default();
                        let images =
                            mounts.into_iter().filter_map(|mount| mount.image).filter(|image| !image.image.is_empty());
                        let used = images.map(|image| match image.runtime_handler.is_empty() {
                            true => UsedImage::new(image.image, container_handler.as_str()),
                            false => UsedImage::new(image.image, image.runtime_handler),
                        });
                        Ok(Some((id, used.collect())))
                    }
                    Err(error) if error.code() == tonic::Code::NotFound => Ok(None),
                    Err(error) => Err(error),
                }
            })
            .buffer_unordered(STATUS_CALLS_AT_ONCE)
            .collect::<Vec<_>>()
            .await;
        let mut mounted = self.mounted.lock().unwrap_or_else(PoisonError::into_inner);
        for answer in asked {
            if let Some((id, images)) = answer? {
                mounted.insert(id, images);
            }
        }
        Ok(ids.iter().filter_map(|(id, _)| mounted.get(id)).flatten().cloned().collect())
    }

    /// The connection to the runtime, for other services on its socket (containerd's events).
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// Runs a non-pull call under the request deadline, told to the runtime too.
    pub(super) async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, RuntimeError> {
        match tokio::time::timeout(self.request_timeout, call).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) if is_client_timeout(&status) => Err(RuntimeError::Timeout(self.request_timeout)),
            Ok(Err(status)) => Err(status.into()),
            Err(_) => Err(RuntimeError::Timeout(self.request_timeout)),
        }
    }

    pub(super) fn content(&self) -> ContentClient<Channel> {
        ContentClient::new(self.channel.clone()).max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// A request to containerd's content service, in the CRI plugin's namespace.
    pub(super) fn content_request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = self.request(message);
        request
            .metadata_mut()
            .insert("containerd-namespace", tonic::metadata::MetadataValue::from_static(CRI_NAMESPACE));
        request
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(self.request_timeout);
        request
    }
}

impl ImageRuntime for CriClient {
    async fn image_status(&self, image: ImageSpec) -> Result<Option<PresentImage>, RuntimeError> {
        let request = self.request(ImageStatusRequest { image: Some(image), verbose: false });
        let response = self.bounded(self.client.clone().image_status(request)).await?;
        Ok(response.image.map(|image| PresentImage {
            id: image.id,
            size: image.size,
            repo_digests: image.repo_digests,
        }))
    }

    async fn pull_image(&self, spec: PullSpec) -> Result<String, RuntimeError> {
        let name = spec.image.image.clone();
        let request = PullImageRequest {
            image: Some(spec.image),
            auth: spec.auth.map(|auth| auth.to_cri()),
            sandbox_config: spec.sandbox_config,
        };
        // Pulls are unbounded here, as in the kubelet; the caller decides how long to wait.
        let response = self.client.clone().pull_image(request).await?.into_inner();
        if response.image_ref.is_empty() {
            return Err(RuntimeError::EmptyImageRef(name));
        }
        Ok(response.image_ref)
    }

    async fn probe(&self) -> Result<(), RuntimeError> {
        let request = self.request(ImageFsInfoRequest {});
        self.bounded(self.client.clone().image_fs_info(request)).await?;
        Ok(())
    }

    async fn list_image_ids(&self) -> Result<Option<Vec<String>>, RuntimeError> {
        let request = self.request(ListImagesRequest { filter: None });
        let response = self.bounded(self.client.clone().list_images(request)).await?;
        Ok(Some(response.images.into_iter().map(|image| image.id).collect()))
    }

    async fn list_images(&self) -> Result<Vec<StoredImage>, RuntimeError> {
        let request = self.request(ListImagesRequest { filter: None });
        let response = self.bounded(self.client.clone().list_images(request)).await?;
        Ok(response
            .images
            .into_iter()
            .map(|image| StoredImage {
                id: image.id,
                size: image.size,
                pinned: image.pinned,
                names: image.repo_tags.into_iter().chain(image.repo_digests).collect(),
                runtime_handler: image.spec.map(|spec| spec.runtime_handler).unwrap_or_default(),
            })
            .collect())
    }

    async fn container_images(&self) -> Result<Vec<UsedImage>, RuntimeError> {
        let request = self.request(ListContainersRequest { filter: None });
        let response = self.bounded(self.runtime_client.clone().list_containers(request)).await?;
        let mut ids = Vec::with_capacity(response.containers.len());
        let mut images = Vec::with_capacity(response.containers.len() * 3);
        for container in response.containers {
            let (image, handler) = container.image.map(|spec| (spec.image, spec.runtime_handler)).unwrap_or_default();
            for name in [container.image_ref, container.image_id, image] {
                if !name.is_empty() {
                    images.push(UsedImage::new(name, handler.as_str()));
                }
            }
            ids.push((container.id, handler));
        }
        images.extend(self.mounted_images(ids).await?);
        Ok(images)
    }

    async fn sandbox_image(&self) -> Result<Option<String>, RuntimeError> {
        let request = self.request(StatusRequest { verbose: true });
        let response = self.bounded(self.runtime_client.clone().status(request)).await?;
        Ok(sandbox_image_from_status(&response.info))
    }

    async fn image_fs_usage(&self) -> Result<ImageFsUsage, RuntimeError> {
        let mountpoint = self
            .image_fs_mountpoint()
            .await?
            .ok_or_else(|| RuntimeError::ImageFs("ImageFsInfo reported no filesystem".into()))?;
        let statted = tokio::task::spawn_blocking(move || statvfs(mountpoint)).await;
        statted.map_err(|error| RuntimeError::ImageFs(error.to_string()))?
    }

    async fn image_fs_mountpoint(&self) -> Result<Option<PathBuf>, RuntimeError> {
        let request = self.request(ImageFsInfoRequest {});
        let response = self.bounded(self.client.clone().image_fs_info(request)).await?;
        Ok(response
            .image_filesystems
            .into_iter()
            .find_map(|filesystem| filesystem.fs_id.map(|id| id.mountpoint).filter(|path| !path.is_empty()))
            .map(PathBuf::from))
    }

    async fn remove_image(&self, name: &str, runtime_handler: &str) -> Result<(), RuntimeError> {
        let spec = |image: &str| ImageSpec {
            image: image.to_owned(),
            runtime_handler: runtime_handler.to_owned(),
            ..Default::default()
        };
        // Always by id: CRI-O answers OK to a removal by `repo@digest` and removes nothing.
        let Some(image) = self.image_status(spec(name)).await? else {
            return Ok(());
        };
        let request = self.request(RemoveImageRequest { image: Some(spec(&image.id)) });
        self.bounded(self.client.clone().remove_image(request)).await?;
        // An answer is no proof: only an image the runtime no longer has is removed.
        match self.image_status(spec(&image.id)).await? {
            Some(_) => Err(RuntimeError::NotRemoved(image.id)),
            None => Ok(()),
        }
    }

    async fn forward_raw(&self, path: &'static str, message: Bytes) -> Result<Bytes, tonic::Status> {
        let call = self.forwarder.unary(path, message, self.request_timeout);
        let timed_out = || tonic::Status::deadline_exceeded(RuntimeError::Timeout(self.request_timeout).to_string());
        match tokio::time::timeout(self.request_timeout, call).await {
            Ok(Err(status)) if is_client_timeout(&status) => Err(timed_out()),
            Ok(answer) => answer,
            Err(_) => Err(timed_out()),
        }
    }

    async fn forward_stream(&self, path: &'static str, message: Bytes) -> Result<Messages, tonic::Status> {
        self.forwarder.server_stream(path, message, self.request_timeout).await
    }

    async fn relay(
        &self,
        request: http::Request<tonic::body::Body>,
    ) -> Result<http::Response<tonic::body::Body>, tonic::Status> {
        self.forwarder.relay(request).await
    }
}

/// Capacity and available bytes of the filesystem at `mountpoint`, as cadvisor reads them for the
/// kubelet: blocks and blocks available to unprivileged users, times the fragment size.
fn statvfs(mountpoint: PathBuf) -> Result<ImageFsUsage, RuntimeError> {
    let stat = rustix::fs::statvfs(&mountpoint).map_err(|error| {
        // In a container (the DaemonSet) the runtime's directories are not mounted.
        let hint = if error == rustix::io::Errno::NOENT { ": this daemon does not see that path" } else { "" };
        RuntimeError::ImageFs(format!("statvfs {}: {error}{hint}", mountpoint.display()))
    })?;
    Ok(ImageFsUsage {
        capacity: stat.f_blocks.saturating_mul(stat.f_frsize),
        available: stat.f_bavail.saturating_mul(stat.f_frsize),
    })
}

/// The sandbox image in a verbose CRI `Status` answer: containerd puts its CRI config, as JSON,
/// under `config`, with `sandboxImage` in it.
pub fn sandbox_image_from_status(info: &HashMap<String, String>) -> Option<String> {
    let config: serde_json::Value = serde_json::from_str(info.get("config")?).ok()?;
    let image = config.get("sandboxImage")?.as_str()?;
    (!image.is_empty()).then(|| image.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containerds_sandbox_image_is_read_from_its_verbose_status() {
        let info = HashMap::from([(
            "config".to_owned(),
            r#"{"containerd":{"snapshotter":"native"},"sandboxImage":"registry.k8s.io/pause:3.6"}"#.to_owned(),
        )]);
        assert_eq!(sandbox_image_from_status(&info).as_deref(), Some("registry.k8s.io/pause:3.6"));
        for config in ["{}", r#"{"sandboxImage":""}"#, "not json"] {
            let info = HashMap::from([("config".to_owned(), config.to_owned())]);
            assert_eq!(sandbox_image_from_status(&info), None, "{config}");
        }
        assert_eq!(sandbox_image_from_status(&HashMap::new()), None);
    }

    #[test]
    fn the_image_filesystem_is_measured_with_statvfs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let usage = statvfs(dir.path().to_owned()).expect("statvfs");
        assert!(usage.capacity > 0 && usage.available <= usage.capacity, "{usage:?}");
        let absent = statvfs(dir.path().join("absent"));
        assert!(
            matches!(&absent, Err(RuntimeError::ImageFs(why)) if why.ends_with("this daemon does not see that path")),
            "{absent:?}"
        );
    }
}
