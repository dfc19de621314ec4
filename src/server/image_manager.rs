//! The `imagemanager.v1.ImageManager` service: translates, calls the manager or the collector,
//! translates back. `WatchEvents` is served beside it ([`super::watch`]).

use std::{pin::Pin, sync::Arc, time::SystemTime};

use futures_util::Stream;
use tonic::{Request, Response, Status};

use super::roles::{Recorder, decide_in_handler};
use crate::{
    access::table,
    api::{self, image_manager_server},
    ensure::check::CheckRequest,
    ensure::{self, ClearBackoff, EnsureRequest},
    events::{Events, Filter},
    gc::{ImageGc, Outcome, PassRequest, collector::Chosen, plan::DiskUsage},
    policy::PolicyGate,
    prepull::{Page, PrePulls, Submission},
    presence::PresenceCache,
    pull::{
        PullClass,
        breaker::RegistryStatus,
        path::PullPath,
        ratelimit::{BucketStatus, RateLimitMode, RegistryLimits},
    },
    runtime::{ImageFsUsage, ImageRuntime, probe_image_fs_within},
};

/// The gRPC face of the daemon's parts: the manager, the collector, and what they report for
/// GetStatus.
pub struct ImageManagerService<R> {
    runtime: Arc<R>,
    manager: Arc<ensure::Manager<R>>,
    gc: Arc<ImageGc<R>>,
    presence: Arc<PresenceCache>,
    limits: Arc<RegistryLimits>,
    pulls: Arc<PullPath>,
    policy: Arc<PolicyGate>,
    pre_pulls: Arc<PrePulls<R>>,
    events: Arc<Events>,
    kubelet_warnings: Arc<std::sync::OnceLock<crate::kubelet_guard::Warnings>>,
    last_reload: Arc<super::LastReload>,
    calls: Arc<Recorder>,
}

impl<R> ImageManagerService<R> {
    pub fn new(services: &super::Services<R>, calls: Arc<Recorder>) -> Self {
        Self {
            runtime: services.runtime.clone(),
            manager: services.manager.clone(),
            gc: services.gc.clone(),
            presence: services.presence.clone(),
            limits: services.limits.clone(),
            pulls: services.pulls.clone(),
            policy: services.policy.clone(),
            pre_pulls: services.pre_pulls.clone(),
            events: services.events.clone(),
            kubelet_warnings: services.kubelet_warnings.clone(),
            last_reload: services.last_reload.clone(),
            calls,
        }
    }
}

/// The paths of the methods whose need depends on what they are asked.
const CANCEL_PRE_PULL: &str = "/imagemanager.v1.ImageManager/CancelPrePull";
const GARBAGE_COLLECT: &str = "/imagemanager.v1.ImageManager/GarbageCollect";

/// How long GetStatus waits for the runtime's answer to its probe.
const STATUS_PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

#[tonic::async_trait]
impl<R: ImageRuntime> image_manager_server::ImageManager for ImageManagerService<R> {
    type WatchEventsStream = Pin<Box<dyn Stream<Item = Result<api::Event, Status>> + Send>>;

    /// Never called: [`super::watch::WithWatch`] serves the method, encoding each event once.
    async fn watch_events(
        &self,
        _: Request<api::WatchEventsRequest>,
    ) -> Result<Response<Self::WatchEventsStream>, Status> {
        Err(super::status::watch_served_elsewhere())
    }

    async fn ensure_image_exists(
        &self,
        request: Request<api::EnsureImageExistsRequest>,
    ) -> Result<Response<api::EnsureImageExistsResponse>, Status> {
        let peer = super::request::peer(&request);
        let request = EnsureRequest { peer, ..EnsureRequest::try_from(request.into_inner())? };
        let outcome = self.manager.ensure_image_exists(request).await?;
        let pull_duration = outcome.pull.and_then(|times| prost_types::Duration::try_from(times.total).ok());
        Ok(Response::new(api::EnsureImageExistsResponse {
            image_ref: outcome.image_ref,
            message: outcome.message,
            pulled: outcome.pull.is_some(),
            pull_duration,
            image_size_bytes: outcome.image_size,
        }))
    }

