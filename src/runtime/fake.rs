//! One scripted container runtime for the unit tests: the images it has and how its image
//! service and content store answer, as each test sets them, and what it was asked.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::SystemTime,
};

use crate::cri::ImageSpec;
use secrecy::ExposeSecret;
use tokio::sync::{Notify, Semaphore};

use super::{
    ContentStore, Held, ImageFsUsage, ImageRuntime, PresentImage, PullSpec, RuntimeError, StoredImage, UsedImage,
};

/// The size of every image the fake pulls.
pub const PULLED_SIZE: u64 = 777;

/// A runtime whose answers the test scripts, and which records what it was asked. Build it with
/// [`FakeRuntime::default`] and the `with_…`/`…ing` helpers, or from a [`State`]; change and read
/// it as the test goes with [`FakeRuntime::state`].
#[derive(Default)]
pub struct FakeRuntime(Mutex<State>);

/// Everything the fake answers from, and what it saw. Calls never hold it across an await.
#[derive(Default)]
pub struct State {
    // Images: scripted, then changed by pulls and removals.
    /// What the runtime has; ImageStatus finds one by id or by any of its names.
    pub images: Vec<StoredImage>,
    /// When set, every ImageStatus fails with it.
    pub status_error: Option<tonic::Status>,
    /// When set, the next ImageStatus says it started, then waits to be released.
    pub next_status_hold: Option<Hold>,
    /// Every ImageStatus asked, in order.
    pub status_calls: Vec<ImageSpec>,

    // Pulls.
    /// What every pull answers: an image ref or the runtime's error. A pull unscripted panics.
    pub pull_result: Option<Result<String, tonic::Status>>,
    /// When set, the registry lets only this user pull: anyone else gets a 401.
    pub registry_user: Option<String>,
    /// When set, each pull waits for a permit.
    pub pull_gate: Option<Arc<Semaphore>>,
    /// Every pull asked, in order (including those refused).
    pub pulls: Vec<PullSpec>,

    // What garbage collection reads and does.
    /// Image refs and names containers were created from, with their runtime handlers.
    pub containers: Vec<UsedImage>,
    pub sandbox_image: Option<String>,
    /// Size of the image filesystem; its use is `other_usage` plus every image's size.
    pub capacity: u64,
    /// Bytes used by other things than images.
    pub other_usage: u64,
    /// Images whose removal the runtime refuses (busy).
    pub refuse_removal: HashSet<String>,
    /// When set, every removal says it started, then waits to be released.
    pub removal_hold: Option<Hold>,
    /// Every image removed, in order.
    pub removed: Vec<String>,
    /// How many times images were listed.
    pub image_listings: usize,

    // The content store (containerd's content service).
    /// The blobs being written, by ingest ref: (offset, total).
    pub ingests: HashMap<String, (u64, u64)>,
    /// Committed blobs by digest.
    pub blobs: HashMap<String, Vec<u8>>,
    /// The manifest digest of each repository: (host without port, path).
    pub manifests: HashMap<(String, String), String>,
    /// A runtime without the content service (CRI-O): listing ingests is unimplemented.
    pub no_content_service: bool,
    /// How many times ingests were listed.
    pub ingest_listings: usize,
    /// How many times a manifest was looked for.
    pub manifest_searches: usize,
    /// Leases by id: what each holds.
    pub leases: HashMap<String, Vec<Held>>,
}

/// Lets a call start, then holds it until released.
#[derive(Clone, Default)]
pub struct Hold {
    /// Notified as a held call starts.
    pub entered: Arc<Notify>,
    /// Notify it to let the call go on.
    pub release: Arc<Notify>,
}

impl Hold {
    async fn wait(&self) {
        self.entered.notify_one();
        self.release.notified().await;
    }
}

impl From<State> for FakeRuntime {
    fn from(state: State) -> Self {
        Self(Mutex::new(state))
    }
}

