//! The collector: one pass lists what the runtime has and uses, brings the records up to date,
//! plans (see [`super::plan`]) and removes; [`ImageGc::run`] makes a pass every period until
//! shutdown, and the `GarbageCollect` RPC asks for one.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::SystemTime,
};

use tokio::time::Instant;

use super::{
    GcConfig,
    ages::AgesFile,
    guard::ImageGuard,
    metrics::{GcMetrics, PassOutcome},
    plan::{self, GcPolicy, ImageRecord, Plan, PlanError, Reason, SpaceTarget},
};
use crate::{
    events::{Event, EventType, Events, reason as event_reason},
    presence::PresenceCache,
    records::PullRecords,
    runtime::{ImageFsUsage, ImageRuntime, RuntimeError, StoredImage},
    shutdown::Shutdown,
};

/// Why a pass could not be made.
#[derive(Debug, thiserror::Error)]
pub enum GcError {
    #[error("failed to {what}: {source}")]
    Runtime { what: &'static str, source: RuntimeError },
    #[error(transparent)]
    Plan(#[from] PlanError),
}

/// What a pass is asked to do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassRequest {
    /// Plan and report, remove nothing.
    pub dry_run: bool,
    /// Every unused image old enough, whatever the disk's usage (the kubelet's
    /// `DeleteUnusedImages`), instead of the thresholds and the maximum age.
    pub delete_unused: bool,
}

/// One image a pass chose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chosen {
    pub id: String,
    /// Its repo tags and digests.
    pub names: Vec<String>,
    pub reason: Reason,
    pub size: u64,
    pub first_detected: SystemTime,
    pub last_used: Option<SystemTime>,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Removed,
    /// A dry run.
    WouldRemove,
    /// Handed out or being pulled since the pass began.
    KeptInUse,
    /// The runtime refused, in its words.
    Failed(String),
}

/// What a pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    pub images: Vec<Chosen>,
    pub usage_before: Option<ImageFsUsage>,
    pub usage_after: Option<ImageFsUsage>,
    /// What a space pass had to free; 0 when usage was below the high threshold.
    pub to_free: u64,
    /// Bytes of the images removed (or, in a dry run, that would be).
    pub freed: u64,
    /// The kubelet's `FreeDiskSpaceFailed` message, when the pass fell short.
    pub shortfall: Option<String>,
}

impl PassReport {
    fn failures(&self) -> Vec<&str> {
        self.images
            .iter()
            .filter_map(|image| match &image.outcome {
                Outcome::Failed(error) => Some(error.as_str()),
                _ => None,
            })
            .collect()
    }
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

/// What the collector works with, each built by [`crate::daemon::Parts::build`].
pub struct GcParts<R> {
    pub runtime: Arc<R>,
    pub config: GcConfig,
    pub guard: Arc<ImageGuard>,
    pub presence: Arc<PresenceCache>,
    pub records: Arc<PullRecords>,
    pub ages: AgesFile,
    /// ImageGarbageCollected, FreeDiskSpaceFailed, InvalidDiskCapacity, ImageGCFailed.
    pub events: Arc<Events>,
    pub metrics: Arc<GcMetrics>,
}

/// Why the periodic passes under one configuration ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wake {
    Reconfigured,
    Stop,
}

/// How the last pass went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastPass {
    pub finished: SystemTime,
    pub request: PassRequest,
    /// The images removed and the bytes they held; 0 in a dry run.
    pub removed: usize,
    pub freed: u64,
    /// Why the pass failed or fell short; `None` when it did not.
    pub failure: Option<String>,
}

/// The kubelet's `ImageGCManager`, with its records kept across restarts.
pub struct ImageGc<R> {
    parts: GcParts<R>,
    /// The configuration now: `parts.config` at start, then what reloads set.
    config: tokio::sync::watch::Sender<GcConfig>,
    last_pass: std::sync::Mutex<Option<LastPass>>,
    /// Held for a whole pass: passes never overlap.
    state: tokio::sync::Mutex<Records>,
    /// The maximum age, and the minimum age after a restart, count from here, as the kubelet's
    /// from its start (a monotonic clock: a stepped wall clock changes neither).
    collecting_since: Instant,
}

impl<R: ImageRuntime> ImageGc<R> {
    pub fn new(parts: GcParts<R>, collecting_since: Instant) -> Self {
        let config = tokio::sync::watch::Sender::new(parts.config.clone());
        let (last_pass, state) = (std::sync::Mutex::default(), tokio::sync::Mutex::default());
        Self { parts, config, last_pass, state, collecting_since }
    }

    /// How and how often images are collected now.
    pub fn config(&self) -> GcConfig {
        self.config.borrow().clone()
    }

