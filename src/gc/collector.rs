//! The collector: one pass lists what the runtime has and uses, brings the records up to date,
//! plans (see [`super::plan`]) and removes (`removal`); [`ImageGc::run`] makes a pass every period
//! until shutdown (`schedule`), and the `GarbageCollect` RPC asks for one. What a pass is asked
//! and what it did: `report`. The images as a pass sees them, for `ListImages`: `listing`.

mod listing;
mod removal;
mod report;
mod schedule;

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::SystemTime,
};

use tokio::time::Instant;

use self::report::pass_failure;
pub use self::{
    listing::NodeImage,
    report::{Chosen, KeptImage, LastPass, Outcome, PassReport, PassRequest},
};
use super::{
    GcConfig,
    ages::AgesFile,
    guard::ImageGuard,
    metrics::{GcMetrics, PassOutcome},
    plan::{self, DiskUsage, GcPolicy, ImageRecord, InUse, Kept, Plan, PlanError, Reason, record_id},
};
use crate::{
    events::{Event, EventType, Events, reason as event_reason},
    pinned::{Pin, PinnedImages},
    presence::PresenceCache,
    records::PullRecords,
    runtime::{ImageFsUsage, ImageRuntime, RuntimeError, StoredImage},
};

/// Why a pass could not be made.
#[derive(Debug, thiserror::Error)]
pub enum GcError {
    #[error("failed to {what}: {source}")]
    Runtime { what: &'static str, source: RuntimeError },
    #[error(transparent)]
    Plan(#[from] PlanError),
}

/// What a pass knows while it removes.
struct Pass<'a> {
    dry_run: bool,
    /// The policy the whole pass plans and logs by, read once as it began (a reload may come).
    policy: GcPolicy,
    /// The guard's clock when the pass began: images handed out after it are kept.
    began: u64,
    /// Each listed image's repo tags and digests.
    names: HashMap<&'a str, &'a [String]>,
}

/// The records and when they were loaded.
#[derive(Default)]
struct Records {
    images: HashMap<String, ImageRecord>,
    loaded: bool,
}

/// What the collector works with, each built by the composition root.
pub struct GcParts<R> {
    pub runtime: Arc<R>,
    pub config: GcConfig,
    pub guard: Arc<ImageGuard>,
    pub presence: Arc<PresenceCache>,
    /// The images we pin: kept, and reported pinned in CRI answers.
    pub pinned: Arc<PinnedImages>,
    pub records: Arc<PullRecords>,
    pub ages: AgesFile,
    /// ImageGarbageCollected, FreeDiskSpaceFailed, InvalidDiskCapacity, ImageGCFailed.
    pub events: Arc<Events>,
    pub metrics: Arc<GcMetrics>,
}

/// The kubelet's `ImageGCManager`, with its records kept across restarts.
pub struct ImageGc<R> {
    parts: GcParts<R>,
    /// The configuration now: `parts.config` at start, then what reloads set.
    config: tokio::sync::watch::Sender<GcConfig>,
    last_pass: std::sync::Mutex<Option<LastPass>>,
    /// Held for a whole pass: passes never overlap.
    state: tokio::sync::Mutex<Records>,
    /// Taken by pulls making room, so that those starting together make one pass.
    making_room: tokio::sync::Mutex<()>,
    /// The maximum age, and the minimum age after a restart, count from here, as the kubelet's
    /// from its start (a monotonic clock: a stepped wall clock changes neither).
    collecting_since: Instant,
    /// The records as the last pass left them, for `ListImages` while a pass holds `state`.
    seen: std::sync::Mutex<Option<Arc<HashMap<String, ImageRecord>>>>,
}

impl<R: ImageRuntime> ImageGc<R> {
    pub fn new(parts: GcParts<R>, collecting_since: Instant) -> Self {
        parts.pinned.configure(parts.config.sandbox_image.as_deref(), &parts.config.pinned_images);
        let config = tokio::sync::watch::Sender::new(parts.config.clone());
        let (last_pass, state) = (std::sync::Mutex::default(), tokio::sync::Mutex::default());
        let (making_room, seen) = (tokio::sync::Mutex::new(()), std::sync::Mutex::default());
        Self { parts, config, last_pass, state, making_room, collecting_since, seen }
    }

    /// How and how often images are collected now.
    pub fn config(&self) -> GcConfig {
        self.config.borrow().clone()
    }

    /// The policy images are collected by now.
    pub fn policy(&self) -> GcPolicy {
        self.config.borrow().policy
    }

    /// Collects by `config` from the next pass on, the first one new period from now (a reload);
    /// the same configuration again changes nothing, so reloads never put a pass off.
    pub fn set_config(&self, config: GcConfig) {
        self.pin(|pinned| pinned.configure(config.sandbox_image.as_deref(), &config.pinned_images));
        self.config.send_if_modified(|current| {
            let changed = *current != config;
            *current = config;
            changed
        });
    }

