//! The task that runs pre-pulls: starts what is queued within the cap, holds what each fetches
//! in a containerd lease of its own until it is done, holds back one whose image would fill the
//! image filesystem, keeps deadlines and pins, rechecks declared images, and writes the book down.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime},
};

use crate::cri::ImageSpec;

use super::{PrePull, PrePulls, State, about};
use crate::{
    ensure::{EnsureRequest, PodRef},
    events::{EventType, reason},
    gc::plan::DiskUsage,
    pull::PullClass,
    pull_policy::PullPolicy,
    runtime::{ContentStore, ImageRuntime},
    shutdown::Shutdown,
};

/// The ids of the runtime's leases that keep pre-pulls' downloads start so.
const LEASE_PREFIX: &str = "cri-imaged.pre-pull.";

/// How long containerd keeps what a pre-pull fetched if its lease is never ended (a pre-pull
/// forgotten while the daemon was down).
const LEASE_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// How often a running pre-pull checks that its image still fits.
const ROOM_CHECK: Duration = Duration::from_secs(1);

/// The reason a pre-pull is held.
const DISK_PRESSURE: &str = "DiskPressure";

/// The lease that keeps what pre-pull `id` fetched.
fn lease_of(id: &str) -> String {
    format!("{LEASE_PREFIX}{id}")
}

impl<R: ImageRuntime + ContentStore> PrePulls<R> {
    /// Starts what is queued, within the cap, keeps deadlines and pins, and rechecks declared
    /// images, until `shutdown`.
    pub async fn run(self: Arc<Self>, shutdown: Shutdown) {
        let stopping = shutdown.requested();
        tokio::pin!(stopping);
        self.end_leases_of_ended().await;
        let mut recheck = tokio::time::Instant::now();
        loop {
            let now = SystemTime::now();
            let (expired, next_change) = {
                let mut book = self.book();
                let expired = book.expire(now);
                (expired, book.next_change())
            };
            if expired || self.cancelled.swap(false, Ordering::Relaxed) {
                self.stop_ended();
                self.end_leases_of_ended().await;
            }
            self.pin(now);
            self.start_next();
            if tokio::time::Instant::now() >= recheck {
                // Room may have been made since a pre-pull was held: it tries again.
                if self.book().release_held() {
                    self.start_next();
                }
                self.recheck_declared().await;
                recheck = tokio::time::Instant::now() + self.config().recheck;
            }
            if let Err(error) = self.keep().await {
                tracing::warn!(%error, "pre-pulls not kept; a restart would lose what changed");
            }
            let until_change = next_change.and_then(|at| at.duration_since(SystemTime::now()).ok());
            let wait = until_change
                .unwrap_or(Duration::MAX)
                .min(recheck.saturating_duration_since(tokio::time::Instant::now()));
            tokio::select! {
                () = self.wake.notified() => {}
                () = tokio::time::sleep(wait.min(Duration::from_secs(3600))) => {}
                () = &mut stopping => return,
            }
        }
    }

    /// Starts queued pre-pulls, best first, while fewer than the cap run.
    fn start_next(self: &Arc<Self>) {
        let max_parallel = self.config().max_parallel;
        let next: Vec<PrePull> = {
            let mut book = self.book();
            let ids = book.next(max_parallel);
            ids.iter().for_each(|id| book.started(id));
            ids.iter().filter_map(|id| book.get(id).cloned()).collect()
        };
        // Held while spawning: a pull that ends at once takes itself out after it is put in.
        let mut running = self.running();
        for entry in next {
            let this = self.clone();
            let id = entry.id.clone();
            let task = tokio::spawn(async move { this.pull(entry).await });
            running.insert(id, task.abort_handle());
        }
    }

    /// One pre-pull through the manager, as an IfNotPresent pull of a pod-less caller (in the
    /// pre-pull's namespace, if it names one), what it fetches held by its lease until it is done.
    async fn pull(&self, entry: PrePull) {
        let secrets = self.secrets().get(&entry.id).map(|secrets| secrets.to_vec()).unwrap_or_default();
        let lease = lease_of(&entry.id);
        let keep_in = match self.parts.runtime.create_lease(&lease, SystemTime::now() + LEASE_LIFETIME).await {
            Ok(()) => Some(Arc::from(lease.as_str())),
            Err(error) => {
                tracing::debug!(%error, id = %entry.id, "what the pre-pull fetches is not kept; cut short, it starts over");
                None
            }
        };
        let request = EnsureRequest {
            image: entry.spec.image.clone(),
            pull_policy: Some(PullPolicy::IfNotPresent),
            // Its namespace's image policy, as for that namespace's pods (no pod: never backed off).
            pod: PodRef { namespace: entry.spec.namespace.clone(), ..PodRef::default() },
            runtime_handler: entry.spec.runtime_handler.clone(),
            pull_secrets: secrets,
            class: PullClass::PrePull,
            keep_in,
            ..EnsureRequest::default()
        };
        let kept = AtomicU64::new(0);
        let outcome = tokio::select! {
            outcome = self.parts.manager.ensure_image_exists(request) => outcome,
            message = self.no_room(&entry, &kept) => {
                // Stopped: what it fetched stays in its lease for when there is room.
                tracing::warn!(id = %entry.id, image = %entry.spec.image, "{message}");
                self.parts.events.publish(about(&entry, EventType::Warning, reason::PRE_PULL_HELD, message.clone()));
                self.book().held(&entry.id, DISK_PRESSURE, message);
                self.running().remove(&entry.id);
                self.changed();
                return;
            }
        };
        let state = match outcome {
            Ok(outcome) => {
                if outcome.pull.is_some() {
                    self.parts.metrics.pre_pulled(outcome.image_size);
                    self.parts.metrics.resumed(kept.load(Ordering::Relaxed));
                }
                let message = format!("Pre-pulled {:?}: {}", entry.spec.image, outcome.image_ref);
                self.parts.events.publish(about(&entry, EventType::Normal, reason::PRE_PULLED, message));
                State::Done { image_ref: outcome.image_ref }
            }
            Err(error) => {
                let message = format!("Pre-pull of {:?} failed: {}: {error}", entry.spec.image, error.reason());
                self.parts.events.publish(about(&entry, EventType::Warning, reason::PRE_PULL_FAILED, message));
                State::Failed { reason: error.reason().to_owned(), message: error.to_string() }
            }
        };
        // Done, the image holds its blobs; failed, a pull asked again starts afresh.
        self.end_lease(&entry.id).await;
        self.book().ended(&entry.id, state, SystemTime::now());
        self.running().remove(&entry.id);
        self.secrets().remove(&entry.id);
        self.changed();
    }

