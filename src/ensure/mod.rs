//! EnsureImageExists: the kubelet's image manager, step by step, over an [`ImageRuntime`]:
//! default tag, presence, decide (and verify a present image), back off, find credentials, pull
//! through the pull path, answer.
//!
//! - [`config`]: how the manager pulls and verifies.
//! - [`request`]: the request as the manager reads it, and its answer.
//! - [`error`]: the failures, each one of the kubelet's reasons.
//! - `verify`: whether a pod may use a present image (KEP-2535).
//! - [`check`]: the image policy's decision on an image, explained, without pulling.
//! - `outcome`: the event for a request's outcome.
//! - [`backoffs`]: the pods' back-offs, listed and cleared.
//! - [`metrics`]: the requests' metrics.

use std::{
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use crate::cri::ImageSpec;
use tokio::time::Instant;

mod admit;
pub mod backoffs;
pub mod check;
pub mod config;
pub mod error;
pub mod metrics;
mod outcome;
pub mod request;
mod verify;

pub use self::{
    backoffs::{Backoffs, ClearBackoff},
    config::{ManagerConfig, VerificationConfig},
    error::{EnsureError, classify_pull_error},
    request::{EnsureOutcome, EnsureRequest, PodRef, PullTimes},
};
use self::{
    error::never_pull,
    metrics::{EnsureMetrics, RequestCount},
    outcome::outcome_event,
    request::{subject_of, with_default_tag},
};
use crate::{
    backoff::{BackoffConfig, BackoffName, BackoffStore},
    credentials::{NodeCredentials, secrets::PreparedSecrets},
    events::{Events, Subject},
    gc::ImageGuard,
    messages,
    policy::PolicyGate,
    presence::PresenceCache,
    pull::{
        Peer, Pull, PullError, Pulled,
        path::{PodPull, PullPath},
        scheduler::InFlight,
        signed,
    },
    pull_policy::{self, Decision, PullPolicy},
    records::PullRecords,
    runtime::{ImageRuntime, PresentImage, PullSpec},
};

/// The kubelet's image manager: decides, backs off, and pulls through the pull path.
pub struct Manager<R> {
    runtime: Arc<R>,
    pulls: Arc<PullPath>,
    /// Remembers the failed pull's error itself, shared by every pod that joined the pull.
    backoff: Mutex<BackoffStore<Arc<PullError>>>,
    presence: Arc<PresenceCache>,
    /// The node's docker config and credential plugins, used after the pod's secrets.
    node_credentials: Arc<NodeCredentials>,
    /// Pods' pull secrets as read before: each read once while its content is the same.
    prepared_secrets: PreparedSecrets,
    /// Read to verify a pod's right to a present image; the pull path writes them.
    records: Arc<PullRecords>,
    /// Keeps each image handed out, so that the collector keeps it.
    guard: Arc<ImageGuard>,
    /// Where each request's events go (the kubelet records them on the pod).
    events: Arc<Events>,
    verification: VerificationConfig,
    /// The node's image policy: which images may enter, for whom.
    policy: Arc<PolicyGate>,
    metrics: Arc<EnsureMetrics>,
}

/// What a [`Manager`] is built from, each part built by the composition root.
pub struct ManagerParts<R> {
    pub runtime: Arc<R>,
    pub pulls: Arc<PullPath>,
    pub backoff: BackoffStore<Arc<PullError>>,
    pub presence: Arc<PresenceCache>,
    pub node_credentials: Arc<NodeCredentials>,
    pub records: Arc<PullRecords>,
    pub guard: Arc<ImageGuard>,
    pub events: Arc<Events>,
    pub verification: VerificationConfig,
    pub policy: Arc<PolicyGate>,
    pub metrics: Arc<EnsureMetrics>,
}

impl<R: ImageRuntime> Manager<R> {
    pub fn new(parts: ManagerParts<R>) -> Self {
        let ManagerParts {
            runtime,
            pulls,
            backoff,
            presence,
            node_credentials,
            records,
            guard,
            events,
            verification,
            policy,
            metrics,
        } = parts;
        let backoff = Mutex::new(backoff);
        Self {
            runtime,
            pulls,
            backoff,
            presence,
            node_credentials,
            prepared_secrets: PreparedSecrets::default(),
            records,
            guard,
            events,
            verification,
            policy,
            metrics,
        }
    }

    fn backoff(&self) -> MutexGuard<'_, BackoffStore<Arc<PullError>>> {
        self.backoff.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The pulls under way or queued now.
    pub fn pulls_in_flight(&self) -> Vec<InFlight> {
        self.pulls.scheduler().in_flight()
    }

    /// Backs off by `config` from the next failure on (a reload).
    pub fn set_backoff(&self, config: BackoffConfig) {
        self.backoff().set_config(config);
    }

    /// How many (pod, image, handler) entries the backoff store holds, and whether `pod_uid`'s
    /// pulls of `image` for `runtime_handler` are backing off now (time left, the last error).
    pub fn backoff_status(
        &self,
        pod_uid: &str,
        image: &str,
        runtime_handler: &str,
    ) -> (usize, Option<(Duration, String)>) {
        let backoff = self.backoff();
        let key = backoff.key(pod_uid, image, runtime_handler);
        let backing_off = backoff.check(key, Instant::now());
        (backoff.len(), backing_off.map(|entry| (entry.remaining, entry.last_error.to_string())))
    }

    /// Makes sure `request.image` is on the node, as the kubelet's `EnsureImageExists` does.
    #[tracing::instrument(
        name = "ensure_image_exists",
        skip_all,
        fields(
            image = %messages::echo(&request.image),
            pod = %messages::echo(&format!("{}/{}", request.pod.namespace, request.pod.name)),
            container = %messages::echo(&request.container_name),
        )
    )]
    pub async fn ensure_image_exists(&self, request: EnsureRequest) -> Result<EnsureOutcome, EnsureError> {
        let about = subject_of(&request);
        let mut count = self.metrics.request();
        count.policy = request.pull_policy;
        let result = self.ensure(request, &about, &mut count).await;
        drop(count);
        // Every container start's answer, an image already present, goes to watchers only (and is
        // not even made without any: this is the hot path); the rest is kept for ListEvents.
        let present = matches!(&result, Ok(outcome) if outcome.pull.is_none());
        if present && !self.events.watched() {
            return result;
        }
        match outcome_event(&about, &result) {
            Some(event) if present => self.events.publish_unkept(event),
            Some(event) => self.events.publish(event),
            None => {}
        }
        result
    }

    async fn ensure(
        &self,
        request: EnsureRequest,
        about: &Subject,
        count: &mut RequestCount<'_>,
    ) -> Result<EnsureOutcome, EnsureError> {
        let image = &request.image;
        let (reference, spec) = with_default_tag(&request)?;
        // The node's image policy, before anything else: an image it refuses is refused present
        // or not, as a failed pull (backed off, evented), and never reaches the runtime.
        let pending = match self.admit(&request, &reference) {
            Ok(pending) => pending,
            Err(refusal) => return Err(self.refused(&request, PullError::PolicyRejected(refusal.message))),
        };
        let policy = request.pull_policy.unwrap_or_else(|| PullPolicy::default_for(&reference));
        count.policy = Some(policy);
        // A hand-out the collector's removal of the image overlapped fails: the image is absent.
        let hand_out = self.guard.handing_out();
        let checked_at = Instant::now();
        let present = self.image_status(image, &spec).await?;
        // The kubelet does not look under Always (we do: a pull we merge with may have just ended).
        count.present = (policy != PullPolicy::Always).then_some(present.is_some());
        // The kubelet's keyring lookup and records are by the normalised repository, without tag
        // or digest.
        let repository = reference.name();
        let present_digest =
            present.as_ref().and_then(|found| signed::present_digest(found, &reference)).map(str::to_owned);
        if let Some(outcome) = self.decide(&request, &repository, (policy, present), count).await? {
            // The present image runs: its own digest is what the policy's signatures must cover.
            // Kept: if image GC takes the image meanwhile, the pull below verifies its own digest.
            if let Some(pending) = &pending {
                self.verify_present(&request, (&reference, present_digest), pending.clone(), about).await?;
            }
            if hand_out.complete(&outcome.image_ref, Instant::now()) {
                return Ok(outcome);
            }
            tracing::info!(image_ref = %outcome.image_ref, "the present image was being removed by image GC; it is absent");
            // Absent, the decision is a pull or, under Never, the absent image's refusal (the
            // request is counted as decided the first time).
            if pull_policy::decide(policy, false) != Decision::Pull {
                return Err(never_pull(image));
            }
        }
        drop(hand_out);
        let backs_off = self.check_backoff(&request.pod.uid, image, &request.runtime_handler)?;
        let credentials = self.credentials(&request, &repository).await?;
        // The tag resolved once, its digest's signatures verified; the pull is bound to it below.
        let verified = match pending {
            Some(pending) => {
                let verified = self.pulls.signed().verify(&reference, pending, None, &credentials, about).await;
                verified.map_err(|refused| self.refused(&request, refused))?
            }
            None => None,
        };
        let peer = Peer::shown(request.peer);
        tracing::info!(policy = policy.as_str(), credentials = credentials.len(), %peer, "{}", messages::pulling(image));
        let started = Instant::now();
        let spec = PullSpec { image: spec, sandbox_config: request.sandbox_config.clone(), ..Default::default() };
        let pull = Pull {
            spec,
            reference: Some(Arc::new(reference.clone())),
            // Not under Always: the same pull that ended since the presence check serves it.
            absent_since: (policy != PullPolicy::Always).then_some(checked_at),
            caller: about.pod.clone(),
            class: request.class,
            keep_in: request.keep_in.clone(),
            ..Default::default()
        };
        let order = PodPull { image: image.clone(), repository, pull, credentials, about: about.clone(), started };
        let scheduled = self.pulls.pull_for_pod(order).await.map_err(|source| {
            let message = format!("Failed to record image pull intent for container image {image:?}: {source}");
            tracing::warn!("{message}");
            EnsureError::RecordIntent { message, source }
        })?;
        let bound = match (&scheduled.result, &verified) {
            (Ok(pulled), Some(verified)) => {
                let signed = self.pulls.signed();
                let bound = signed.bind(pulled, &reference, verified, &request.runtime_handler).await;
                if bound.is_ok() {
                    signed.announce(&reference, verified, about);
                }
                bound.map_err(Arc::new)
            }
            _ => Ok(()),
        };
        match scheduled.result.and_then(|pulled| bound.map(|()| pulled)) {
            Ok(pulled) => Ok(self.record_pulled(image, pulled, started, scheduled.joined)),
            Err(error) => {
                let pair = backs_off.then(|| backoff_name(&request));
                Err(self.record_failed(image, error, pair))
            }
        }
    }

    /// Decides from presence, policy and the pod's right to the present image: the answer when
    /// the present image is used or the policy forbids a pull, `None` when a pull is needed.
    async fn decide(
        &self,
        request: &EnsureRequest,
        repository: &str,
        (policy, present): (PullPolicy, Option<PresentImage>),
        count: &mut RequestCount<'_>,
    ) -> Result<Option<EnsureOutcome>, EnsureError> {
        let image = &request.image;
        let decision = pull_policy::decide(policy, present.is_some());
        let never_pull = || never_pull(image);
        match (decision, present) {
            (Decision::UsePresent, Some(found)) => {
                let may_use = self.may_use_present(request, repository, &found.id).await?;
                count.pull_required = Some(!may_use);
                if !may_use {
                    // Under Never, the pod learns no more than if the image were absent.
                    return if policy == PullPolicy::Never { Err(never_pull()) } else { Ok(None) };
                }
                let message = messages::already_present(image);
                // The kubelet records this as an event, not a log line; the caller gets it in the
                // answer. At info it would be a line per container start.
                tracing::debug!(policy = policy.as_str(), image_ref = %found.id, "{message}");
                Ok(Some(EnsureOutcome { image_ref: found.id, message, pull: None, image_size: found.size }))
            }
            (decision, _) => {
                count.pull_required = (decision == Decision::Pull).then_some(true);
                match decision {
                    Decision::Pull => Ok(None),
                    Decision::RefuseNeverPull | Decision::UsePresent => Err(never_pull()),
                }
            }
        }
    }

    /// Refuses a pull while the pod's last pull of the image is backing off; otherwise whether
    /// the pull's failure backs off. Backoff is per pod (and runtime handler), as in the kubelet:
    /// a caller without a pod uid (an agent pre-pulling) gets none, since one shared key would
    /// let one agent's failure refuse another's pulls. The image is as the pod wrote it.
    fn check_backoff(&self, pod_uid: &str, image: &str, handler: &str) -> Result<bool, EnsureError> {
        if pod_uid.is_empty() {
            return Ok(false);
        }
        let backoff = self.backoff();
        let key = backoff.key(pod_uid, image, handler);
        let Some(backing_off) = backoff.check(key, Instant::now()) else { return Ok(true) };
        drop(backoff);
        // As kubelets from 1.32 say it: the last failure's reason and message.
        let last = classify_pull_error(image, backing_off.last_error.clone());
        let message = messages::back_off(image, format_args!("{}: {last}", last.reason()));
        tracing::info!(retry_after = ?backing_off.remaining, "{message}");
        self.metrics.backoff_refused();
        Err(EnsureError::BackOff { message, retry_after: backing_off.remaining })
    }

    /// A pull succeeded: the kubelet's message, the metrics, and stale backoff entries gone.
    fn record_pulled(&self, image: &str, pulled: Pulled, started: Instant, joined: bool) -> EnsureOutcome {
        let times = PullTimes { pull: pulled.pull_duration, total: started.elapsed() };
        let message = messages::pulled(image, times.pull, times.total, pulled.image_size);
        tracing::info!(image_ref = %pulled.image_ref, image_size = pulled.image_size, joined, "{message}");
        self.metrics.pulled_for_request(times.total, pulled.image_size);
        let mut backoff = self.backoff();
        backoff.gc(Instant::now());
        self.metrics.backoff_size(backoff.len());
        EnsureOutcome { image_ref: pulled.image_ref, message, pull: Some(times), image_size: pulled.image_size }
    }

    /// A pull failed: logged, backed off for the pod (`pair`), and classified as the kubelet does.
    fn record_failed(&self, image: &str, error: Arc<PullError>, pair: Option<BackoffName>) -> EnsureError {
        tracing::warn!("{}", messages::pull_failed(image, &error.kubelet_message()));
        if let Some(pair) = pair {
            self.back_off(pair, error.clone());
        }
        classify_pull_error(image, error)
    }
}

/// The backoff store's name for the request's pod and image.
fn backoff_name(request: &EnsureRequest) -> BackoffName {
    BackoffName {
        namespace: request.pod.namespace.clone(),
        name: request.pod.name.clone(),
        uid: request.pod.uid.clone(),
        image: request.image.clone(),
        runtime_handler: request.runtime_handler.clone(),
    }
}

impl<R: ImageRuntime> Manager<R> {
    /// The runtime's ImageStatus, answered from the presence cache when it can be.
    async fn image_status(&self, image: &str, spec: &ImageSpec) -> Result<Option<PresentImage>, EnsureError> {
        if let Some(found) = self.presence.recall_image(spec, Instant::now()).await {
            return Ok(Some(found));
        }
        let ticket = self.presence.ticket();
        let present = self.runtime.image_status(spec.clone()).await.map_err(|source| {
            let message = messages::inspect_failed(image, &source);
            tracing::warn!("{message}");
            EnsureError::ImageInspect { message, source }
        })?;
        if let (Some(ticket), Some(found)) = (ticket, &present) {
            self.presence.remember(ticket, spec, found.clone());
        }
        Ok(present)
    }
}

#[cfg(test)]
mod tests;