    async fn get_status(
        &self,
        request: Request<api::GetStatusRequest>,
    ) -> Result<Response<api::GetStatusResponse>, Status> {
        let api::GetStatusRequest { pod_uid, image, runtime_handler } = request.into_inner();
        let probe = probe_image_fs_within(&*self.runtime, STATUS_PROBE_TIMEOUT).await;
        let (image_fs, runtime_error) = match probe {
            Ok(usage) => (usage.map(image_fs_usage), String::new()),
            Err(error) => (None, error.to_string()),
        };
        let timestamp = |time: SystemTime| Some(prost_types::Timestamp::from(time));
        let in_flight = self.manager.pulls_in_flight();
        let (first, _) = self.pre_pulls.page(None, super::pre_pulls::IN_STATUS);
        let pre_pulls = super::pre_pulls::wire_all(first, &in_flight);
        let pre_pull_counts = super::pre_pulls::wire_counts(self.pre_pulls.count_by_state());
        let pulls = in_flight
            .into_iter()
            .map(|pull| api::PullInFlight {
                image: pull.image,
                callers: u32::try_from(pull.callers).unwrap_or(u32::MAX),
                asked: timestamp(pull.asked_at),
                started: pull.started_at.and_then(timestamp),
                progress: pull.progress.map(|report| super::watch::wire_progress(&report.facts())),
                state: pull.state.as_str().to_owned(),
                pre_pull: pull.class == PullClass::PrePull,
            })
            .collect();
        let (pulls_queued, pre_pulls_queued) = self.pulls.scheduler().queued();
        let (backoff_entries, backing_off) = self.manager.backoff_status(&pod_uid, &image, &runtime_handler);
        let backoff = (!pod_uid.is_empty() && !image.is_empty()).then(|| match backing_off {
            Some((remaining, last_error)) => api::BackoffStatus {
                backing_off: true,
                retry_after: prost_types::Duration::try_from(remaining).ok(),
                last_error,
            },
            None => api::BackoffStatus::default(),
        });
        let policy = self.gc.policy();
        let last_gc_pass = self.gc.last_pass().map(|pass| api::GcPassStatus {
            finished: timestamp(pass.finished),
            dry_run: pass.request.dry_run,
            delete_unused: pass.request.delete_unused,
            images_removed: u32::try_from(pass.removed).unwrap_or(u32::MAX),
            bytes_freed: pass.freed,
            failure: pass.failure.unwrap_or_default(),
        });
        let kubelet_warnings = self.kubelet_warnings.get().cloned().unwrap_or_default();
        Ok(Response::new(api::GetStatusResponse {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            runtime_reachable: runtime_error.is_empty(),
            runtime_error,
            pulls,
            backoff_entries: backoff_entries as u64,
            backoff,
            presence_cache_watching: self.presence.is_watching(),
            presence_cache_entries: self.presence.len() as u64,
            presence_cache_signal: self.presence.signal().to_string(),
            last_gc_pass,
            rate_limit_mode: match self.limits.mode() {
                RateLimitMode::Fail => "fail",
                RateLimitMode::Wait => "wait",
            }
            .to_owned(),
            rate_limits: self.limits.buckets().into_iter().map(rate_limit_bucket).collect(),
            kubelet_image_service_warning: kubelet_warnings.unactivated.clone().unwrap_or_default(),
            kubelet_serial_image_pulls_warning: kubelet_warnings.serial_pulls.clone().unwrap_or_default(),
            reload_refused: self
                .last_reload
                .refusal()
                .map(|refusal| api::ReloadRefusal { at: timestamp(refusal.at), reason: refusal.reason }),
            registries: self.pulls.scheduler().breakers().status().into_iter().map(registry_health).collect(),
            pre_pulls,
            pulls_queued: u32::try_from(pulls_queued).unwrap_or(u32::MAX),
            image_fs,
            gc_high_threshold_percent: u32::from(policy.high_threshold_percent),
            gc_low_threshold_percent: u32::from(policy.low_threshold_percent),
            pre_pulls_queued: u32::try_from(pre_pulls_queued).unwrap_or(u32::MAX),
            pre_pull_counts: Some(pre_pull_counts),
            image_policy: super::policy_views::image_policy_status(
                &self.policy.in_force(),
                self.pulls.signed().signatures(),
            ),
        }))
    }