    /// Resolves, with why, once the pre-pull's pull would take the image filesystem over image
    /// GC's high threshold: its image's bytes still to fetch (known once its manifest is), twice
    /// (the blobs and their unpacked layers), on top of what is used. Never for a pull a pod
    /// joined: pods' pulls are never held.
    /// Meanwhile, `kept` says what its pull found fetched already, if it went on from there.
    async fn no_room(&self, entry: &PrePull, kept: &AtomicU64) -> String {
        let mut every = tokio::time::interval(ROOM_CHECK);
        loop {
            every.tick().await;
            let in_flight = self.parts.manager.pulls_in_flight();
            let Some(pull) = in_flight.iter().find(|pull| pull.image == entry.spec.image) else { continue };
            let (Some(report), PullClass::PrePull) = (&pull.progress, pull.class) else { continue };
            kept.fetch_max(report.kept, Ordering::Relaxed);
            let to_fetch = report.progress.bytes_total.saturating_sub(report.progress.bytes_done);
            let Ok(usage) = self.parts.runtime.image_fs_usage().await else { continue };
            let high = self.parts.gc.config().policy.high_threshold_percent;
            let used_after = usage.capacity.saturating_sub(usage.available).saturating_add(to_fetch.saturating_mul(2));
            let after = DiskUsage { capacity: usage.capacity, available: usage.capacity.saturating_sub(used_after) };
            if high < 100 && after.usage_percent() >= u64::from(high) {
                return format!(
                    "{DISK_PRESSURE}: pre-pull of {:?} held: {to_fetch} bytes still to fetch would take the image filesystem to {}% of its {} bytes, at or over image GC's high threshold ({high}%)",
                    entry.spec.image,
                    after.usage_percent(),
                    usage.capacity
                );
            }
        }
    }

    /// Ends the lease of pre-pull `id`: what only it held goes at containerd's next collection.
    async fn end_lease(&self, id: &str) {
        if let Err(error) = self.parts.runtime.delete_lease(&lease_of(id)).await {
            tracing::debug!(%error, id, "the pre-pull's lease was not ended; it expires by itself");
        }
    }

    /// Ends the leases of pre-pulls that ended or were forgotten while the daemon was down.
    async fn end_leases_of_ended(&self) {
        let Ok(leases) = self.parts.runtime.leases(LEASE_PREFIX).await else { return };
        for lease in leases {
            let id = lease.trim_start_matches(LEASE_PREFIX);
            let wanted = self.book().get(id).is_some_and(|entry| !entry.state.ended());
            if !wanted {
                self.end_lease(id).await;
            }
        }
    }

    /// Stops the pulls of pre-pulls that ended meanwhile (a deadline).
    fn stop_ended(&self) {
        let ended: Vec<String> = {
            let book = self.book();
            let running = self.running();
            running.keys().filter(|id| book.get(id).is_none_or(|entry| entry.state.ended())).cloned().collect()
        };
        for id in ended {
            self.stop(&id);
        }
    }

    /// Declared pre-pulls that are done and whose image is gone are queued again.
    async fn recheck_declared(&self) {
        let done: Vec<PrePull> = {
            let book = self.book();
            let declared =
                book.entries().filter(|entry| entry.spec.declared && matches!(entry.state, State::Done { .. }));
            declared.cloned().collect()
        };
        for entry in done {
            let spec = ImageSpec {
                image: entry.spec.image.clone(),
                runtime_handler: entry.spec.runtime_handler.clone(),
                ..Default::default()
            };
            if let Ok(None) = self.parts.runtime.image_status(spec).await {
                tracing::info!(id = %entry.id, image = %entry.spec.image, "a declared pre-pull's image is gone; pulling it again");
                self.book().gone(&entry.id, SystemTime::now());
                self.wake.notify_one();
            }
        }
    }
}
