//! The pull path: one upstream pull as a tower service (the runtime's PullImage, then the image's
//! size), wrapped in layers and run by the scheduler.
//!
//! - `key`: what makes two pulls the same pull.
//! - [`progress`]: a pull's progress and stall from containerd's ingests (pure).
//! - [`poller`]: polls containerd's content service for the pulls under way (progress, stalls).
//! - [`liveness`]: whether a pull's registry answers, asked of it where the runtime cannot say.
//! - [`breaker`]: each registry's circuit breaker, and the wait behind a registry gone quiet.
//! - [`unavailable`]: which failed pulls are `RegistryUnavailable`, the network-level failures (pure).
//! - [`ratelimit`]: registry rate limits (lowered while a registry answers 429), a tower layer
//!   around [`RuntimePull`].
//! - [`record`]: the pull's record written before its result is shared (KEP-2535).
//! - [`path`]: the pull path as a request walks it: records, the GC guard, the scheduler and
//!   the pull's events, in one place ([`path::PullPath`]).
//! - [`scheduler`]: the fair parallel-pull cap and single-flight, calling the stack as a
//!   [`PullService`]; a big pull makes way for much cheaper pods' pulls.
//! - [`size`]: an image's size read from its registry, for pulls the runtime says nothing of.

pub mod breaker;
mod key;
pub mod liveness;
pub mod metrics;
pub mod path;
pub mod poller;
pub mod progress;
pub mod ratelimit;
pub mod record;
pub mod scheduler;
pub mod signed;
pub mod size;
pub mod unavailable;

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use crate::cri::ImageSpec;
use tokio::{sync::watch, time::Instant};
use tower::{Service, util::BoxCloneSyncService};

pub use self::key::PullKey;
use crate::{
    access::Role,
    events::Pod,
    records::RecordTo,
    reference::{self, ImageReference},
    runtime::{ImageRuntime, PullSpec, RuntimeError},
};

/// One pull as the pull path runs it: what the runtime gets, and what the path itself needs
/// (the parsed name, the rate-limit mode, the record, the caller). No `Debug`: it carries
/// credentials.
#[derive(Clone, Default)]
pub struct Pull {
    /// What the runtime's PullImage gets.
    pub spec: PullSpec,
    /// The same image parsed once where the request came in, normalised; `None` when it does not
    /// parse (a CRI PullImage may name an image only the runtime understands).
    pub reference: Option<Arc<ImageReference>>,
    /// Over the registry rate limit, wait for a token even in fail mode: set on the CRI path,
    /// where the kubelet throttles its own pulls.
    pub wait_for_rate_limit: bool,
    /// Where the pull's outcome is recorded before it is shared (KEP-2535).
    pub record: Option<Arc<RecordTo>>,
    /// When the caller saw the image absent (or not usable) and so decided to pull: the same
    /// pull (image, handler, credential) that succeeded since then serves it, instead of a
    /// second upstream pull. `None` (PullPolicy Always, CRI PullImage) always pulls.
    pub absent_since: Option<Instant>,
    /// The pod asking, for the events of a pull it waits for; never sent to the runtime.
    pub caller: Option<Pod>,
    /// When the pull got past the registry's rate limit (`None` while it waits for a token), as
    /// the rate limit tells the scheduler: time spent waiting for a token is not the registry's
    /// silence.
    pub cleared: Option<Arc<watch::Sender<Option<Instant>>>>,
    /// Who the pull is for: a pod's pulls go before pre-pulls.
    pub class: PullClass,
    /// The runtime's lease (containerd's) that keeps what the pull fetched should it be cut
    /// short: a pre-pull's, so that it goes on from there.
    pub keep_in: Option<Arc<str>>,
}

/// Who a pull is for, as the scheduler orders them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PullClass {
    /// A pod's (EnsureImageExists, CRI PullImage): never waits behind a pre-pull for a slot.
    #[default]
    Pod,
    /// Fetched ahead of need: takes a slot only while no pod pull waits for one, and gives it
    /// back (cancelled, queued again) when one does.
    PrePull,
}

impl Pull {
    /// A pull of `spec`, its image's reference parsed here, once, with the default tag (the
    /// runtime reads an untagged name as `:latest`).
    pub fn of(spec: PullSpec) -> Self {
        let reference =
            reference::parse_with_default_tag(&spec.image.image).ok().map(|(reference, _)| Arc::new(reference));
        Self { spec, reference, ..Default::default() }
    }

    /// The image as the runtime gets it.
    pub fn image(&self) -> &ImageSpec {
        &self.spec.image
    }
}

/// The process that asked for a pull, as the kernel told when it connected (SO_PEERCRED): logged
/// with each pull it asks for, for audit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    /// `None` when the caller is in another PID namespace.
    pub pid: Option<i32>,
    /// The role its call was let in with (see [`crate::access`]); `None`: it holds none.
    pub role: Option<Role>,
}

impl Peer {
    /// How a log line shows the caller of a pull.
    pub fn shown(peer: Option<Peer>) -> String {
        peer.map_or_else(|| "unknown".to_owned(), |peer| peer.to_string())
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "uid={} gid={}", self.uid, self.gid)?;
        match self.pid {
            Some(pid) => write!(f, " pid={pid}")?,
            None => write!(f, " pid=unknown")?,
        }
        write!(f, " role={}", crate::access::label(self.role))
    }
}

