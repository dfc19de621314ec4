//! EnsureImageExists: the kubelet's image manager, step by step, over an [`ImageRuntime`].

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use k8s_cri::v1::{ImageSpec, PodSandboxConfig};
use tokio::time::Instant;
use tracing::Instrument;

pub mod metrics;

use self::metrics::EnsureMetrics;
use crate::{
    backoff::{BackoffConfig, BackoffKey, BackoffStore},
    credentials::{
        self, Credential, CredentialSource, NodeCredentials, RegistryAuth, SecretCoordinates,
        secrets::{self, PullSecret, SecretError},
    },
    events::{Event, EventType, Events, Pod, PullFacts, reason as event_reason},
    gc::ImageGuard,
    messages::{self, reason},
    policy::{self, Decision, PullPolicy},
    presence::{Lookup, PresenceCache},
    pull::poller::ProgressConfig,
    pull::ratelimit::RateLimitConfig,
    pull::scheduler::{InFlight, PullScheduler, Scheduled, SchedulerConfig},
    pull::{PullError, Pulled},
    records::{
        PullRecords, RecordTo, RecordsError, check,
        format::{PullCredentials, SecretRecord},
        metrics::CheckResult,
        policy::{self as verification, Allowlist, VerificationPolicy},
    },
    reference::{self, ImageReference, ReferenceError},
    runtime::{ImageRuntime, PresentImage, PullSpec, RuntimeError},
};

/// How the manager pulls; [`ManagerConfig::default`] is the kubelet's behaviour.
#[derive(Debug, Clone, PartialEq)]
pub struct ManagerConfig {
    pub scheduler: SchedulerConfig,
    pub backoff: BackoffConfig,
    pub rate_limits: RateLimitConfig,
    /// How long ago the presence cache may last have been proven current for a hit to be
    /// trusted; zero proves every hit (see [`crate::presence`]).
    pub presence_max_staleness: Duration,
    /// Which present images a pod must have the credentials for (KEP-2535).
    pub verification: VerificationConfig,
    /// How pulls under way are watched; `None` reports only their start and end.
    pub progress: Option<ProgressConfig>,
}

/// The kubelet's `imagePullCredentialsVerificationPolicy` and its allowlist.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerificationConfig {
    pub policy: VerificationPolicy,
    pub allowlist: Allowlist,
}

impl Default for ManagerConfig {
    /// Serial pulls, no pull timeout, 10s-to-300s backoff, 5 pulls a second in bursts of 10;
    /// and, not the kubelet's, pull progress watched with a 5m stall timeout.
    fn default() -> Self {
        let serial = std::num::NonZeroUsize::MIN;
        Self {
            scheduler: SchedulerConfig { max_parallel: Some(serial), pull_timeout: None },
            backoff: BackoffConfig::KUBELET,
            rate_limits: RateLimitConfig::kubelet(),
            presence_max_staleness: crate::presence::DEFAULT_MAX_STALENESS,
            verification: VerificationConfig::default(),
            progress: Some(ProgressConfig::default()),
        }
    }
}

/// The pod an image is for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Passed to the runtime in the image spec.
    pub annotations: HashMap<String, String>,
}

/// The process that called, as the kernel told when it connected (SO_PEERCRED): logged with
/// each pull it asks for, for audit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    /// `None` when the caller is in another PID namespace.
    pub pid: Option<i32>,
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "uid={} gid={}", self.uid, self.gid)?;
        match self.pid {
            Some(pid) => write!(f, " pid={pid}"),
            None => write!(f, " pid=unknown"),
        }
    }
}

/// How a log line shows the caller of a pull.
fn shown_peer(peer: Option<Peer>) -> String {
    peer.map_or_else(|| "unknown".to_owned(), |peer| peer.to_string())
}

/// One EnsureImageExists request, already translated from the wire.
#[derive(Debug, Clone, Default)]
pub struct EnsureRequest {
    /// The image as written in the pod spec.
    pub image: String,
    /// `None` when the caller left the policy unspecified.
    pub pull_policy: Option<PullPolicy>,
    pub pod: PodRef,
    pub container_name: String,
    pub runtime_handler: String,
    pub sandbox_config: Option<PodSandboxConfig>,
    /// The pod's image pull secrets, read only when a pull is needed (as the kubelet does).
    pub pull_secrets: Vec<PullSecret>,
    /// Who called: not on the wire, from the connection.
    pub peer: Option<Peer>,
}