    async fn submit_pre_pull(
        &self,
        request: Request<api::SubmitPrePullRequest>,
    ) -> Result<Response<api::SubmitPrePullResponse>, Status> {
        let owner = super::request::peer(&request).map(|peer| peer.uid);
        let submission = Submission { owner, ..Submission::try_from(request.into_inner())? };
        let submitted = self.pre_pulls.submit(submission).await?;
        let pre_pulls = super::pre_pulls::wire_all(submitted, &self.manager.pulls_in_flight());
        Ok(Response::new(api::SubmitPrePullResponse { pre_pulls }))
    }

    async fn list_pre_pulls(
        &self,
        request: Request<api::ListPrePullsRequest>,
    ) -> Result<Response<api::ListPrePullsResponse>, Status> {
        let page = Page::try_from(request.into_inner())?;
        let (listed, next) = self.pre_pulls.page(page.after.as_ref(), page.size);
        let pre_pulls = super::pre_pulls::wire_all(listed, &self.manager.pulls_in_flight());
        let next_page_token = next.map(|cursor| cursor.to_string()).unwrap_or_default();
        Ok(Response::new(api::ListPrePullsResponse { pre_pulls, next_page_token }))
    }

    async fn get_pre_pull(&self, request: Request<api::GetPrePullRequest>) -> Result<Response<api::PrePull>, Status> {
        let pre_pull = self.pre_pulls.get(&request.into_inner().id)?;
        Ok(Response::new(super::pre_pulls::wire(pre_pull, &self.manager.pulls_in_flight())))
    }

    async fn cancel_pre_pull(
        &self,
        request: Request<api::CancelPrePullRequest>,
    ) -> Result<Response<api::PrePull>, Status> {
        let caller = super::request::peer(&request).map(|peer| peer.uid);
        let id = &request.get_ref().id;
        let cancelled = self
            .pre_pulls
            .cancel(id, |owner| {
                decide_in_handler(&request, CANCEL_PRE_PULL, table::cancel_needs(owner, caller), &self.calls)
            })
            .await??;
        Ok(Response::new(super::pre_pulls::wire(cancelled, &[])))
    }

    async fn list_images(
        &self,
        _: Request<api::ListImagesRequest>,
    ) -> Result<Response<api::ListImagesResponse>, Status> {
        let images = self.gc.images().await?;
        let signatures = self.pulls.signed().signatures();
        let images = images
            .into_iter()
            .map(super::views::node_image)
            .map(|image| api::NodeImage {
                verifications: super::policy_views::verifications(signatures, &image.repo_digests),
                ..image
            })
            .collect();
        Ok(Response::new(api::ListImagesResponse { images }))
    }

    async fn check_image_policy(
        &self,
        request: Request<api::CheckImagePolicyRequest>,
    ) -> Result<Response<api::CheckImagePolicyResponse>, Status> {
        let check = self.manager.check_policy(CheckRequest::from(request.into_inner())).await?;
        Ok(Response::new(super::policy_views::check_response(check)))
    }

    async fn list_events(
        &self,
        request: Request<api::ListEventsRequest>,
    ) -> Result<Response<api::ListEventsResponse>, Status> {
        let api::ListEventsRequest { filter, limit } = request.into_inner();
        let api::WatchEventsRequest { pod_uid, namespace, image } = filter.unwrap_or_default();
        let matcher = Filter { pod_uid, namespace, image }.prepare();
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let events = self.events.recent(&matcher, limit);
        let events = events.iter().map(|event| super::watch::wire_event(event, 0)).collect();
        Ok(Response::new(api::ListEventsResponse { events }))
    }

