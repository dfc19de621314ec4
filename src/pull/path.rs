//! The pull path as a request walks it, in one place: the pull's intent recorded, the image
//! named to the GC guard, the scheduler's shared pull (with each credential in turn), the image
//! marked, the outcome recorded, and the pull's events. The walk runs in a task of its own, so
//! that a caller who leaves mid-pull (its deadline passed) never leaves a pulled image without
//! its record or a `Pulling` event without its outcome.
//!
//! A successful pull is recorded at two named steps, on purpose: inside the shared pull, before
//! its result reaches any caller ([`super::record`]), so that a pod with the same credential
//! asking the moment after finds the record; and as each caller's intent ends, which adds the
//! secret a joiner of the shared pull came with (a record that did not change is not rewritten).

use std::sync::Arc;

use crate::cri::PodSandboxConfig;
use tokio::{sync::oneshot, time::Instant};
use tower::{Layer, ServiceExt, util::BoxCloneSyncService};
use tracing::Instrument;

use super::{
    Peer, Pull, PullError, Pulled, RuntimePull,
    breaker::SignatureReads,
    liveness::{Liveness, RegistryProbes, attempt_bound},
    metrics::PullMetrics,
    poller::{ProgressConfig, ProgressPoller, TrackPulls},
    ratelimit::{RateLimitLayer, RegistryLimits},
    record::RecordPulls,
    scheduler::{PullScheduler, Scheduled, SchedulerConfig},
    signed::SignedPulls,
    size::RegistrySizes,
};
use crate::{
    credentials::{self, AccountCoordinates, Credential, CredentialSource, RegistryAuth, SecretCoordinates},
    events::{Event, EventType, Events, Pod, PullFacts, Subject, reason as event_reason},
    gc::ImageGuard,
    messages,
    policy::{Admission, PolicyGate},
    presence::PresenceCache,
    records::{
        PullIntent, PullRecords, RecordTo, RecordsError,
        format::{PullCredentials, SecretRecord, ServiceAccountRecord},
    },
    reference::ImageReference,
    runtime::{ContentStore, ImageRuntime, PullSpec},
    signatures::{Signatures, Verified},
};

/// Pulls through the scheduler, with the records and the GC guard kept step by step.
pub struct PullPath {
    scheduler: PullScheduler,
    records: Arc<PullRecords>,
    /// Keeps each image being pulled, and marks it pulled, so that the collector keeps it.
    guard: Arc<ImageGuard>,
    events: Arc<Events>,
    /// The node's image policy, for CRI PullImage (EnsureImageExists asks it before its pulls).
    policy: Arc<PolicyGate>,
    /// A policy's signatures verified, and the pulled image bound to the digest verified.
    signed: Arc<SignedPulls>,
}

/// A pod's pull, as EnsureImageExists decided it.
pub struct PodPull {
    /// The image as the pod names it: the intent's key.
    pub image: String,
    /// The image's normalised name, without tag or digest: the record's key.
    pub repository: String,
    pub pull: Pull,
    /// Tried in turn; none: one anonymous pull.
    pub credentials: Vec<Arc<Credential>>,
    /// Whom the pull's events are about.
    pub about: Subject,
    /// When the request decided to pull: the events' total time counts from here.
    pub started: Instant,
}

/// What the pull path shares with the rest of the daemon.
pub struct Shared {
    pub records: Arc<PullRecords>,
    pub guard: Arc<ImageGuard>,
    pub events: Arc<Events>,
    /// Emptied as each upstream pull ends, before its result reaches any caller.
    pub presence: Arc<PresenceCache>,
    pub policy: Arc<PolicyGate>,
    pub signatures: Arc<Signatures>,
}

/// How the pull path's scheduler runs pulls.
#[derive(Debug, Clone)]
pub struct PathConfig {
    pub scheduler: SchedulerConfig,
    /// How pulls under way are watched; `None` reports only their start and end.
    pub progress: Option<ProgressConfig>,
}

