//! Each registry's health as the scheduler sees it: a circuit breaker ([`state`]) fed by how its
//! pulls end ([`failure`]), and the wait behind a registry that has gone quiet.
//!
//! A pull whose registry has not answered for the grace (no manifest found, no byte moved)
//! makes the registry *unanswered*: later pulls from it wait, holding no slot, for its verdict.
//! If the registry answers they go on; if that pull fails to reach it (the resolve timeout), they
//! fail with it, at once and together, rather than each taking a slot for the whole timeout.
//! A pull's registry is its reference's host, port included; a pull without one (a name only the
//! runtime understands) has none and is never held or refused here.

pub mod failure;
pub mod state;

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime},
};

use tokio::{sync::watch, time::Instant};

use self::{
    failure::{Failure, classify},
    state::{Admission, Breaker, BreakerConfig, Change, Outcome, Phase, Refusal, Stage},
};
use crate::{
    events::{Event, EventType, Events, reason},
    messages,
    pull::{PullError, metrics::PullMetrics},
    signatures::{Reached, RegistryHealth, RegistryVisit},
};

/// The most registries followed at once; past it, one that has nothing to say is forgotten.
const MAX_REGISTRIES: usize = 256;

/// Every registry's breaker and wait, shared by the scheduler's pulls.
pub struct Breakers {
    config: BreakerConfig,
    registries: Mutex<HashMap<String, Registry>>,
    next_pass: AtomicU64,
    metrics: Arc<PullMetrics>,
    events: Arc<Events>,
}

struct Registry {
    breaker: Breaker,
    /// The pull that has gone unanswered past the grace, while it waits.
    unanswered: Option<u64>,
    /// Each end of an unanswered spell, and whether it ended in failure.
    verdicts: watch::Sender<Verdict>,
}

impl Default for Registry {
    fn default() -> Self {
        Self { breaker: Breaker::default(), unanswered: None, verdicts: watch::Sender::new(Verdict::default()) }
    }
}

#[derive(Debug, Clone, Default)]
struct Verdict {
    spell: u64,
    failure: Option<Arc<str>>,
}

/// A registry as GetStatus shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryStatus {
    pub host: String,
    /// `closed`, `open` or `half-open`.
    pub breaker: &'static str,
    /// Pulls that failed to reach it in a row.
    pub failures: u32,
    pub last_failure: Option<String>,
    /// While open: when one pull may test it.
    pub open_until: Option<SystemTime>,
    /// Whether a pull has gone unanswered past the grace, others waiting for it.
    pub unanswered: bool,
}

impl Breakers {
    pub fn new(config: BreakerConfig, metrics: Arc<PullMetrics>, events: Arc<Events>) -> Self {
        Self { config, registries: Mutex::default(), next_pass: AtomicU64::new(0), metrics, events }
    }

    fn registries(&self) -> MutexGuard<'_, HashMap<String, Registry>> {
        self.registries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One pull's way past its registry's breaker; `host` is `None` for a pull without one.
    pub fn pass(self: &Arc<Self>, host: Option<&str>) -> Pass {
        let id = self.next_pass.fetch_add(1, Ordering::Relaxed);
        Pass { breakers: self.clone(), host: host.map(str::to_owned), id, probe: false }
    }

    /// The registries with something to report, by host.
    pub fn status(&self) -> Vec<RegistryStatus> {
        let now = Instant::now();
        let registries = self.registries();
        let mut status: Vec<RegistryStatus> = registries
            .iter()
            .filter(|(_, registry)| !registry.breaker.is_idle() || registry.unanswered.is_some())
            .map(|(host, registry)| {
                let phase = registry.breaker.phase(now);
                let open_until = match phase {
                    Phase::Open { until } => Some(SystemTime::now() + until.saturating_duration_since(now)),
                    _ => None,
                };
                RegistryStatus {
                    host: host.clone(),
                    breaker: phase.name(),
                    failures: registry.breaker.failures(),
                    last_failure: registry.breaker.last_failure().map(ToString::to_string),
                    open_until,
                    unanswered: registry.unanswered.is_some(),
                }
            })
            .collect();
        status.sort_by(|a, b| a.host.cmp(&b.host));
        status
    }