impl FakeRuntime {
    /// What the fake answers from and what it saw, to change or read in the test.
    pub fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn scripted(mut self, script: impl FnOnce(&mut State)) -> Self {
        script(self.0.get_mut().unwrap_or_else(PoisonError::into_inner));
        self
    }

    /// Has image `id` of `size` bytes, named `name`.
    pub fn with_image(self, name: &str, id: &str, size: u64) -> Self {
        let image = StoredImage { id: id.into(), size, names: vec![name.into()], ..StoredImage::default() };
        self.scripted(|state| state.images.push(image))
    }

    /// Every ImageStatus fails with `status`.
    pub fn failing_status(self, status: tonic::Status) -> Self {
        self.scripted(|state| state.status_error = Some(status))
    }

    /// The next ImageStatus waits on `hold`.
    pub fn holding_next_status(self, hold: Hold) -> Self {
        self.scripted(|state| state.next_status_hold = Some(hold))
    }

    /// Every pull answers `result`; a pulled image is present from then on, named as pulled.
    pub fn pulling_to(self, result: Result<&str, tonic::Status>) -> Self {
        self.scripted(|state| state.pull_result = Some(result.map(str::to_owned)))
    }

    /// The registry lets only `user` pull: anyone else, anonymous included, gets a 401.
    pub fn pulls_only_as(self, user: &str) -> Self {
        self.scripted(|state| state.registry_user = Some(user.into()))
    }

    /// Each pull waits for a permit of `gate`.
    pub fn gating_pulls(self, gate: Arc<Semaphore>) -> Self {
        self.scripted(|state| state.pull_gate = Some(gate))
    }

    /// A runtime without the content service (CRI-O).
    pub fn without_content_service(self) -> Self {
        self.scripted(|state| state.no_content_service = true)
    }

    /// Who each pull was made as, in order; `None` for an anonymous pull.
    pub fn pulled_as(&self) -> Vec<Option<String>> {
        self.state().pulls.iter().map(user_of).collect()
    }
}

fn user_of(pull: &PullSpec) -> Option<String> {
    pull.auth.as_ref().map(|auth| auth.username.expose_secret().to_owned())
}

impl ImageRuntime for FakeRuntime {
    async fn image_status(&self, image: ImageSpec) -> Result<Option<PresentImage>, RuntimeError> {
        let hold = self.state().next_status_hold.take();
        if let Some(hold) = hold {
            hold.wait().await;
        }
        let mut state = self.state();
        let name = image.image.clone();
        state.status_calls.push(image);
        if let Some(status) = state.status_error.clone() {
            return Err(status.into());
        }
        let found = state.images.iter().find(|stored| stored.id == name || stored.names.contains(&name));
        Ok(found.map(|stored| PresentImage {
            id: stored.id.clone(),
            size: stored.size,
            repo_digests: stored.names.iter().filter(|name| name.contains('@')).cloned().collect(),
        }))
    }

    async fn pull_image(&self, spec: PullSpec) -> Result<String, RuntimeError> {
        let gate = self.state().pull_gate.clone();
        if let Some(gate) = gate {
            gate.acquire().await.expect("the gate stays open").forget();
        }
        let (name, user) = (spec.image.image.clone(), user_of(&spec));
        let mut state = self.state();
        state.pulls.push(spec);
        if let Some(allowed) = state.registry_user.clone()
            && user.as_deref() != Some(allowed.as_str())
        {
            let who = user.unwrap_or_else(|| "anonymous".into());
            return Err(tonic::Status::unknown(format!("pull as {who}: 401 Unauthorized")).into());
        }
        let image_ref = state.pull_result.clone().expect("the test scripted no pull")?;
        if image_ref.is_empty() {
            return Err(RuntimeError::EmptyImageRef(name));
        }
        // The name moves to the pulled image, as a tag does.
        state.images.retain(|stored| stored.id != image_ref);
        state.images.iter_mut().for_each(|stored| stored.names.retain(|named| *named != name));
        let pulled =
            StoredImage { id: image_ref.clone(), size: PULLED_SIZE, names: vec![name], ..StoredImage::default() };
        state.images.push(pulled);
        Ok(image_ref)
    }