    /// Collects by `config` from the next pass on, the first one new period from now (a reload);
    /// the same configuration again changes nothing, so reloads never put a pass off.
    pub fn set_config(&self, config: GcConfig) {
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

    /// Makes a pass every period until `shutdown`, the first at once, as the kubelet does. A new
    /// configuration applies from the next pass, one new period after it came; a pass under way
    /// is never cut short, by a reload or by the shutdown.
    pub async fn run(self: Arc<Self>, shutdown: Shutdown) {
        let mut changes = self.config.subscribe();
        let stopping = shutdown.requested();
        tokio::pin!(stopping);
        let mut first_pass = Instant::now();
        loop {
            let config = changes.borrow_and_update().clone();
            let woken = self.collect_every_period(&config, first_pass, changes.changed(), stopping.as_mut());
            if woken.await == Wake::Stop {
                return;
            }
            first_pass = Instant::now() + self.config().period;
        }
    }

    /// The passes under one configuration, every period from `first_pass`, until the
    /// configuration `changed` or `stopping`; a failure after a failure is logged as an error (the
    /// kubelet's `ImageGCFailed`).
    async fn collect_every_period(
        &self,
        config: &GcConfig,
        first_pass: Instant,
        changed: impl Future<Output = Result<(), tokio::sync::watch::error::RecvError>>,
        mut stopping: std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Wake {
        tokio::pin!(changed);
        let policy = config.policy;
        if policy.disabled() {
            tracing::info!("ImageGCHighThresholdPercent is set 100 and ImageMaximumGCAge is 0, Disable image GC");
        } else {
            tracing::info!(
                high_threshold = policy.high_threshold_percent,
                low_threshold = policy.low_threshold_percent,
                min_age = ?policy.min_age,
                max_age = ?policy.max_age,
                period = ?config.period,
                "image garbage collection every period"
            );
        }
        let mut ticks = tokio::time::interval_at(first_pass, config.period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failed_before = false;
        loop {
            tokio::select! {
                _ = ticks.tick(), if !policy.disabled() => {}
                _ = &mut changed => return Wake::Reconfigured,
                () = &mut stopping => return Wake::Stop,
            }
            let failure = match self.pass(PassRequest::default()).await {
                Ok(report) => pass_failure(&report),
                Err(error) => Some(error.to_string()),
            };
            match &failure {
                Some(error) if failed_before => {
                    self.parts.metrics.failed_again();
                    tracing::error!(%error, "Image garbage collection failed multiple times in a row");
                    let event = Event::new(EventType::Warning, event_reason::IMAGE_GC_FAILED, error.clone());
                    self.parts.events.publish(event);
                }
                Some(error) => {
                    tracing::warn!(%error, "Image garbage collection failed once. Stats initialization may not have completed yet");
                }
                None if failed_before => tracing::info!("Image garbage collection succeeded"),
                None => tracing::debug!("Image garbage collection succeeded"),
            }
            failed_before = failure.is_some();
        }
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
        if request.delete_unused {
            report.usage_before = self.measure().await.ok();
            let plan = plan::plan_unused(images, &in_use, policy, now, collected_for);
            self.execute(&plan, &pass, images, &mut report).await;
        } else if request.dry_run {
            let usage = self.measure().await?;
            report.usage_before = Some(usage);
            let plan = plan::plan(images, &in_use, usage.into(), policy, now, collected_for)?;
            self.execute(&plan, &pass, images, &mut report).await;
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
            if !policy.disabled() {
                let plan =
                    plan::plan_space(images, &in_use, usage.into(), policy, (now, collected_for), &HashSet::new())?;
                self.execute(&plan, &pass, images, &mut report).await;
            }
        }
        self.save_ages(images).await;
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
        self.parts.metrics.measured(usage);
        Ok(usage)
    }

    /// Removes the plan's images in order; for space, goes on to the spares while what was freed
    /// falls short because a removal failed; then says whether the space pass fell short.
    async fn execute(
        &self,
        plan: &Plan,
        pass: &Pass<'_>,
        images: &mut HashMap<String, ImageRecord>,
        report: &mut PassReport,
    ) {
        let policy = pass.policy;
        if let Some(space) = plan.space {
            tracing::info!(
                usage = space.usage_percent,
                high_threshold = policy.high_threshold_percent,
                amount_to_free = space.to_free,
                low_threshold = policy.low_threshold_percent,
                "Disk usage on image filesystem is over the high threshold, trying to free bytes down to the low threshold"
            );
        }
        let to_free = plan.space.map_or(0, |space| space.to_free);
        let mut freed_for_space = 0;
        let spares = plan.spare.iter().map(|id| (id, Reason::Space));
        let chosen = plan.remove.iter().map(|(id, reason)| (id, *reason));
        for (id, reason) in chosen.chain(spares) {
            if reason == Reason::Space && freed_for_space >= to_free {
                continue;
            }
            let Some(record) = images.get(id).cloned() else { continue };
            let names = pass.names.get(id.as_str()).copied().unwrap_or_default();
            let outcome = match pass.dry_run {
                true => Outcome::WouldRemove,
                false => self.remove(id, names, &record, reason, pass).await,
            };
            if outcome == Outcome::Removed {
                images.remove(id);
            }
            if matches!(outcome, Outcome::Removed | Outcome::WouldRemove) {
                report.freed += record.size;
                if reason == Reason::Space {
                    freed_for_space += record.size;
                }
            }
            report.images.push(Chosen {
                id: id.clone(),
                names: names.to_vec(),
                reason,
                size: record.size,
                first_detected: record.first_detected,
                last_used: record.last_used,
                outcome,
            });
        }
        if let Some(space) = plan.space {
            report.to_free = space.to_free;
            if let Some(message) = (SpaceTarget { found: freed_for_space, ..space }).shortfall() {
                tracing::warn!(reason = "FreeDiskSpaceFailed", "{message}");
                if !pass.dry_run {
                    let event = Event::new(EventType::Warning, event_reason::FREE_DISK_SPACE_FAILED, message.clone());
                    self.parts.events.publish(event);
                }
                report.shortfall = Some(message);
            }
        }
    }

    /// Removes one image, unless it was handed out or pulled since the pass began, or is being
    /// pulled.
    async fn remove(
        &self,
        id: &str,
        names: &[String],
        record: &ImageRecord,
        reason: Reason,
        pass: &Pass<'_>,
    ) -> Outcome {
        let Some(claim) = self.parts.guard.claim(id, names, pass.began) else {
            tracing::info!(image_id = id, "image handed out or pulled during the pass; kept");
            return Outcome::KeptInUse;
        };
        match reason {
            Reason::Age => tracing::info!(
                image_id = id,
                size = record.size,
                max_age = ?pass.policy.max_age,
                "Removing image not used for longer than the maximum age"
            ),
            Reason::Space | Reason::Unused => {
                tracing::info!(image_id = id, size = record.size, "Removing image to free bytes")
            }
        }
        let started = SystemTime::now();
        let removed = self.parts.runtime.remove_image(id).await;
        // Whatever the answer, the removal may have changed what is present: forgotten before
        // the claim ends, so no hand-out after it trusts a remembered answer.
        self.parts.presence.image_changed();
        drop(claim);
        match removed {
            Ok(()) => {
                self.parts.metrics.collected(reason, record.size);
                let message = format!("Removed image {id} ({} bytes) for {}", record.size, reason.as_str());
                let event = Event::new(EventType::Normal, event_reason::IMAGE_GARBAGE_COLLECTED, message);
                self.parts.events.publish(Event {
                    image_ref: id.to_owned(),
                    image: names.first().cloned().unwrap_or_default(),
                    ..event
                });
                if let Err(error) = self.parts.records.forget(id, started).await {
                    tracing::warn!(%error, image_id = id, "cannot remove the pull record of a removed image");
                }
                Outcome::Removed
            }
            Err(error) => {
                tracing::warn!(%error, image_id = id, "failed to remove image");
                Outcome::Failed(error.to_string())
            }
        }
    }

    /// Images in use: by any container (exited ones included), the sandbox image, and those
    /// handed out or pulled lately.
    async fn in_use(&self, listed: &[StoredImage], config: &GcConfig) -> Result<HashSet<String>, GcError> {
        let runtime = &self.parts.runtime;
        let containers =
            runtime.container_images().await.map_err(|source| GcError::Runtime { what: "list containers", source })?;
        let sandbox_image = match &config.sandbox_image {
            Some(image) => Some(image.clone()),
            None => runtime.sandbox_image().await.unwrap_or_else(|error| {
                tracing::debug!(%error, "the runtime does not say which sandbox image it uses");
                None
            }),
        };
        let used = containers.iter().map(String::as_str).chain(sandbox_image.as_deref());
        let mut in_use = plan::in_use(listed, used);
        let now = Instant::now();
        in_use.extend(self.parts.guard.handed_out_since(now.checked_sub(config.hand_out_window).unwrap_or(now)));
        Ok(in_use)
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

/// Why a pass counts as failed for the periodic loop: it fell short, or removals failed.
fn pass_failure(report: &PassReport) -> Option<String> {
    if let Some(shortfall) = &report.shortfall {
        return Some(shortfall.clone());
    }
    let failures = report.failures();
    (!failures.is_empty()).then(|| format!("image removals failed: [{}]", failures.join(", ")))
}

#[cfg(test)]
mod tests;