impl PullPath {
    /// The pull path over `runtime`: the runtime's pull, inside the registry `limits`, its record
    /// written before the result is shared, run by the scheduler (pulls under way watched when
    /// the config says so), the presence cache emptied as it ends: a pull may add an image or
    /// move a tag, and the runtime's event comes later.
    pub fn over<R: ImageRuntime + ContentStore>(
        runtime: Arc<R>,
        limits: Arc<RegistryLimits>,
        config: PathConfig,
        Shared { records, guard, events, presence, policy, signatures }: Shared,
        metrics: Arc<PullMetrics>,
    ) -> Self {
        let pulls = RecordPulls::new(RateLimitLayer::new(limits).layer(RuntimePull::new(runtime.clone()))).map_result(
            move |pulled| {
                presence.image_changed();
                pulled
            },
        );
        let poller = config.progress.map(|progress| ProgressPoller::start(runtime.clone(), progress, events.clone()));
        // Where the runtime says nothing of a pull (CRI-O), its registry is asked whether it answers.
        let attempt = attempt_bound(config.scheduler.resolve_timeout);
        let probes = RegistryProbes::new(signatures.registry_hosts(), attempt);
        let progress = Arc::new(Liveness { poller, probes }) as Arc<dyn TrackPulls>;
        let service = BoxCloneSyncService::new(pulls);
        let scheduler = PullScheduler::tracked(service, config.scheduler, metrics, Some(progress), events.clone());
        // A signature or size read counts toward its registry's breaker, as a pull does.
        let reads = Arc::new(SignatureReads(scheduler.breakers().clone()));
        // Pulls the runtime says nothing of while they run (CRI-O) are sized from their registry.
        scheduler.size_with(Arc::new(RegistrySizes::new(signatures.registry_hosts()).counted_by(reads.clone())));
        signatures.watched_by(reads);
        let signed = Arc::new(SignedPulls::new(runtime, signatures, policy.clone(), events.clone()));
        Self { scheduler, records, guard, events, policy, signed }
    }

    /// Signature checks and the binding of a pull to the digest verified (EnsureImageExists
    /// asks them itself).
    pub fn signed(&self) -> &SignedPulls {
        &self.signed
    }

    /// The scheduler the pulls go through (for what is under way).
    pub fn scheduler(&self) -> &PullScheduler {
        &self.scheduler
    }

    /// A pod's pull: its intent recorded first (a pull whose intent cannot be recorded is not
    /// made), then `pull_with_each`, then the record of who pulled the image.
    pub async fn pull_for_pod(&self, order: PodPull) -> Result<Scheduled, RecordsError> {
        let PodPull { image, repository, pull, credentials, about, started } = order;
        let (scheduler, records, guard) = (self.scheduler.clone(), self.records.clone(), self.guard.clone());
        let announce = Announce { about, events: self.events.clone(), started };
        let (_waits, mut left) = caller_waits();
        let walk = async move {
            let intent = records.intend(&image).await?;
            announce.pulling();
            // Named as pulled until the image is marked: the collector keeps it all along.
            let _pulling = pull.reference.as_ref().map(|reference| guard.pulling(reference));
            let (scheduled, pulled_with) = tokio::select! {
                biased;
                pulled = pull_with_each(&scheduler, (&records, &repository), pull, &credentials) => pulled,
                () = left.left() => (Scheduled::cancelled(), PullCredentials::default()),
            };
            mark_and_announce(&guard, &announce, &scheduled.result);
            record_outcome(intent, &scheduled.result, &repository, pulled_with).await;
            Ok(scheduled)
        };
        match tokio::spawn(walk.instrument(tracing::Span::current())).await {
            Ok(walked) => walked,
            Err(_) => Ok(Scheduled { result: Err(Arc::new(PullError::Abandoned)), joined: false }),
        }
    }