    fn changed(&self, host: &str, change: Change, now: Instant) {
        match change {
            Change::Opened { failures, last, until } => {
                let message = unavailable(host, failures, &last, Some(until.saturating_duration_since(now)), "");
                tracing::warn!(registry = %host, failures, "{message}");
                self.metrics.breaker_opened(host);
                self.events.publish(Event::new(EventType::Warning, reason::REGISTRY_UNAVAILABLE, message));
            }
            Change::Closed => {
                let message = format!("registry {host:?} answered again; its pulls go on as usual");
                tracing::info!(registry = %host, "{message}");
                self.metrics.breaker_closed(host);
                self.events.publish(Event::new(EventType::Normal, reason::REGISTRY_AVAILABLE, message));
            }
        }
    }
}

/// The breakers as a signature verification asks them: admitted as a pull about to call its
/// registry (a half-open breaker's probe, if it is the first), refused as such a pull is.
pub struct SignatureReads(pub Arc<Breakers>);

impl RegistryHealth for SignatureReads {
    fn visit(&self, host: &str) -> Result<Box<dyn RegistryVisit>, String> {
        let mut pass = self.0.pass(Some(host));
        pass.admit(Stage::Start).map_err(|refused| refused.to_string())?;
        Ok(Box::new(pass))
    }
}

impl RegistryVisit for Pass {
    fn ended(self: Box<Self>, reached: Reached) {
        match reached {
            Reached::Answered => Pass::ended(*self, None),
            Reached::Unreachable(words) => Pass::ended(*self, Some(&PullError::RegistryUnavailable(words))),
            // Dropped: says nothing about the registry.
            Reached::Nothing => {}
        }
    }
}

/// A pull's way past its registry: admitted, waiting behind an unanswered pull, reporting how it
/// ended. Dropped before it ended (the pull was cancelled), it says nothing about the registry.
pub struct Pass {
    breakers: Arc<Breakers>,
    host: Option<String>,
    id: u64,
    /// Whether this pull is the half-open breaker's test of the registry.
    probe: bool,
}

impl Pass {
    /// The pull's registry: its reference's host, port included; `None` without one.
    pub fn host(&self) -> Option<&str> {
        self.host.as_deref()
    }

    /// Whether the pull may go on at `stage`; refused, the error to answer with.
    pub fn admit(&mut self, stage: Stage) -> Result<(), PullError> {
        let Some(host) = &self.host else { return Ok(()) };
        let now = Instant::now();
        let mut registries = self.breakers.registries();
        forget_idle(&mut registries, host);
        let registry = registries.entry(host.clone()).or_default();
        match registry.breaker.admit(stage, now) {
            Admission::Admitted => Ok(()),
            Admission::Probe => {
                self.probe = true;
                Ok(())
            }
            Admission::Refused(refusal) => Err(refused(host, &refusal, now)),
        }
    }

    /// Waits while another pull from this registry has gone unanswered past the grace: on until
    /// the registry answers, or failing with that pull's failure.
    pub async fn wait_while_unanswered(&self) -> Result<(), PullError> {
        let Some(host) = &self.host else { return Ok(()) };
        loop {
            let mut verdicts = {
                let mut registries = self.breakers.registries();
                let registry = registries.entry(host.clone()).or_default();
                if registry.unanswered.is_none() {
                    return Ok(());
                }
                registry.verdicts.subscribe()
            };
            let spell = verdicts.borrow_and_update().spell;
            let verdict = match verdicts.wait_for(|verdict| verdict.spell != spell).await {
                Ok(verdict) => verdict.clone(),
                Err(_) => return Ok(()),
            };
            if let Some(failure) = verdict.failure {
                return Err(PullError::RegistryUnavailable(failure.to_string()));
            }
        }
    }

    /// Whether a pull of this registry has gone unanswered past the grace.
    pub fn registry_unanswered(&self) -> bool {
        let Some(host) = &self.host else { return false };
        self.breakers.registries().get(host).is_some_and(|registry| registry.unanswered.is_some())
    }

    /// This pull has had no answer for the grace: later pulls from its registry wait for it.
    pub fn unanswered(&self) {
        let Some(host) = &self.host else { return };
        let mut registries = self.breakers.registries();
        let registry = registries.entry(host.clone()).or_default();
        if registry.unanswered.is_none() {
            tracing::info!(registry = %host, "a pull has had no answer from its registry yet; its next pulls wait for it");
            registry.unanswered = Some(self.id);
        }
    }