/// A successful answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnsureOutcome {
    /// The runtime's image ref.
    pub image_ref: String,
    /// The kubelet's event message.
    pub message: String,
    /// Set when this request pulled the image.
    pub pull: Option<PullTimes>,
    /// The image size the runtime reports; 0 when unknown.
    pub image_size: u64,
}

/// How long a pull took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PullTimes {
    /// The upstream PullImage call alone.
    pub pull: Duration,
    /// From the decision to pull until the result, waiting included.
    pub total: Duration,
}

/// Why EnsureImageExists failed; each variant is one of the kubelet's reasons.
#[derive(Debug, thiserror::Error)]
pub enum EnsureError {
    #[error("{message}")]
    InvalidImageName { message: String, source: ReferenceError },
    #[error("{message}")]
    ImageInspect { message: String, source: RuntimeError },
    #[error("{message}")]
    NeverPull { message: String },
    /// A pull secret that cannot be read; nothing was pulled.
    #[error("{source}")]
    InvalidPullSecret { source: SecretError },
    #[error("{message}")]
    BackOff { message: String, retry_after: Duration },
    #[error("{message}")]
    Pull { message: String, source: Arc<PullError> },
    #[error("{message}")]
    RegistryUnavailable { message: String, source: Arc<PullError> },
    #[error("{message}")]
    SignatureValidationFailed { message: String, source: Arc<PullError> },
    /// The pull's intent could not be recorded, so the pull was not made.
    #[error("{message}")]
    RecordIntent { message: String, source: RecordsError },
}

impl EnsureError {
    /// The kubelet's reason string.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidImageName { .. } => reason::INVALID_IMAGE_NAME,
            Self::ImageInspect { .. } => reason::IMAGE_INSPECT_ERROR,
            Self::NeverPull { .. } => reason::ERR_IMAGE_NEVER_PULL,
            Self::BackOff { .. } => reason::IMAGE_PULL_BACK_OFF,
            Self::Pull { .. } | Self::InvalidPullSecret { .. } | Self::RecordIntent { .. } => reason::ERR_IMAGE_PULL,
            Self::RegistryUnavailable { .. } => reason::REGISTRY_UNAVAILABLE,
            Self::SignatureValidationFailed { .. } => reason::SIGNATURE_VALIDATION_FAILED,
        }
    }
}

/// The kubelet's `evalCRIPullErr`: a runtime message that starts with a CRI error name selects
/// that reason.
///
/// The kubelet tests the prefix of the whole Go error (`rpc error: code = … desc = …`), which a
/// remote runtime's error never matches; we test the runtime's own message, as was intended.
pub fn classify_pull_error(image: &str, error: Arc<PullError>) -> EnsureError {
    if let PullError::Runtime(runtime) = &*error {
        let runtime_message = runtime.runtime_message();
        if let Some(detail) = runtime_message.strip_prefix(reason::REGISTRY_UNAVAILABLE) {
            let message = messages::registry_unavailable(image, detail);
            return EnsureError::RegistryUnavailable { message, source: error };
        }
        if let Some(detail) = runtime_message.strip_prefix(reason::SIGNATURE_VALIDATION_FAILED) {
            let message = messages::signature_validation_failed(image, detail);
            return EnsureError::SignatureValidationFailed { message, source: error };
        }
    }
    EnsureError::Pull { message: error.to_string(), source: error }
}

/// The image manager: decides, backs off, and pulls through the scheduler.
pub struct ImageManager<R> {
    runtime: Arc<R>,
    scheduler: PullScheduler,
    /// Remembers the failed pull's error itself, shared by every pod that joined the pull.
    backoff: Mutex<BackoffStore<Arc<PullError>>>,
    presence: Arc<PresenceCache>,
    /// The node's docker config and credential plugins, used after the pod's secrets.
    node_credentials: Arc<NodeCredentials>,
    records: Arc<PullRecords>,
    /// Marks each image handed out or pulled, so that the collector keeps it.
    guard: Arc<ImageGuard>,
    /// Where each request's events go (the kubelet records them on the pod).
    events: Arc<Events>,
    verification: VerificationConfig,
    metrics: Arc<EnsureMetrics>,
}