    /// A CRI `PullImage`: through the scheduler (single-flight, parallel cap) and the registry
    /// limits, which wait rather than fail. No backoff: the kubelet keeps its own on this path.
    ///
    /// The pull is recorded too (KEP-2535), so that an image the kubelet pulled through here with
    /// its credentials is not "preloaded" for EnsureImageExists callers: pulled with credentials,
    /// its record names none (every pod is verified); anonymously, it is every pod's. An intent
    /// that cannot be recorded does not stop the pull: the kubelet asked for it.
    pub async fn pull_image(&self, spec: PullSpec, peer: Option<Peer>) -> Result<Pulled, Arc<PullError>> {
        let image = spec.image.image.clone();
        // Not parsed yet (the runtime judges the name): logs and events repeat it bounded.
        let shown = messages::echo(&image).into_owned();
        tracing::info!(image = %shown, peer = %Peer::shown(peer), "{}", messages::pulling(&shown));
        let about = Subject {
            pod: spec.sandbox_config.as_ref().and_then(sandbox_pod),
            image: shown.clone(),
            ..Subject::default()
        };
        let pulled_with = match spec.auth {
            Some(_) => PullCredentials::default(),
            None => PullCredentials { node_pods_accessible: true, ..Default::default() },
        };
        let pull = Pull { wait_for_rate_limit: true, caller: about.pod.clone(), ..Pull::of(spec) };
        // The node's image policy, for the pod the sandbox config names (none: the default
        // policy's). A name that does not parse is the runtime's to refuse.
        let verified = match &pull.reference {
            Some(reference) => self.admit(reference, &about, pull.spec.auth.as_ref()).await?,
            None => None,
        };
        let bind_to = verified.zip(pull.reference.clone());
        let handler = pull.spec.image.runtime_handler.clone();
        let name = pull.reference.as_ref().map(|reference| reference.name());
        let (scheduler, records, guard) = (self.scheduler.clone(), self.records.clone(), self.guard.clone());
        let started = Instant::now();
        let announce = Announce { about, events: self.events.clone(), started };
        let (_waits, mut left) = caller_waits();
        let walk = async move {
            announce.pulling();
            let _pulling = pull.reference.as_ref().map(|reference| guard.pulling(reference));
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
                scheduled = scheduler.pull(Pull { record, ..pull }) => scheduled,
                () = left.left() => Scheduled::cancelled(),
            };
            mark_and_announce(&guard, &announce, &scheduled.result);
            if let (Some(intent), Some(name)) = (intent, &name) {
                record_outcome(intent, &scheduled.result, name, pulled_with).await;
            }
            scheduled
        };
        let scheduled = match tokio::spawn(walk.instrument(tracing::Span::current())).await {
            Ok(done) => done,
            Err(_) => return Err(Arc::new(PullError::Abandoned)),
        };
        if let (Ok(pulled), Some((verified, reference))) = (&scheduled.result, &bind_to) {
            self.signed.bind(pulled, reference, verified, &handler).await.map_err(Arc::new)?;
        }
        match &scheduled.result {
            Ok(pulled) => {
                let message = messages::pulled(&shown, pulled.pull_duration, started.elapsed(), pulled.image_size);
                tracing::info!(image = %shown, image_ref = %pulled.image_ref, joined = scheduled.joined, "{message}");
            }
            Err(error) => tracing::warn!(image = %shown, "{}", messages::pull_failed(&shown, error)),
        }
        scheduled.result
    }

    /// The policy's word on a CRI pull for the pod `about` names: refused (evented), let in, or
    /// let in once its signatures are verified with the caller's credentials.
    async fn admit(
        &self,
        reference: &Arc<ImageReference>,
        about: &Subject,
        auth: Option<&Arc<RegistryAuth>>,
    ) -> Result<Option<Verified>, Arc<PullError>> {
        let namespace = about.pod.as_ref().map(|pod| pod.namespace.as_str()).filter(|ns| !ns.is_empty());
        let refused = |refused: PullError| {
            let event = about.event(EventType::Warning, event_reason::SIGNATURE_VALIDATION_FAILED, refused.to_string());
            self.events.publish(event);
            Arc::new(refused)
        };
        let pending = match self.policy.check(reference, namespace) {
            Ok(Admission::Admit) => return Ok(None),
            Ok(Admission::Audited(audited)) => {
                self.events.publish(about.event(EventType::Warning, event_reason::POLICY_AUDIT, audited.message));
                return Ok(None);
            }
            Ok(Admission::Verify(pending)) => pending,
            Err(refusal) => return Err(refused(PullError::PolicyRejected(refusal.message))),
        };
        let credentials: Vec<Arc<Credential>> = auth
            .map(|auth| Arc::new(Credential { auth: auth.clone(), source: CredentialSource::NodeConfig }))
            .into_iter()
            .collect();
        let verified = self.signed.verify(reference, pending, None, &credentials, about).await.map_err(refused)?;
        if let Some(verified) = &verified {
            self.signed.announce(reference, verified, about);
        }
        Ok(verified)
    }
}