    async fn list_backoffs(
        &self,
        _: Request<api::ListBackoffsRequest>,
    ) -> Result<Response<api::ListBackoffsResponse>, Status> {
        let backoffs = self.manager.backoffs();
        Ok(Response::new(api::ListBackoffsResponse {
            entries: backoffs.backing_off.into_iter().map(super::views::backoff_entry).collect(),
            total: backoffs.total as u64,
        }))
    }

    async fn clear_backoff(
        &self,
        request: Request<api::ClearBackoffRequest>,
    ) -> Result<Response<api::ClearBackoffResponse>, Status> {
        let what = ClearBackoff::try_from(request.into_inner())?;
        let cleared = self.manager.clear_backoff(what);
        Ok(Response::new(api::ClearBackoffResponse { cleared: cleared as u64 }))
    }

    async fn garbage_collect(
        &self,
        request: Request<api::GarbageCollectRequest>,
    ) -> Result<Response<api::GarbageCollectResponse>, Status> {
        decide_in_handler(&request, GARBAGE_COLLECT, table::gc_needs(request.get_ref().dry_run), &self.calls)?;
        let api::GarbageCollectRequest { dry_run, delete_unused } = request.into_inner();
        // In a task of its own: a caller that goes away does not cut a pass between a removal and
        // what follows it (the presence cache, the pull record, the ages).
        let gc = self.gc.clone();
        let pass = tokio::spawn(async move { gc.pass(PassRequest { dry_run, delete_unused }).await });
        let report = pass.await.map_err(|error| super::status::gc_pass_stopped(&error))??;
        Ok(Response::new(api::GarbageCollectResponse {
            images: report.images.into_iter().map(collected_image).collect(),
            usage_before: report.usage_before.map(image_fs_usage),
            usage_after: report.usage_after.map(image_fs_usage),
            bytes_to_free: report.to_free,
            freed_bytes: report.freed,
            shortfall: report.shortfall.unwrap_or_default(),
            kept: report.kept.into_iter().map(super::views::kept_image).collect(),
        }))
    }
}

fn collected_image(image: Chosen) -> api::CollectedImage {
    let timestamp = |time: SystemTime| prost_types::Timestamp::from(time);
    let (removed, error) = match image.outcome {
        Outcome::Removed => (true, String::new()),
        Outcome::WouldRemove => (false, String::new()),
        Outcome::KeptInUse => (false, "kept: handed out or pulled during the pass".to_owned()),
        Outcome::Failed(error) => (false, error),
    };
    api::CollectedImage {
        image_id: image.id,
        names: image.names,
        reason: image.reason.as_str().to_owned(),
        size_bytes: image.size,
        first_detected: Some(timestamp(image.first_detected)),
        last_used: image.last_used.map(timestamp),
        removed,
        error,
        runtime_handler: image.runtime_handler,
    }
}

fn rate_limit_bucket(bucket: BucketStatus) -> api::RateLimitBucket {
    api::RateLimitBucket {
        host: bucket.host.unwrap_or_default(),
        qps: bucket.limit.qps,
        burst: bucket.limit.burst.get(),
        tokens: bucket.tokens,
        lowered_from_qps: bucket.lowered_from.map_or(0.0, |limit| limit.qps),
    }
}

fn registry_health(registry: RegistryStatus) -> api::RegistryHealth {
    api::RegistryHealth {
        host: registry.host,
        breaker: registry.breaker.to_owned(),
        failures: registry.failures,
        last_failure: registry.last_failure.unwrap_or_default(),
        open_until: registry.open_until.map(prost_types::Timestamp::from),
        unanswered: registry.unanswered,
    }
}

fn image_fs_usage(usage: ImageFsUsage) -> api::ImageFsUsage {
    let usage_percent = DiskUsage::from(usage).usage_percent();
    api::ImageFsUsage {
        capacity_bytes: usage.capacity,
        available_bytes: usage.available,
        usage_percent: u32::try_from(usage_percent).unwrap_or(100),
    }
}