/// What an [`ImageManager`] works with, each built by [`crate::daemon::Parts::build`].
pub struct Collaborators<R> {
    pub runtime: Arc<R>,
    pub scheduler: PullScheduler,
    pub backoff: BackoffStore<Arc<PullError>>,
    pub presence: Arc<PresenceCache>,
    pub node_credentials: Arc<NodeCredentials>,
    pub records: Arc<PullRecords>,
    pub guard: Arc<ImageGuard>,
    pub events: Arc<Events>,
    pub verification: VerificationConfig,
    pub metrics: Arc<EnsureMetrics>,
}

impl<R: ImageRuntime> ImageManager<R> {
    pub fn new(parts: Collaborators<R>) -> Self {
        let Collaborators {
            runtime,
            scheduler,
            backoff,
            presence,
            node_credentials,
            records,
            guard,
            events,
            verification,
            metrics,
        } = parts;
        let backoff = Mutex::new(backoff);
        Self { runtime, scheduler, backoff, presence, node_credentials, records, guard, events, verification, metrics }
    }

    fn backoff(&self) -> MutexGuard<'_, BackoffStore<Arc<PullError>>> {
        self.backoff.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The pulls under way or queued now.
    pub fn pulls_in_flight(&self) -> Vec<InFlight> {
        self.scheduler.in_flight()
    }

    /// Backs off by `config` from the next failure on (a reload).
    pub fn set_backoff(&self, config: BackoffConfig) {
        self.backoff().set_config(config);
    }

    /// How many (pod, image) pairs the backoff store holds, and whether `pod_uid`'s pulls of
    /// `image` are backing off now (time left, the last error).
    pub fn backoff_status(&self, pod_uid: &str, image: &str) -> (usize, Option<(Duration, String)>) {
        let backoff = self.backoff();
        let key = backoff.key(pod_uid, image);
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
        let about = Subject::of(&request);
        let result = self.ensure(request, &about).await;
        // On the presence path: the event is made only for someone watching.
        if self.events.watched()
            && let Some(event) = outcome_event(&about, &result)
        {
            self.events.publish(event);
        }
        result
    }

    async fn ensure(&self, request: EnsureRequest, about: &Subject) -> Result<EnsureOutcome, EnsureError> {
        let image = &request.image;
        let (reference, spec) = with_default_tag(&request)?;
        let policy = request.pull_policy.unwrap_or_else(|| PullPolicy::default_for(&reference));
        // A hand-out the collector's removal of the image overlapped fails: the image is absent.
        let hand_out = self.guard.handing_out();
        let checked_at = Instant::now();
        let present = self.image_status(image, &spec).await?;
        // The kubelet's keyring lookup and records are by the normalised repository, without tag
        // or digest.
        let repository = reference.name();
        if let Some(outcome) = self.decide(&request, &repository, policy, present).await? {
            if hand_out.complete(&outcome.image_ref, Instant::now()) {
                return Ok(outcome);
            }
            tracing::info!(image_ref = %outcome.image_ref, "the present image was being removed by image GC; it is absent");
            // Absent, the decision is a pull or, under Never, the absent image's refusal (the
            // request was counted once, as decided the first time).
            if policy::decide(policy, false) != Decision::Pull {
                return Err(never_pull(image));
            }
        }
        drop(hand_out);
        let backoff_key = self.check_backoff(&request.pod.uid, image)?;
        let pod_keyring = secrets::keyring_for(&repository, &request.pull_secrets).map_err(|source| {
            tracing::warn!(error = %source, "pull secret refused");
            EnsureError::InvalidPullSecret { source }
        })?;
        let credentials = credentials::for_pull(&repository, &pod_keyring, &self.node_credentials).await;
        let peer = shown_peer(request.peer);
        tracing::info!(policy = policy.as_str(), credentials = credentials.len(), %peer, "{}", messages::pulling(image));
        let started = Instant::now();
        let pull = PullSpec {
            image: spec,
            reference: Some(Arc::new(reference)),
            sandbox_config: request.sandbox_config,
            // Not under Always: the same pull that ended since the presence check serves it.
            absent_since: (policy != PullPolicy::Always).then_some(checked_at),
            caller: about.pod.clone(),
            ..Default::default()
        };
        // The pull and its record run in a task of their own: a caller that goes away mid-pull
        // (its deadline passed) must not leave a pulled image without the record of who pulled it.
        // The task stops waiting for the pull once the caller is gone (see `CallerWaits`).
        let announce = Announce { about: about.clone(), events: self.events.clone(), started };
        let (_waits, left) = caller_waits();
        let pulling = pull_and_record(
            (self.scheduler.clone(), self.records.clone(), self.guard.clone()),
            (image.clone(), repository),
            pull,
            credentials,
            (announce, left),
        );
        let scheduled = match tokio::spawn(pulling.instrument(tracing::Span::current())).await {
            Ok(Ok(scheduled)) => scheduled,
            Ok(Err(source)) => {
                let message = format!("Failed to record image pull intent for container image {image:?}: {source}");
                tracing::warn!("{message}");
                return Err(EnsureError::RecordIntent { message, source });
            }
            Err(_) => Scheduled { result: Err(Arc::new(PullError::Abandoned)), joined: false },
        };
        match scheduled.result {
            Ok(pulled) => Ok(self.record_pulled(image, pulled, started, scheduled.joined)),
            Err(error) => Err(self.record_failed(image, error, backoff_key)),
        }
    }

