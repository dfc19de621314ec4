//! A scripted CRI ImageService: the generated CRI server on a unix socket, optionally with
//! containerd's event service beside it, or the RuntimeService's ListContainers that image GC
//! asks.

use std::{
    collections::HashMap,
    convert::Infallible,
    path::{Path, PathBuf},
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use cri_imaged::cri::{
    FilesystemIdentifier, FilesystemUsage, Image, ImageFsInfoRequest, ImageFsInfoResponse, ImageSpec,
    ImageStatusRequest, ImageStatusResponse, ListContainersRequest, ListContainersResponse, ListImagesRequest,
    ListImagesResponse, PullImageRequest, PullImageResponse, RemoveImageRequest, RemoveImageResponse,
    StreamImagesRequest, StreamImagesResponse,
    image_service_server::{ImageService, ImageServiceServer},
};
use tokio::{
    net::UnixListener,
    sync::{Notify, oneshot},
    task::JoinHandle,
};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use super::{fake_events::FakeEvents, fake_runtime_methods::WithMethodsOfItsOwn};

/// What the fake answers and what it saw.
#[derive(Default)]
pub struct Script {
    /// Present images by name (as the runtime was asked, tag included).
    pub images: HashMap<String, Image>,
    /// Pull of this name fails with this status.
    pub pull_errors: HashMap<String, Status>,
    /// Every ImageStatus fails with this status.
    pub status_error: Option<Status>,
    /// ImageStatus calls received.
    pub status_calls: usize,
    /// Pulls succeed but report an empty image ref.
    pub empty_image_ref: bool,
    /// Every PullImage request received.
    pub pulls: Vec<PullImageRequest>,
    /// When set, each pull waits until this is notified.
    pub pull_gate: Option<Arc<Notify>>,
    /// While set, ImageStatus and ImageFsInfo wait for it: a frozen runtime.
    pub frozen: Option<Arc<Notify>>,
    /// Each pull takes this long (real time).
    pub pull_delay: std::time::Duration,
    /// Pulls under way now, and the most there ever were at once.
    pub pulls_running: usize,
    pub most_pulls_at_once: usize,
    /// The mount point ImageFsInfo names (none: a filesystem without one, which image GC
    /// cannot measure).
    pub image_fs: Option<PathBuf>,
    /// A container filesystem of its own (KEP-4191's split image filesystem), when set.
    pub container_fs: Option<PathBuf>,
    /// Every RemoveImage asked, in order.
    pub removals: Vec<ImageSpec>,
    /// Removals as CRI-O does them: by id the image goes, by any other name (`repo@digest`) the
    /// answer is OK and nothing is removed.
    pub removes_by_id_only: bool,
    /// Every removal answers OK and removes nothing.
    pub removals_ignored: bool,
    /// Serve StreamImages, this many images a message (as containerd from 2.4 and CRI-O from
    /// 1.36); `None`: UNIMPLEMENTED, as older runtimes.
    pub stream_images: Option<usize>,
    /// StreamImages and ListImages calls received.
    pub stream_calls: usize,
    pub list_calls: usize,
}

/// Shared handle on the script.
#[derive(Clone, Default)]
pub struct FakeImageService {
    pub script: Arc<Mutex<Script>>,
    /// Image events, published as containerd publishes them (served only by
    /// [`FakeRuntime::start_with_events`]).
    pub events: FakeEvents,
}

impl FakeImageService {
    /// Scripts `name` as present with this id and size.
    pub fn add_image(&self, name: &str, id: &str, size: u64) {
        let image = Image { id: id.into(), repo_tags: vec![name.into()], size, ..Default::default() };
        self.script.lock().unwrap().images.insert(name.into(), image);
    }

    pub fn fail_pull(&self, name: &str, status: Status) {
        self.script.lock().unwrap().pull_errors.insert(name.into(), status);
    }

    pub fn pulls(&self) -> Vec<PullImageRequest> {
        self.script.lock().unwrap().pulls.clone()
    }

    /// Removes `name` as a client on the runtime's own socket would (ctr, crictl on containerd):
    /// the image goes and an `/images/delete` event is published.
    pub fn remove(&self, name: &str) {
        self.script.lock().unwrap().images.remove(name);
        self.events.publish("/images/delete", None);
    }

    /// Makes ImageStatus and ImageFsInfo hang until [`FakeImageService::thaw`].
    pub fn freeze(&self) {
        self.script.lock().unwrap().frozen = Some(Arc::new(Notify::new()));
    }

    pub fn thaw(&self) {
        if let Some(frozen) = self.script.lock().unwrap().frozen.take() {
            frozen.notify_waiters();
        }
    }

    async fn wait_while_frozen(&self) {
        let frozen = self.script.lock().unwrap().frozen.clone();
        if let Some(frozen) = frozen {
            frozen.notified().await;
        }
    }
}

#[tonic::async_trait]
impl ImageService for FakeImageService {
    async fn list_images(&self, _: Request<ListImagesRequest>) -> Result<Response<ListImagesResponse>, Status> {
        let mut script = self.script.lock().unwrap();
        script.list_calls += 1;
        Ok(Response::new(ListImagesResponse { images: script.images.values().cloned().collect() }))
    }

    type StreamImagesStream = tokio_stream::Iter<std::vec::IntoIter<Result<StreamImagesResponse, Status>>>;

    async fn stream_images(
        &self,
        _: Request<StreamImagesRequest>,
    ) -> Result<Response<Self::StreamImagesStream>, Status> {
        let mut script = self.script.lock().unwrap();
        script.stream_calls += 1;
        let Some(per_message) = script.stream_images else {
            return Err(Status::unimplemented("unknown method StreamImages for service runtime.v1.ImageService"));
        };
        let images: Vec<Image> = script.images.values().cloned().collect();
        let messages =
            images.chunks(per_message.max(1)).map(|images| Ok(StreamImagesResponse { images: images.to_vec() }));
        Ok(Response::new(tokio_stream::iter(messages.collect::<Vec<_>>())))
    }

    async fn image_status(
        &self,
        request: Request<ImageStatusRequest>,
    ) -> Result<Response<ImageStatusResponse>, Status> {
        let ImageSpec { image: name, runtime_handler, .. } = request.into_inner().image.unwrap_or_default();
        self.wait_while_frozen().await;
        let mut script = self.script.lock().unwrap();
        script.status_calls += 1;
        if let Some(status) = &script.status_error {
            return Err(status.clone());
        }
        // By any name, or by id (the copy kept for the handler asked), as runtimes resolve them.
        let by_id = |image: &&Image| image.id == name && handler_of(image) == runtime_handler;
        let image = script.images.get(&name).or_else(|| script.images.values().find(by_id)).cloned();
        Ok(Response::new(ImageStatusResponse { image, info: HashMap::new() }))
    }

    async fn pull_image(&self, request: Request<PullImageRequest>) -> Result<Response<PullImageResponse>, Status> {
        let request = request.into_inner();
        let name = request.image.clone().unwrap_or_default().image;
        let (gate, delay) = {
            let mut script = self.script.lock().unwrap();
            script.pulls.push(request);
            script.pulls_running += 1;
            script.most_pulls_at_once = script.most_pulls_at_once.max(script.pulls_running);
            (script.pull_gate.clone(), script.pull_delay)
        };
        if let Some(gate) = gate {
            gate.notified().await;
        }
        tokio::time::sleep(delay).await;
        let mut script = self.script.lock().unwrap();
        script.pulls_running -= 1;
        if let Some(status) = script.pull_errors.get(&name) {
            return Err(status.clone());
        }
        if script.empty_image_ref {
            return Ok(Response::new(PullImageResponse { image_ref: String::new() }));
        }
        let id = format!("sha256:{:064x}", script.pulls.len());
        let image = Image { id: id.clone(), repo_tags: vec![name.clone()], size: 4096, ..Default::default() };
        script.images.insert(name, image);
        Ok(Response::new(PullImageResponse { image_ref: id }))
    }

    async fn remove_image(
        &self,
        request: Request<RemoveImageRequest>,
    ) -> Result<Response<RemoveImageResponse>, Status> {
        let spec = request.into_inner().image.unwrap_or_default();
        let names: Vec<String> = {
            let mut script = self.script.lock().unwrap();
            script.removals.push(spec.clone());
            let by_name = script.images.get(&spec.image).filter(|_| !script.removes_by_id_only);
            let id = by_name.map_or(spec.image.clone(), |image| image.id.clone());
            let named =
                script.images.iter().filter(|(_, image)| image.id == id && handler_of(image) == spec.runtime_handler);
            let names = named.map(|(name, _)| name.clone()).collect();
            if script.removals_ignored { Vec::new() } else { names }
        };
        // The image goes with every name it has, as containerd's CRI removes it.
        for name in names {
            self.remove(&name);
        }
        Ok(Response::new(RemoveImageResponse {}))
    }

    async fn image_fs_info(&self, _: Request<ImageFsInfoRequest>) -> Result<Response<ImageFsInfoResponse>, Status> {
        self.wait_while_frozen().await;
        let (image_fs, container_fs) = {
            let script = self.script.lock().unwrap();
            (script.image_fs.clone(), script.container_fs.clone())
        };
        let usage = |mountpoint: Option<PathBuf>| {
            let fs_id = mountpoint.map(|path| FilesystemIdentifier { mountpoint: path.to_string_lossy().into_owned() });
            FilesystemUsage { fs_id, ..FilesystemUsage::default() }
        };
        let container_filesystems = container_fs.map(|path| vec![usage(Some(path))]).unwrap_or_default();
        Ok(Response::new(ImageFsInfoResponse { image_filesystems: vec![usage(image_fs)], container_filesystems }))
    }
}

/// The runtime handler an image is kept for (KEP-4216); empty for the default.
fn handler_of(image: &Image) -> &str {
    image.spec.as_ref().map_or("", |spec| spec.runtime_handler.as_str())
}

/// The fake served on a socket; dropping or stopping it takes the socket away.
pub struct FakeRuntime {
    pub service: FakeImageService,
    pub socket: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl FakeRuntime {
    /// Serves `service` on `socket`, without containerd's event service (as CRI-O).
    pub fn start(socket: &Path, service: FakeImageService) -> Self {
        Self::serve(socket, service, Serve::default())
    }

    /// Serves `service` and its events on `socket`, as containerd does.
    pub fn start_with_events(socket: &Path, service: FakeImageService) -> Self {
        Self::serve(socket, service, Serve { events: true, containers: false })
    }

    /// Serves `service` and a RuntimeService that lists no containers (all image GC asks of it),
    /// so that GC passes run against the fake.
    pub fn start_for_gc(socket: &Path, service: FakeImageService) -> Self {
        Self::serve(socket, service, Serve { events: false, containers: true })
    }

    fn serve(socket: &Path, service: FakeImageService, with: Serve) -> Self {
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket).expect("fake runtime binds its socket");
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tonic::transport::Server::builder()
            .add_service(WithMethodsOfItsOwn(ImageServiceServer::new(service.clone())))
            .add_optional_service(with.events.then(|| service.events.server()))
            .add_optional_service(with.containers.then_some(NoContainers));
        let task = tokio::spawn(async move {
            let incoming = UnixListenerStream::new(listener);
            server
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await
                .expect("fake runtime serves");
        });
        Self { service, socket: socket.to_owned(), stop: Some(stop), task: Some(task) }
    }

    /// Stops serving and removes the socket, as a runtime that went away.
    pub async fn stop(mut self) -> FakeImageService {
        self.shutdown().await;
        self.service.clone()
    }

    async fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Drop for FakeRuntime {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// What a [`FakeRuntime`] serves besides the image service.
#[derive(Default, Clone, Copy)]
struct Serve {
    /// containerd's event service.
    events: bool,
    /// The RuntimeService's ListContainers (see [`NoContainers`]).
    containers: bool,
}

/// The CRI RuntimeService as far as image GC asks it: ListContainers, answered with no
/// containers. Every other method is unimplemented (so the runtime names no sandbox image).
#[derive(Clone, Copy)]
struct NoContainers;

impl tonic::server::NamedService for NoContainers {
    const NAME: &'static str = "runtime.v1.RuntimeService";
}

impl tonic::server::UnaryService<ListContainersRequest> for NoContainers {
    type Response = ListContainersResponse;
    type Future = std::future::Ready<Result<Response<ListContainersResponse>, Status>>;

    fn call(&mut self, _: Request<ListContainersRequest>) -> Self::Future {
        std::future::ready(Ok(Response::new(ListContainersResponse::default())))
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for NoContainers {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(async move {
            if request.uri().path() != "/runtime.v1.RuntimeService/ListContainers" {
                return Ok(Status::unimplemented("the fake runtime only lists containers").into_http());
            }
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
            Ok(grpc.unary(NoContainers, request).await)
        })
    }
}
