//! Image GC racing EnsureImageExists: a pass that deletes every unused image runs while a herd of
//! pods asks for those same images, over 1,000 rounds whose interleavings a seeded generator
//! varies (each runtime call yields a few times at random, so the calls of the herd and of the
//! pass overlap differently each round). Whatever the interleaving, an image answered "already
//! present" still exists when the round ends: the kubelet is about to create its container.

use std::{
    collections::HashMap,
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use cri_imaged::cri::ImageSpec;
use cri_imaged::{
    credentials::NodeCredentials,
    daemon::Parts,
    ensure::{EnsureRequest, ManagerConfig, PodRef},
    gc::{GcConfig, GcPolicy, Outcome, PassRequest},
    pull_policy::PullPolicy,
    runtime::{ContentStore, ImageFsUsage, ImageRuntime, PresentImage, PullSpec, RuntimeError, StoredImage, UsedImage},
};

const ROUNDS: u64 = 1_000;
const IMAGES: usize = 8;
const HERD: usize = 24;
const HAND_OUT_WINDOW: Duration = Duration::from_secs(120);

/// A runtime holding [`IMAGES`] images, each call yielding a few times at random on the way in
/// and out; a removal takes a while, the image present until it ends.
#[derive(Default)]
struct RacingRuntime {
    /// Image name to id.
    images: Mutex<HashMap<String, String>>,
    seed: AtomicU64,
}

fn name(i: usize) -> String {
    format!("registry.local/race/image-{i}:v1")
}

fn id(i: usize) -> String {
    format!("sha256:{i:064}")
}

impl RacingRuntime {
    fn restore_every_image(&self) {
        *self.images.lock().unwrap() = (0..IMAGES).map(|i| (name(i), id(i))).collect();
    }

    fn has(&self, id: &str) -> bool {
        self.images.lock().unwrap().values().any(|present| present == id)
    }

    /// The next number of a linear congruential generator: reproducible interleavings.
    fn random(&self) -> u64 {
        let next = |x: u64| x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let previous = self.seed.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |x| Some(next(x))).unwrap();
        next(previous) >> 33
    }

    async fn jitter(&self) {
        for _ in 0..self.random() % 4 {
            tokio::task::yield_now().await;
        }
    }
}

impl ImageRuntime for RacingRuntime {
    async fn image_status(&self, image: ImageSpec) -> Result<Option<PresentImage>, RuntimeError> {
        self.jitter().await;
        let found = self.images.lock().unwrap().get(&image.image).cloned();
        self.jitter().await;
        Ok(found.map(|id| PresentImage { id, size: 1, repo_digests: Vec::new() }))
    }

    async fn pull_image(&self, spec: PullSpec) -> Result<String, RuntimeError> {
        Err(tonic::Status::internal(format!("the race pulls nothing: {}", spec.image.image)).into())
    }

    async fn probe(&self) -> Result<(), RuntimeError> {
        Ok(())
    }

    async fn list_images(&self) -> Result<Vec<StoredImage>, RuntimeError> {
        self.jitter().await;
        let images = self.images.lock().unwrap().clone();
        Ok(images
            .into_iter()
            .map(|(name, id)| StoredImage { id, size: 1, names: vec![name], ..StoredImage::default() })
            .collect())
    }

    async fn container_images(&self) -> Result<Vec<UsedImage>, RuntimeError> {
        Ok(Vec::new())
    }

    async fn image_fs_usage(&self) -> Result<ImageFsUsage, RuntimeError> {
        Ok(ImageFsUsage { capacity: 100, available: 50 })
    }

    async fn remove_image(&self, id: &str, _: &str) -> Result<(), RuntimeError> {
        self.jitter().await;
        self.jitter().await;
        self.images.lock().unwrap().retain(|_, present| present != id);
        self.jitter().await;
        Ok(())
    }
}

/// The pull path wants a content store; this runtime pulls nothing, so it has none to read.
impl ContentStore for RacingRuntime {}

fn request(image: String, pod: usize) -> EnsureRequest {
    EnsureRequest {
        image,
        pull_policy: Some(PullPolicy::Never),
        pod: PodRef {
            namespace: "race".into(),
            name: format!("pod-{pod}"),
            uid: format!("uid-{pod}"),
            ..PodRef::default()
        },
        container_name: "app".into(),
        runtime_handler: String::new(),
        sandbox_config: None,
        pull_secrets: Vec::new(),
        service_account: None,
        peer: None,
        class: Default::default(),
        keep_in: None,
    }
}

fn parts(runtime: Arc<RacingRuntime>, root: &Path) -> Parts<RacingRuntime> {
    // Old enough at once, so that a pass removes every image it may.
    let policy = GcPolicy { min_age: Duration::ZERO, ..GcPolicy::KUBELET };
    let gc = GcConfig { policy, hand_out_window: HAND_OUT_WINDOW, ..GcConfig::off() };
    Parts::build(
        runtime,
        (ManagerConfig::default(), gc, Default::default(), Default::default()),
        Arc::new(NodeCredentials::none()),
        root,
    )
    .expect("parts")
}

#[tokio::test(start_paused = true)]
async fn no_image_answered_present_is_removed_by_a_racing_collection() {
    let root = tempfile::tempdir().expect("tempdir");
    let runtime = Arc::new(RacingRuntime::default());
    let parts = parts(runtime.clone(), root.path());
    let (mut present_answers, mut removed, mut refused_while_removed) = (0, 0, 0);
    for round in 0..ROUNDS {
        runtime.seed.store(round, Ordering::Relaxed);
        runtime.restore_every_image();
        // Every earlier hand-out is out of the window: each round's pass may remove any image.
        tokio::time::advance(HAND_OUT_WINDOW + Duration::from_secs(1)).await;
        let pass_at = runtime.random() as usize % HERD;
        let mut herd = Vec::new();
        let mut pass = None;
        for pod in 0..HERD {
            if pod == pass_at {
                let gc = parts.services.gc.clone();
                pass = Some(tokio::spawn(
                    async move { gc.pass(PassRequest { dry_run: false, delete_unused: true }).await },
                ));
            }
            let manager = parts.services.manager.clone();
            let image = name(runtime.random() as usize % IMAGES);
            // Pods arrive over the pass, not all at once.
            let arrives_after = runtime.random() % 32;
            herd.push(tokio::spawn(async move {
                for _ in 0..arrives_after {
                    tokio::task::yield_now().await;
                }
                manager.ensure_image_exists(request(image, pod)).await
            }));
        }
        let report = pass.expect("the pass ran").await.expect("pass task").expect("the pass succeeds");
        removed += report.images.iter().filter(|image| image.outcome == Outcome::Removed).count();
        for answer in herd {
            match answer.await.expect("ensure task") {
                Ok(outcome) => {
                    present_answers += 1;
                    assert!(
                        runtime.has(&outcome.image_ref),
                        "round {round}: {} was answered present, then removed: {report:?}",
                        outcome.image_ref
                    );
                }
                // Never, and absent: the pass removed it first, or was removing it.
                Err(_) => refused_while_removed += 1,
            }
        }
    }
    println!("{ROUNDS} rounds: {present_answers} answered present, {refused_while_removed} refused, {removed} removed");
    // Not vacuous: both sides won often.
    assert!(present_answers > (ROUNDS as usize) * HERD / 4, "{present_answers}");
    assert!(removed > ROUNDS as usize, "{removed}");
    assert!(refused_while_removed > (ROUNDS as usize), "{refused_while_removed}");
}