    /// Decides from presence, policy and the pod's right to the present image: the answer when
    /// the present image is used or the policy forbids a pull, `None` when a pull is needed.
    async fn decide(
        &self,
        request: &EnsureRequest,
        repository: &str,
        policy: PullPolicy,
        present: Option<PresentImage>,
    ) -> Result<Option<EnsureOutcome>, EnsureError> {
        let image = &request.image;
        let decision = policy::decide(policy, present.is_some());
        let never_pull = || never_pull(image);
        match (decision, present) {
            (Decision::UsePresent, Some(found)) => {
                if !self.may_use_present(request, repository, &found.id).await? {
                    self.metrics.decided(policy, true, true);
                    // Under Never, the pod learns no more than if the image were absent.
                    return if policy == PullPolicy::Never { Err(never_pull()) } else { Ok(None) };
                }
                self.metrics.decided(policy, true, false);
                let message = messages::already_present(image);
                // The kubelet records this as an event, not a log line; the caller gets it in the
                // answer. At info it would be a line per container start.
                tracing::debug!(policy = policy.as_str(), image_ref = %found.id, "{message}");
                Ok(Some(EnsureOutcome { image_ref: found.id, message, pull: None, image_size: found.size }))
            }
            (decision, present) => {
                self.metrics.decided(policy, present.is_some(), decision == Decision::Pull);
                match decision {
                    Decision::Pull => Ok(None),
                    Decision::RefuseNeverPull | Decision::UsePresent => Err(never_pull()),
                }
            }
        }
    }

    /// KEP-2535: whether the pod may use the present image `image_ref` without pulling it with
    /// its own credentials. Records that cannot be read mean no: the pod pulls (fail safe).
    async fn may_use_present(
        &self,
        request: &EnsureRequest,
        repository: &str,
        image_ref: &str,
    ) -> Result<bool, EnsureError> {
        let VerificationConfig { policy, allowlist } = &self.verification;
        let checked = |result: CheckResult| {
            self.records.metrics().checked(result);
            result == CheckResult::CredentialPolicyAllowed || result == CheckResult::CredentialRecordFound
        };
        let unreadable = |error: RecordsError| {
            tracing::warn!(%error, "Unable to access cache records about image pulls");
            checked(CheckResult::Error)
        };
        // Only this policy asks whether cri-imaged pulled the image.
        let pulled_by_us = match policy {
            VerificationPolicy::NeverVerifyPreloadedImages => {
                match self.records.pulled_by_cri_imaged(&request.image, image_ref).await {
                    Ok(pulled) => pulled,
                    Err(error) => return Ok(unreadable(error)),
                }
            }
            _ => false,
        };
        if !verification::requires_verification(*policy, allowlist, repository, pulled_by_us) {
            return Ok(checked(CheckResult::CredentialPolicyAllowed));
        }
        let record = match self.records.record(image_ref).await {
            Ok(Some(record)) => record,
            Ok(None) => return Ok(checked(CheckResult::MustAuthenticate)),
            Err(error) => return Ok(unreadable(error)),
        };
        // The pod's secrets are read only when the record holds secrets to compare them with.
        let needs_secrets = record
            .credential_mapping
            .get(repository)
            .is_some_and(|recorded| !recorded.node_pods_accessible && !recorded.kubernetes_secrets.is_empty());
        let pod_secrets = if needs_secrets { self.pod_secret_records(request, repository)? } else { Vec::new() };
        match check::check(&record, repository, &pod_secrets) {
            check::Verdict::Allowed { remember } => {
                if let Some(secret) = remember
                    && let Err(error) = self.records.remember(image_ref, repository, secret).await
                {
                    tracing::warn!(%error, "failed to write an image pulled record");
                }
                Ok(checked(CheckResult::CredentialRecordFound))
            }
            check::Verdict::MustAuthenticate => Ok(checked(CheckResult::MustAuthenticate)),
        }
    }