/// A finished pull.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pulled {
    /// The runtime's image ref.
    pub image_ref: String,
    /// Size as the runtime reports it after the pull; 0 when unknown.
    pub image_size: u64,
    /// The runtime's PullImage call alone.
    pub pull_duration: Duration,
}

/// Why a pull failed.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The registry rate limit refused the pull (the kubelet's words).
    #[error("pull QPS exceeded")]
    RateLimited,
    /// `--image-pull-timeout` ran out; the upstream call was cancelled.
    #[error("image pull did not finish within {0:?} (--image-pull-timeout); the pull was cancelled")]
    TimedOut(Duration),
    /// The pull downloaded nothing for `--image-pull-progress-timeout`; it was cancelled.
    #[error(
        "image pull made no progress for {} (--image-pull-progress-timeout) at {} of {}; the pull was cancelled",
        crate::messages::go_duration_millis(*.timeout),
        crate::messages::binary_size(*.bytes_done),
        crate::messages::binary_size(*.bytes_total)
    )]
    Stalled { timeout: Duration, bytes_done: u64, bytes_total: u64 },
    /// The registry could not be reached: a network-level failure (the runtime's message, see
    /// [`unavailable`]), it did not answer within the resolve timeout, or its breaker is open.
    /// The message starts as the CRI's errors name it, so that kubelets (1.30 and later) give the
    /// pod their own reason for it.
    #[error("RegistryUnavailable: {0}")]
    RegistryUnavailable(String),
    /// The task running the pull ended without a result.
    #[error("the pull ended without a result")]
    Abandoned,
    /// Every caller went away before the pull ended; it was cancelled.
    #[error("every caller went away; the pull was cancelled")]
    Cancelled,
    /// Each credential was tried and each pull failed: the kubelet's aggregate error, every
    /// distinct message once, in order.
    #[error("[{}]", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
    EveryCredentialFailed(Vec<Arc<PullError>>),
    /// The node's image policy does not let the image in (see [`crate::policy`]); nothing was
    /// pulled. Named as the CRI names a signature's failure, so that kubelets give the pod their
    /// own reason for it.
    #[error("SignatureValidationFailed: {0}")]
    PolicyRejected(String),
}

impl PullError {
    /// How a [`PullError::RegistryUnavailable`] message starts.
    pub const REGISTRY_UNAVAILABLE_PREFIX: &str = "RegistryUnavailable:";

    /// The failure as a kubelet words it: its CRI client (since 1.28) passes on an UNKNOWN
    /// status as the runtime's bare message, any other status whole (`rpc error: code = …`).
    pub fn kubelet_message(&self) -> String {
        match self {
            Self::Runtime(RuntimeError::Status(status)) if status.code() == tonic::Code::Unknown => {
                status.message().to_owned()
            }
            Self::EveryCredentialFailed(failures) => {
                format!("[{}]", failures.iter().map(|failure| failure.kubelet_message()).collect::<Vec<_>>().join(", "))
            }
            other => other.to_string(),
        }
    }

    /// The kubelet's aggregate of `failures`: a repeated message counts once, and a single
    /// distinct one stands alone, as it is; distinct ones that each say the registry could not be
    /// reached are one `RegistryUnavailable` (see [`unavailable::every_attempt`]).
    pub fn every_credential_failed(failures: Vec<Arc<PullError>>) -> Arc<PullError> {
        let mut distinct: Vec<(String, Arc<PullError>)> = Vec::with_capacity(failures.len());
        for failure in failures {
            let message = failure.to_string();
            if !distinct.iter().any(|(seen, _)| *seen == message) {
                distinct.push((message, failure));
            }
        }
        match distinct.len() {
            0 => Arc::new(PullError::Abandoned),
            1 => distinct.remove(0).1,
            _ => {
                let failures: Vec<_> = distinct.into_iter().map(|(_, error)| error).collect();
                Arc::new(unavailable::every_attempt(&failures).unwrap_or(PullError::EveryCredentialFailed(failures)))
            }
        }
    }
}

/// The future every pull service in the stack returns.
pub type PullFuture = Pin<Box<dyn Future<Output = Result<Pulled, PullError>> + Send>>;

/// The pull stack as the scheduler holds it.
pub type PullService = BoxCloneSyncService<Pull, Pulled, PullError>;

/// The innermost pull service: PullImage on the runtime, then ImageStatus for the size.
pub struct RuntimePull<R> {
    runtime: Arc<R>,
}

impl<R> RuntimePull<R> {
    pub fn new(runtime: Arc<R>) -> Self {
        Self { runtime }
    }
}

impl<R> Clone for RuntimePull<R> {
    fn clone(&self) -> Self {
        Self { runtime: self.runtime.clone() }
    }
}

impl<R: ImageRuntime> Service<Pull> for RuntimePull<R> {
    type Response = Pulled;
    type Error = PullError;
    type Future = PullFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), PullError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, pull: Pull) -> Self::Future {
        let runtime = self.runtime.clone();
        Box::pin(async move {
            let spec = pull.spec;
            let image = spec.image.clone();
            let started = Instant::now();
            let image_ref = runtime.pull_image(spec).await.map_err(unavailable::pull_error)?;
            let pull_duration = started.elapsed();
            // The size is best effort, as in the kubelet: a failed look-up reports 0.
            let image_size = match runtime.image_status(image).await {
                Ok(found) => found.map_or(0, |found| found.size),
                Err(error) => {
                    tracing::debug!(%error, "image size look-up after pull failed");
                    0
                }
            };
            Ok(Pulled { image_ref, image_size, pull_duration })
        })
    }
}