    /// The registry answered this pull (its manifest was found): whoever waits goes on.
    pub fn answered(&self) {
        let Some(host) = &self.host else { return };
        if let Some(registry) = self.breakers.registries().get_mut(host) {
            end_spell(registry, None);
        }
    }

    /// The pull ended, with `failure` or without: the breaker counts it, and those waiting for
    /// it learn it.
    pub fn ended(mut self, failure: Option<&PullError>) {
        let Some(host) = self.host.take() else { return };
        let outcome = match failure {
            None => Outcome::Answered,
            Some(error) => match classify(error) {
                // Without the name: it is told inside a `RegistryUnavailable` message of its own.
                Failure::Unreachable => Outcome::Unreachable(Arc::from(registry_unavailable_detail(error))),
                Failure::Answered | Failure::TooManyRequests => Outcome::Answered,
                Failure::Unknown => Outcome::NoVerdict,
            },
        };
        let now = Instant::now();
        let change = {
            let mut registries = self.breakers.registries();
            let registry = registries.entry(host.clone()).or_default();
            if registry.unanswered == Some(self.id) || outcome == Outcome::Answered {
                let told = match &outcome {
                    Outcome::Unreachable(detail) => Some(detail.clone()),
                    _ => None,
                };
                end_spell(registry, told);
            }
            registry.breaker.ended(outcome, self.probe, now, &self.breakers.config)
        };
        if let Some(change) = change {
            self.breakers.changed(&host, change, now);
        }
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        let Some(host) = self.host.take() else { return };
        let mut registries = self.breakers.registries();
        if let Some(registry) = registries.get_mut(&host) {
            if registry.unanswered == Some(self.id) {
                end_spell(registry, None);
            }
            registry.breaker.ended(Outcome::NoVerdict, self.probe, Instant::now(), &self.breakers.config);
        }
    }
}

/// Ends the registry's unanswered spell (if any), telling those waiting how it ended.
fn end_spell(registry: &mut Registry, failure: Option<Arc<str>>) {
    if registry.unanswered.take().is_some() {
        registry.verdicts.send_modify(|verdict| {
            verdict.spell += 1;
            verdict.failure = failure;
        });
    }
}

/// Makes room for `host` when the map is full: a registry with nothing to say is forgotten.
fn forget_idle(registries: &mut HashMap<String, Registry>, host: &str) {
    if registries.len() < MAX_REGISTRIES || registries.contains_key(host) {
        return;
    }
    let idle = registries.iter().find(|(_, registry)| {
        registry.breaker.is_idle() && registry.unanswered.is_none() && registry.verdicts.receiver_count() == 0
    });
    if let Some(idle) = idle.map(|(host, _)| host.clone()) {
        registries.remove(&idle);
    }
}

/// What a failed pull's waiters are told: its message without the prefix they add again.
fn registry_unavailable_detail(error: &PullError) -> String {
    let message = error.to_string();
    let detail = message.strip_prefix(PullError::REGISTRY_UNAVAILABLE_PREFIX).unwrap_or(&message).trim_start();
    last_words(detail).into_owned()
}

/// The end of a failure's message, where Go's wrapped errors put the cause (`connection
/// refused`), at most [`messages::ECHO_LIMIT`] bytes of it.
fn last_words(message: &str) -> std::borrow::Cow<'_, str> {
    if message.len() <= messages::ECHO_LIMIT {
        return message.into();
    }
    let mut start = message.len() - messages::ECHO_LIMIT;
    while !message.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &message[start..]).into()
}

fn refused(host: &str, refusal: &Refusal, now: Instant) -> PullError {
    let left = refusal.until.map(|until| until.saturating_duration_since(now).max(Duration::from_millis(1)));
    PullError::RegistryUnavailable(unavailable(host, refusal.failures, &refusal.last, left, " more"))
}

/// An open breaker, as its event and its refusals say it: open for `left` (`more` after it),
/// or half-open with its probe under way.
fn unavailable(host: &str, failures: u32, last: &str, left: Option<Duration>, more: &str) -> String {
    let when = match left {
        Some(left) => {
            format!("its pulls fail at once for {}{more}, then one pull tests it", messages::go_duration_millis(left))
        }
        None => "one pull is testing it now".to_owned(),
    };
    format!("registry {host:?} is unavailable after {failures} failed pulls in a row (the last: {last}); {when}")
}

#[cfg(test)]
mod tests;