    /// The pod's secrets that apply to `repository`, each with the kubelet's credential hash.
    fn pod_secret_records(&self, request: &EnsureRequest, repository: &str) -> Result<Vec<SecretRecord>, EnsureError> {
        let keyring = secrets::keyring_for(repository, &request.pull_secrets).map_err(|source| {
            tracing::warn!(error = %source, "pull secret refused");
            EnsureError::InvalidPullSecret { source }
        })?;
        let found = keyring.lookup(repository);
        Ok(found
            .iter()
            .filter_map(|credential| match &credential.source {
                CredentialSource::Secret(coordinates) => Some(secret_record(coordinates, &credential.auth)),
                CredentialSource::NodeConfig | CredentialSource::Plugin(_) => None,
            })
            .collect())
    }

    /// Refuses a pull while the pod's last pull of the image is backing off; otherwise the key
    /// to record the pull's failure under. Backoff is per pod, as in the kubelet: a caller
    /// without a pod uid (an agent pre-pulling) gets none, since one shared key would let one
    /// agent's failure refuse another's pulls.
    fn check_backoff(&self, pod_uid: &str, image: &str) -> Result<Option<BackoffKey>, EnsureError> {
        if pod_uid.is_empty() {
            return Ok(None);
        }
        let backoff = self.backoff();
        let key = backoff.key(pod_uid, image);
        let Some(backing_off) = backoff.check(key, Instant::now()) else { return Ok(Some(key)) };
        drop(backoff);
        let message = messages::back_off(image, &backing_off.last_error);
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

    /// A pull failed: logged, backed off for the pod, and classified as the kubelet does.
    fn record_failed(&self, image: &str, error: Arc<PullError>, backoff_key: Option<BackoffKey>) -> EnsureError {
        tracing::warn!("{}", messages::pull_failed(image, &error));
        if let Some(key) = backoff_key {
            let mut backoff = self.backoff();
            backoff.record_failure(key, error.clone(), Instant::now());
            self.metrics.backoff_size(backoff.len());
        }
        classify_pull_error(image, error)
    }
}

impl<R: ImageRuntime> ImageManager<R> {
    /// The runtime's ImageStatus, answered from the presence cache when it can be.
    async fn image_status(&self, image: &str, spec: &ImageSpec) -> Result<Option<PresentImage>, EnsureError> {
        let asked_at = Instant::now();
        match self.presence.lookup(spec, asked_at) {
            Lookup::Fresh(found) => return Ok(Some(found)),
            Lookup::Unproven => {
                if self.presence.prove_current_since(asked_at).await
                    && let Lookup::Fresh(found) = self.presence.lookup(spec, asked_at)
                {
                    return Ok(Some(found));
                }
            }
            Lookup::Miss => {}
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

    /// A CRI `PullImage`: through the scheduler (single-flight, parallel cap) and the registry
    /// limits, which wait rather than fail. No backoff: the kubelet keeps its own on this path.
    ///
    /// The pull is recorded too (KEP-2535), so that an image the kubelet pulled through here with
    /// its credentials is not "preloaded" for EnsureImageExists callers: pulled with credentials,
    /// its record names none (every pod is verified); anonymously, it is every pod's.
    pub async fn pull_image(&self, mut spec: PullSpec, peer: Option<Peer>) -> Result<Pulled, Arc<PullError>> {
        let image = spec.image.image.clone();
        // Not parsed yet (the runtime judges the name): logs and events repeat it bounded.
        let shown = messages::echo(&image).into_owned();
        spec.wait_for_rate_limit = true;
        let peer = shown_peer(peer);
        tracing::info!(image = %shown, %peer, "{}", messages::pulling(&shown));
        let about = Subject {
            pod: spec.sandbox_config.as_ref().and_then(sandbox_pod),
            image: shown.clone(),
            ..Subject::default()
        };
        spec.caller = about.pod.clone();
        let started = Instant::now();
        let pulled_with = match spec.auth {
            Some(_) => PullCredentials::default(),
            None => PullCredentials { node_pods_accessible: true, ..Default::default() },
        };
        let name = spec.reference.as_ref().map(|reference| reference.name());
        let (scheduler, records, guard) = (self.scheduler.clone(), self.records.clone(), self.guard.clone());
        let announce = Announce { about, events: self.events.clone(), started };
        let (_waits, mut left) = caller_waits();
        let pulling = async move {
            announce.pulling();
            let _pulling = spec.reference.as_ref().map(|reference| guard.pulling(reference));
            let intent = match &name {
                Some(_) => records
                    .intend(&image)
                    .await
                    .map_err(|error| tracing::warn!(%error, "pull intent not recorded"))
                    .ok(),
                None => None,
            };
            let record = match (&intent, &name) {
                (Some(_), Some(name)) => {
                    let to =
                        RecordTo { records: records.clone(), name: name.clone(), pulled_with: pulled_with.clone() };
                    Some(Arc::new(to))
                }
                _ => None,
            };
            let scheduled = tokio::select! {
                biased;
                scheduled = scheduler.pull(PullSpec { record, ..spec }) => scheduled,
                () = left.left() => Scheduled::cancelled(),
            };
            if let Ok(pulled) = &scheduled.result {
                guard.pulled(&pulled.image_ref, Instant::now());
            }
            announce.outcome(&scheduled.result);
            if let (Some(intent), Some(name)) = (intent, &name) {
                let recorded = match &scheduled.result {
                    Ok(pulled) => intent.pulled(&pulled.image_ref, name, pulled_with).await,
                    Err(_) => intent.failed().await,
                };
                if let Err(error) = recorded {
                    tracing::warn!(%error, "failed to record the pull's outcome; its intent stays");
                }
            }
            scheduled
        };
        let scheduled = match tokio::spawn(pulling.instrument(tracing::Span::current())).await {
            Ok(done) => done,
            Err(_) => return Err(Arc::new(PullError::Abandoned)),
        };
        match &scheduled.result {
            Ok(pulled) => {
                let message = messages::pulled(&shown, pulled.pull_duration, started.elapsed(), pulled.image_size);
                tracing::info!(image = %shown, image_ref = %pulled.image_ref, joined = scheduled.joined, "{message}");
            }
            Err(error) => tracing::warn!(image = %shown, "{}", messages::pull_failed(&shown, error)),
        }
        scheduled.result
    }
}

/// Records the pull's intent, pulls with each credential in turn, and records the outcome:
/// [`PullRecords::intend`], then [`pull_with_each`], then the record (or the intent's end).
async fn pull_and_record(
    (scheduler, records, guard): (PullScheduler, Arc<PullRecords>, Arc<ImageGuard>),
    (image, repository): (String, String),
    spec: PullSpec,
    credentials: Vec<Arc<Credential>>,
    (announce, mut left): (Announce, CallerLeft),
) -> Result<Scheduled, RecordsError> {
    let intent = records.intend(&image).await?;
    announce.pulling();
    // Named as pulled until the image is marked: the collector keeps it all along.
    let _pulling = spec.reference.as_ref().map(|reference| guard.pulling(reference));
    let (scheduled, pulled_with) = tokio::select! {
        biased;
        pulled = pull_with_each(&scheduler, (&records, &repository), spec, &credentials) => pulled,
        () = left.left() => (Scheduled::cancelled(), PullCredentials::default()),
    };
    if let Ok(pulled) = &scheduled.result {
        guard.pulled(&pulled.image_ref, Instant::now());
    }
    announce.outcome(&scheduled.result);
    let recorded = match &scheduled.result {
        Ok(pulled) => intent.pulled(&pulled.image_ref, &repository, pulled_with).await,
        Err(_) => intent.failed().await,
    };
    if let Err(error) = recorded {
        tracing::warn!(%error, "failed to record the pull's outcome; its intent stays, so every pod will be verified");
    }
    Ok(scheduled)
}

/// The kubelet's pull with credentials: without any, one anonymous pull; otherwise each in
/// turn until one succeeds, never falling back to an anonymous pull. Each attempt is its own
/// shared pull (its key holds the credential's hash), so callers with the same credential
/// share it and callers with different ones never do.
///
/// Also returns what the winning pull was made with, for the image's record: the secret, or
/// "any pod on the node" for an anonymous pull or the node's own credentials.
async fn pull_with_each(
    scheduler: &PullScheduler,
    record: (&Arc<PullRecords>, &str),
    spec: PullSpec,
    credentials: &[Arc<Credential>],
) -> (Scheduled, PullCredentials) {
    let (records, name) = record;
    let recording = |pulled_with: &PullCredentials| {
        let to = RecordTo { records: records.clone(), name: name.to_owned(), pulled_with: pulled_with.clone() };
        Some(Arc::new(to))
    };
    let anyone = PullCredentials { node_pods_accessible: true, ..Default::default() };
    if credentials.is_empty() {
        let spec = PullSpec { record: recording(&anyone), ..spec };
        return (scheduler.pull(spec).await, anyone);
    }
    let mut failures = Vec::with_capacity(credentials.len());
    let mut joined = false;
    for credential in credentials {
        let pulled_with = match &credential.source {
            CredentialSource::Secret(coordinates) => PullCredentials {
                kubernetes_secrets: vec![secret_record(coordinates, &credential.auth)],
                ..Default::default()
            },
            CredentialSource::NodeConfig | CredentialSource::Plugin(_) => anyone.clone(),
        };
        let attempt = PullSpec { auth: Some(credential.auth.clone()), record: recording(&pulled_with), ..spec.clone() };
        let scheduled = scheduler.pull(attempt).await;
        joined |= scheduled.joined;
        match scheduled.result {
            Ok(pulled) => return (Scheduled { result: Ok(pulled), joined }, pulled_with),
            Err(error) => {
                tracing::debug!(credentials = %credential.source, %error, "pull with these credentials failed");
                failures.push(error);
            }
        }
    }
    (Scheduled { result: Err(PullError::every_credential_failed(failures)), joined }, PullCredentials::default())
}

/// A secret as a pull record names it: its coordinates and the hash of its credential.
fn secret_record(coordinates: &SecretCoordinates, auth: &RegistryAuth) -> SecretRecord {
    SecretRecord {
        uid: coordinates.uid.clone(),
        namespace: coordinates.namespace.clone(),
        name: coordinates.name.clone(),
        credential_hash: credentials::hash::kubelet_hash(auth),
    }
}

/// Who and what a request's events are about.
#[derive(Clone, Default)]
struct Subject {
    pod: Option<Pod>,
    container: String,
    image: String,
}

impl Subject {
    fn of(request: &EnsureRequest) -> Self {
        let pod = &request.pod;
        let known = !(pod.uid.is_empty() && pod.name.is_empty() && pod.namespace.is_empty());
        // Events repeat what the caller wrote: bounded, however much it wrote.
        let echo = |value: &str| messages::echo(value).into_owned();
        Self {
            pod: known.then(|| Pod { namespace: echo(&pod.namespace), name: echo(&pod.name), uid: echo(&pod.uid) }),
            container: echo(&request.container_name),
            image: echo(&request.image),
        }
    }

    fn event(&self, kind: EventType, reason: &'static str, message: String) -> Event {
        Event {
            pod: self.pod.clone(),
            container: self.container.clone(),
            image: self.image.clone(),
            ..Event::new(kind, reason, message)
        }
    }
}

/// The kubelet's event for a request's outcome, when it records one and the pull's task has not
/// (see [`Announce`]): `Pulled` for an image already present, `InspectFailed` for a name that does
/// not parse or a failed ImageStatus, `ErrImageNeverPull`, and `BackOff` (Normal, as the
/// kubelet's). Like the kubelet, none for a pull secret that does not parse or an intent that
/// cannot be recorded: those are only in the answer.
fn outcome_event(about: &Subject, result: &Result<EnsureOutcome, EnsureError>) -> Option<Event> {
    use EventType::{Normal, Warning};
    let (kind, reason, message) = match result {
        Ok(outcome) if outcome.pull.is_none() => (Normal, event_reason::PULLED, outcome.message.clone()),
        Ok(_) => return None,
        Err(EnsureError::InvalidImageName { message, .. } | EnsureError::ImageInspect { message, .. }) => {
            (Warning, event_reason::INSPECT_FAILED, message.clone())
        }
        Err(EnsureError::NeverPull { message }) => (Warning, event_reason::ERR_IMAGE_NEVER_PULL, message.clone()),
        Err(EnsureError::BackOff { .. }) => (Normal, event_reason::BACK_OFF, messages::back_off_event(&about.image)),
        Err(
            EnsureError::InvalidPullSecret { .. }
            | EnsureError::RecordIntent { .. }
            | EnsureError::Pull { .. }
            | EnsureError::RegistryUnavailable { .. }
            | EnsureError::SignatureValidationFailed { .. },
        ) => return None,
    };
    let event = about.event(kind, reason, message);
    Some(match result {
        Ok(outcome) => Event { image_ref: outcome.image_ref.clone(), ..event },
        Err(_) => event,
    })
}

/// Held by a request's caller while it waits for the pull its task runs: once the caller is gone
/// (its deadline passed, it cancelled, its connection closed), the task stops waiting for the
/// pull, and the scheduler cancels a pull nobody waits for.
struct CallerWaits {
    _held: tokio::sync::oneshot::Sender<()>,
}

/// The pulling task's side of [`CallerWaits`].
struct CallerLeft(tokio::sync::oneshot::Receiver<()>);

impl CallerLeft {
    /// Resolves once the caller is gone.
    async fn left(&mut self) {
        let _ = (&mut self.0).await;
    }
}

fn caller_waits() -> (CallerWaits, CallerLeft) {
    let (waits, left) = tokio::sync::oneshot::channel();
    (CallerWaits { _held: waits }, CallerLeft(left))
}

/// A pull's events, published from its own task so that a caller that goes away mid-pull (its
/// deadline passed) leaves no `Pulling` without its outcome: `Pulling` once the pull is about to
/// start, then `Pulled` with its figures or `Failed` with the pull's own error.
struct Announce {
    about: Subject,
    events: Arc<Events>,
    started: Instant,
}

impl Announce {
    fn pulling(&self) {
        let message = messages::pulling(&self.about.image);
        self.events.publish(self.about.event(EventType::Normal, event_reason::PULLING, message));
    }

    fn outcome(&self, result: &Result<Pulled, Arc<PullError>>) {
        let image = &self.about.image;
        let event = match result {
            Ok(pulled) => {
                let facts = PullFacts {
                    pull: pulled.pull_duration,
                    total: self.started.elapsed(),
                    image_size: pulled.image_size,
                };
                let message = messages::pulled(image, facts.pull, facts.total, facts.image_size);
                let event = self.about.event(EventType::Normal, event_reason::PULLED, message);
                Event { image_ref: pulled.image_ref.clone(), pull: Some(facts), ..event }
            }
            Err(error) => {
                let message = messages::pull_failed(image, error);
                self.about.event(EventType::Warning, event_reason::FAILED, message)
            }
        };
        self.events.publish(event);
    }
}

/// The pod a CRI PullImage is for, from its sandbox config's metadata.
fn sandbox_pod(config: &PodSandboxConfig) -> Option<Pod> {
    let metadata = config.metadata.as_ref()?;
    Some(Pod { namespace: metadata.namespace.clone(), name: metadata.name.clone(), uid: metadata.uid.clone() })
}

/// The refusal of an absent image under `Never`.
fn never_pull(image: &str) -> EnsureError {
    let message = messages::never_pull(image);
    tracing::warn!("{message}");
    EnsureError::NeverPull { message }
}

/// Validates the image and applies the default tag: the parsed reference (default tag
/// included) and the spec for the runtime (the image as written, tagged; the pod's annotations
/// and runtime handler).
fn with_default_tag(request: &EnsureRequest) -> Result<(ImageReference, ImageSpec), EnsureError> {
    let (reference, tagged) = reference::parse_with_default_tag(&request.image).map_err(|source| {
        let error =
            EnsureError::InvalidImageName { message: messages::invalid_image_name(&request.image, &source), source };
        tracing::warn!("{error}");
        error
    })?;
    let spec = ImageSpec {
        image: tagged,
        annotations: request.pod.annotations.clone(),
        runtime_handler: request.runtime_handler.clone(),
        ..Default::default()
    };
    Ok((reference, spec))
}

#[cfg(test)]
mod tests;