    /// How the last pass (periodic or asked for) went; `None` before the first.
    pub fn last_pass(&self) -> Option<LastPass> {
        self.last_pass.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// One pass: detect, plan, remove (unless a dry run). Removal errors are reported per image
    /// and never stop the pass.
    pub async fn pass(&self, request: PassRequest) -> Result<PassReport, GcError> {
        let started = Instant::now();
        let result = self.pass_inner(request).await;
        let outcome = match &result {
            Ok(report) if pass_failure(report).is_some() => PassOutcome::FreeDiskSpaceFailed,
            Ok(_) => PassOutcome::Success,
            Err(error @ GcError::Plan(PlanError::InvalidDiskCapacity)) => {
                // Events tell what happened to the node: a dry run's findings are only its answer.
                if !request.dry_run {
                    let event = Event::new(EventType::Warning, event_reason::INVALID_DISK_CAPACITY, error.to_string());
                    self.parts.events.publish(event);
                }
                PassOutcome::InvalidDiskCapacity
            }
            Err(GcError::Runtime { .. }) => PassOutcome::RuntimeFailed,
        };
        self.parts.metrics.passed(outcome, started.elapsed());
        let last = LastPass {
            finished: SystemTime::now(),
            request,
            removed: result
                .as_ref()
                .map_or(0, |report| report.images.iter().filter(|image| image.outcome == Outcome::Removed).count()),
            freed: result.as_ref().map_or(0, |report| if request.dry_run { 0 } else { report.freed }),
            failure: match &result {
                Ok(report) => pass_failure(report),
                Err(error) => Some(error.to_string()),
            },
        };
        *self.last_pass.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(last);
        result
    }

    async fn pass_inner(&self, request: PassRequest) -> Result<PassReport, GcError> {
        let mut records = self.state.lock().await;
        if !records.loaded {
            records.images = self.load_ages().await;
            records.loaded = true;
        }
        let (now, collected_for) = (SystemTime::now(), self.collecting_since.elapsed());
        let config = self.config();
        let runtime = &self.parts.runtime;
        let began = self.parts.guard.now();
        let listed = runtime.list_images().await.map_err(|source| GcError::Runtime { what: "list images", source })?;
        let in_use = self.in_use(&listed, &config).await?;
        plan::detect(&mut records.images, &listed, &in_use, now);
        let pass = Pass {
            dry_run: request.dry_run,
            policy: config.policy,
            began,
            names: listed.iter().map(|image| (image.id.as_str(), image.names.as_slice())).collect(),
        };
        let images = &mut records.images;
        let policy = &pass.policy;
        let mut report = PassReport::default();
        // Why the last plan made leaves each image it does not remove.
        let kept = if request.delete_unused {
            report.usage_before = self.measure().await.ok();
            let plan = plan::plan_unused(images, &in_use, policy, now, collected_for);
            self.execute(&plan, &pass, images, &mut report).await;
            plan.kept
        } else if request.dry_run {
            let usage = self.measure().await?;
            report.usage_before = Some(usage);
            let plan = plan::plan(images, &in_use, usage.into(), policy, now, collected_for)?;
            self.execute(&plan, &pass, images, &mut report).await;
            plan.kept
        } else {
            // The age pass first, then the disk as it is after it, as the kubelet does.
            report.usage_before = self.measure().await.ok();
            let aged = plan::plan_age(images, &in_use, policy, now, collected_for);
            let age_plan = Plan { remove: aged.into_iter().map(|id| (id, Reason::Age)).collect(), ..Plan::default() };
            self.execute(&age_plan, &pass, images, &mut report).await;
            let usage = match report.usage_before {
                Some(usage) if report.freed == 0 => usage,
                _ => self.measure().await?,
            };
            let plan = plan::plan_space(images, &in_use, usage.into(), policy, (now, collected_for), &HashSet::new())?;
            self.execute(&plan, &pass, images, &mut report).await;
            plan.kept
        };
        report.kept = kept_images(kept, &pass, images, &report);
        self.save_ages(images).await;
        *self.seen() = Some(Arc::new(images.clone()));
        if !request.dry_run && !report.images.is_empty() {
            report.usage_after = self.measure().await.ok();
        }
        Ok(report)
    }

    /// The image filesystem now, also as metrics.
    async fn measure(&self) -> Result<ImageFsUsage, GcError> {
        let usage = self
            .parts
            .runtime
            .image_fs_usage()
            .await
            .map_err(|source| GcError::Runtime { what: "get imageFs stats", source })?;
        self.parts.metrics.measured(usage, &self.config().policy);
        Ok(usage)
    }

    /// Images in use: by any container (exited ones included), the sandbox image, and those
    /// handed out or pulled lately.
    async fn in_use(&self, listed: &[StoredImage], config: &GcConfig) -> Result<InUse, GcError> {
        let runtime = &self.parts.runtime;
        let containers =
            runtime.container_images().await.map_err(|source| GcError::Runtime { what: "list containers", source })?;
        self.learn_sandbox_image().await;
        let pinned = self.parts.pinned.images_and_why();
        let now = Instant::now();
        let handed_out = self.parts.guard.handed_out_since(now.checked_sub(config.hand_out_window).unwrap_or(now));
        let pinned = pinned.iter().map(|(image, pin)| {
            let why = match pin {
                Pin::SandboxImage => Kept::SandboxImage,
                Pin::Configured => Kept::Pinned,
                Pin::PrePull => Kept::Held,
            };
            (image.as_str(), why)
        });
        let kept = pinned.chain(handed_out.iter().map(|id| (id.as_str(), Kept::Held)));
        Ok(plan::in_use(listed, &containers, kept))
    }

    /// Before a pull starts: when the image filesystem is at or above the high threshold, a pass
    /// now, so that the pull does not push the node towards the kubelet's eviction thresholds.
    /// Pulls starting together make one pass: one that waited for another's goes on.
    pub async fn make_room(&self) {
        let asked = SystemTime::now();
        let policy = self.config().policy;
        if policy.disabled() {
            return;
        }
        let Ok(usage) = self.measure().await else { return };
        if DiskUsage::from(usage).usage_percent() < u64::from(policy.high_threshold_percent) {
            return;
        }
        let _turn = self.making_room.lock().await;
        if self.last_pass().is_some_and(|pass| pass.finished >= asked) {
            return;
        }
        tracing::info!("the image filesystem is over the high threshold: collecting before a pull");
        if let Err(error) = self.pass(PassRequest::default()).await {
            tracing::warn!(%error, "image garbage collection before a pull failed; the pull goes on");
        }
    }

    /// Asks the runtime which sandbox image it uses, unless one is configured.
    pub async fn learn_sandbox_image(&self) {
        if !self.parts.pinned.learns_sandbox_image() {
            return;
        }
        match self.parts.runtime.sandbox_image().await {
            Ok(image) => self.pin(|pinned| pinned.learned_sandbox_image(image)),
            Err(error) => tracing::debug!(%error, "the runtime does not say which sandbox image it uses"),
        }
    }

    /// Changes the pinned images with `change`; answers remembered before a change are forgotten,
    /// as they say pinned what no longer is, or not what now is.
    fn pin(&self, change: impl FnOnce(&PinnedImages) -> bool) {
        if change(&self.parts.pinned) {
            self.parts.presence.image_changed();
        }
    }

    async fn load_ages(&self) -> HashMap<String, ImageRecord> {
        let ages = self.parts.ages.clone();
        match tokio::task::spawn_blocking(move || ages.load()).await {
            Ok(Ok(images)) => images,
            Ok(Err(error)) => {
                tracing::warn!(%error, "image ages not read; every image counts as newly detected");
                HashMap::new()
            }
            Err(error) => {
                tracing::warn!(%error, "reading the image ages stopped");
                HashMap::new()
            }
        }
    }

    async fn save_ages(&self, images: &HashMap<String, ImageRecord>) {
        let (ages, contents) = (self.parts.ages.clone(), AgesFile::encode(images));
        match tokio::task::spawn_blocking(move || ages.write(&contents)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "image ages not kept; a restart would lose them"),
            Err(error) => tracing::warn!(%error, "keeping the image ages stopped"),
        }
    }
}

/// The images `kept` names (by record key, with why), those the pass chose or tried aside.
fn kept_images(
    kept: Vec<(String, Kept)>,
    pass: &Pass<'_>,
    images: &HashMap<String, ImageRecord>,
    report: &PassReport,
) -> Vec<KeptImage> {
    let chosen: HashSet<(&str, &str)> =
        report.images.iter().map(|image| (image.id.as_str(), image.runtime_handler.as_str())).collect();
    kept.into_iter()
        .filter_map(|(key, reason)| {
            let record = images.get(&key)?;
            let id = record_id(&key, record);
            if chosen.contains(&(id, record.runtime_handler.as_str())) {
                return None;
            }
            Some(KeptImage {
                id: id.to_owned(),
                runtime_handler: record.runtime_handler.clone(),
                names: pass.names.get(id).map(|names| names.to_vec()).unwrap_or_default(),
                reason,
                size: record.size,
                first_detected: record.first_detected,
                last_used: record.last_used,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