/// The image marked as pulled (the collector keeps it), and the pull's outcome event.
fn mark_and_announce(guard: &ImageGuard, announce: &Announce, result: &Result<Pulled, Arc<PullError>>) {
    if let Ok(pulled) = result {
        guard.pulled(&pulled.image_ref, Instant::now());
    }
    announce.outcome(result);
}

/// The record of who pulled the image, or the intent's end for a failed pull.
async fn record_outcome(
    intent: PullIntent,
    result: &Result<Pulled, Arc<PullError>>,
    name: &str,
    pulled_with: PullCredentials,
) {
    let recorded = match result {
        Ok(pulled) => intent.pulled(&pulled.image_ref, name, pulled_with).await,
        Err(_) => intent.failed().await,
    };
    if let Err(error) = recorded {
        tracing::warn!(%error, "failed to record the pull's outcome; its intent stays, so every pod will be verified");
    }
}

/// The kubelet's pull with credentials: without any, one anonymous pull; otherwise each in
/// turn until one succeeds, never falling back to an anonymous pull. Each attempt is its own
/// shared pull (its key holds the credential's hash), so callers with the same credential
/// share it and callers with different ones never do.
///
/// Also returns what the winning pull was made with, for the image's record: the secret, the
/// service account a plugin was given the token of, or "any pod on the node" for an anonymous
/// pull or the node's own credentials.
async fn pull_with_each(
    scheduler: &PullScheduler,
    record: (&Arc<PullRecords>, &str),
    pull: Pull,
    credentials: &[Arc<Credential>],
) -> (Scheduled, PullCredentials) {
    let (records, name) = record;
    let recording = |pulled_with: &PullCredentials| {
        let to = RecordTo { records: records.clone(), name: name.to_owned(), pulled_with: pulled_with.clone() };
        Some(Arc::new(to))
    };
    let anyone = PullCredentials { node_pods_accessible: true, ..Default::default() };
    if credentials.is_empty() {
        let pull = Pull { record: recording(&anyone), ..pull };
        return (scheduler.pull(pull).await, anyone);
    }
    let mut failures = Vec::with_capacity(credentials.len());
    let mut joined = false;
    for credential in credentials {
        let pulled_with = match &credential.source {
            CredentialSource::Secret(coordinates) => PullCredentials {
                kubernetes_secrets: vec![secret_record(coordinates, &credential.auth)],
                ..Default::default()
            },
            CredentialSource::Plugin { account: Some(account), .. } => {
                PullCredentials { kubernetes_service_accounts: vec![account_record(account)], ..Default::default() }
            }
            CredentialSource::NodeConfig | CredentialSource::Plugin { account: None, .. } => anyone.clone(),
        };
        let spec = PullSpec { auth: Some(credential.auth.clone()), ..pull.spec.clone() };
        let attempt = Pull { spec, record: recording(&pulled_with), ..pull.clone() };
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
pub fn secret_record(coordinates: &SecretCoordinates, auth: &RegistryAuth) -> SecretRecord {
    SecretRecord {
        uid: coordinates.uid.clone(),
        namespace: coordinates.namespace.clone(),
        name: coordinates.name.clone(),
        credential_hash: credentials::hash::kubelet_hash(auth),
    }
}

/// A service account as a pull record names it.
pub fn account_record(account: &AccountCoordinates) -> ServiceAccountRecord {
    ServiceAccountRecord { uid: account.uid.clone(), namespace: account.namespace.clone(), name: account.name.clone() }
}

/// Held by a request's caller while it waits for the pull its task runs: once the caller is gone
/// (its deadline passed, it cancelled, its connection closed), the task stops waiting for the
/// pull, and the scheduler cancels a pull nobody waits for.
struct CallerWaits {
    _held: oneshot::Sender<()>,
}

/// The pulling task's side of [`CallerWaits`].
struct CallerLeft(oneshot::Receiver<()>);

impl CallerLeft {
    /// Resolves once the caller is gone.
    async fn left(&mut self) {
        let _ = (&mut self.0).await;
    }
}

fn caller_waits() -> (CallerWaits, CallerLeft) {
    let (waits, left) = oneshot::channel();
    (CallerWaits { _held: waits }, CallerLeft(left))
}

/// A pull's events, published from its own task: `Pulling` once the pull is about to start, then
/// `Pulled` with its figures or `Failed` with the pull's own error.
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
                let message = messages::pull_failed(image, &error.kubelet_message());
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