    async fn probe(&self) -> Result<(), RuntimeError> {
        Ok(())
    }

    async fn list_image_ids(&self) -> Result<Option<Vec<String>>, RuntimeError> {
        Ok(Some(self.state().images.iter().map(|image| image.id.clone()).collect()))
    }

    async fn list_images(&self) -> Result<Vec<StoredImage>, RuntimeError> {
        let mut state = self.state();
        state.image_listings += 1;
        Ok(state.images.clone())
    }

    async fn container_images(&self) -> Result<Vec<UsedImage>, RuntimeError> {
        Ok(self.state().containers.clone())
    }

    async fn sandbox_image(&self) -> Result<Option<String>, RuntimeError> {
        Ok(self.state().sandbox_image.clone())
    }

    async fn image_fs_usage(&self) -> Result<ImageFsUsage, RuntimeError> {
        let state = self.state();
        let used = state.other_usage + state.images.iter().map(|image| image.size).sum::<u64>();
        Ok(ImageFsUsage { capacity: state.capacity, available: state.capacity.saturating_sub(used) })
    }

    async fn remove_image(&self, id: &str, runtime_handler: &str) -> Result<(), RuntimeError> {
        let hold = self.state().removal_hold.clone();
        if let Some(hold) = hold {
            hold.wait().await;
        }
        let mut state = self.state();
        if state.refuse_removal.contains(id) {
            return Err(tonic::Status::failed_precondition(format!("image {id} is busy")).into());
        }
        state.images.retain(|image| image.id != id || image.runtime_handler != runtime_handler);
        state.removed.push(id.to_owned());
        Ok(())
    }
}

impl ContentStore for FakeRuntime {
    async fn list_ingests(&self) -> Result<Vec<(String, u64, u64)>, RuntimeError> {
        let mut state = self.state();
        state.ingest_listings += 1;
        if state.no_content_service {
            return Err(RuntimeError::Status(tonic::Status::unimplemented(
                "unknown service containerd.services.content.v1.Content",
            )));
        }
        Ok(state.ingests.iter().map(|(reference, (offset, total))| (reference.clone(), *offset, *total)).collect())
    }

    async fn find_manifest(&self, host: &str, path: &str, _: SystemTime) -> Result<Option<String>, RuntimeError> {
        let mut state = self.state();
        state.manifest_searches += 1;
        Ok(state.manifests.get(&(host.to_owned(), path.to_owned())).cloned())
    }

    async fn read_blob(&self, digest: &str, _: usize) -> Result<Vec<u8>, RuntimeError> {
        let blob = self.state().blobs.get(digest).cloned();
        blob.ok_or_else(|| RuntimeError::Status(tonic::Status::not_found(digest.to_owned())))
    }

    async fn has_blob(&self, digest: &str) -> Result<bool, RuntimeError> {
        Ok(self.state().blobs.contains_key(digest))
    }

    async fn create_lease(&self, id: &str, _: SystemTime) -> Result<(), RuntimeError> {
        self.state().leases.entry(id.to_owned()).or_default();
        Ok(())
    }

    async fn hold(&self, id: &str, held: &[Held]) -> Result<(), RuntimeError> {
        let mut state = self.state();
        let lease = state.leases.get_mut(id).ok_or_else(|| tonic::Status::not_found(format!("lease {id}")))?;
        lease.extend(held.iter().cloned());
        Ok(())
    }

    async fn held(&self, id: &str) -> Result<Vec<Held>, RuntimeError> {
        let state = self.state();
        state.leases.get(id).cloned().ok_or_else(|| tonic::Status::not_found(format!("lease {id}")).into())
    }

    async fn delete_lease(&self, id: &str) -> Result<(), RuntimeError> {
        self.state().leases.remove(id);
        Ok(())
    }

    async fn leases(&self, prefix: &str) -> Result<Vec<String>, RuntimeError> {
        Ok(self.state().leases.keys().filter(|id| id.starts_with(prefix)).cloned().collect())
    }
}
