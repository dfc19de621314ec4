//! A tracked pull's handle: its progress reports, its stall, and whether its registry has
//! answered ([`Tracker`]), as the poller finds it or, where the runtime has no progress to give,
//! as a probe of the registry itself finds it ([`Answer`]).

use std::{
    sync::{Arc, Weak, atomic::Ordering},
    time::Duration,
};

use tokio::{sync::watch, time::Instant};

#[cfg(test)]
use super::{AtomicBool, Events, ImageReference, SystemTime, WaitingPods};
use super::{Registered, Registry, Report, progress_event};
use crate::{events::LayerFacts, pull::progress::Progress};

/// One tracked pull's reports; dropping it stops the tracking.
pub struct Tracker {
    reports: watch::Receiver<Option<Report>>,
    /// When a download no tracked pull accounts for last moved, while this one had no answer.
    activity: watch::Receiver<Option<Instant>>,
    since: Instant,
    _registration: Option<Registration>,
    /// Whether the registry answered a probe since the pull began: where the poller cannot tell.
    answer: Option<Answer>,
}

/// A probe's word on a pull's registry: `true` once it answered after the pull began. Holds what
/// keeps the pull among the probe's (dropped with the tracker).
pub struct Answer {
    answered: watch::Receiver<bool>,
    _held: Box<dyn Send + Sync>,
}

impl Answer {
    pub fn new(answered: watch::Receiver<bool>, held: Box<dyn Send + Sync>) -> Self {
        Self { answered, _held: held }
    }
}

impl Tracker {
    /// A tracker that never reports: the runtime has no progress to give.
    pub fn untracked() -> Self {
        Self::unregistered(watch::channel(None).1, watch::channel(None).1)
    }

    /// The tracker of a pull the poller follows.
    pub(super) fn registered(
        reports: watch::Receiver<Option<Report>>,
        activity: watch::Receiver<Option<Instant>>,
        registration: Registration,
    ) -> Self {
        Self { _registration: Some(registration), ..Self::unregistered(reports, activity) }
    }

    fn unregistered(reports: watch::Receiver<Option<Report>>, activity: watch::Receiver<Option<Instant>>) -> Self {
        Self { reports, activity, since: Instant::now(), _registration: None, answer: None }
    }

    /// A tracker with no progress whose registry's answer a probe tells.
    pub fn probed(answer: Answer) -> Self {
        Self { answer: Some(answer), ..Self::untracked() }
    }

    /// This tracker, its registry's answer also told by a probe: for a pull tracked before the
    /// poller learnt whether the runtime has a content service.
    pub fn or_probed(self, answer: Answer) -> Self {
        Self { answer: Some(answer), ..self }
    }

    /// Whether the poller follows this pull and the runtime has the service it reads.
    fn polled(&self) -> bool {
        self._registration.as_ref().is_some_and(|registration| {
            registration.registry.upgrade().is_none_or(|registry| !registry.unsupported.load(Ordering::Relaxed))
        })
    }

    /// A tracker whose reports and unaccounted downloads the test sends; it counts as watched.
    #[cfg(test)]
    pub(crate) fn scripted() -> (watch::Sender<Option<Report>>, watch::Sender<Option<Instant>>, Self) {
        let (reports, receiver) = watch::channel(None);
        let (activity, moved) = watch::channel(None);
        let mut tracker = Self::unregistered(receiver, moved);
        tracker._registration = Some(Registration::detached());
        (reports, activity, tracker)
    }

    /// Whether the pull's downloads are watched.
    pub fn watched(&self) -> bool {
        self._registration.is_some()
    }

    /// Resolves once the registry has answered the pull (its manifest was found, or it answered
    /// a probe since the pull began).
    pub async fn answered(&self) {
        let mut reports = self.reports.clone();
        let found = async {
            if reports.wait_for(Option::is_some).await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            () = found => {}
            () = probe_answered(self.answer.as_ref()) => {}
        }
    }

    /// Resolves once the pull has gone `quiet` without an answer: no manifest found, no download
    /// moving that no tracked pull accounts for (it may be this pull's, under a manifest the
    /// poller cannot tell apart), and none of another pull from its registry (the registry
    /// answers; its manifest is slow over a link full of it). Never, once it is answered or for a
    /// pull not watched.
    pub async fn unanswered_for(&self, quiet: Duration, since: Instant) {
        if !self.polled() {
            return self.probe_quiet_for(quiet, since).await;
        }
        let mut activity = self.activity.clone();
        loop {
            let since = since.max(self.since);
            let last = (*activity.borrow_and_update()).map_or(since, |moved| moved.max(since));
            tokio::select! {
                () = tokio::time::sleep_until(last + quiet) => {
                    // The poller learnt meanwhile that the runtime has nothing to read.
                    if !self.polled() {
                        return self.probe_quiet_for(quiet, since).await;
                    }
                    if self.reports.borrow().is_none() && !activity.has_changed().unwrap_or(false) {
                        return;
                    }
                }
                changed = activity.changed() => {
                    if changed.is_err() {
                        // The poller went: nothing more will say the pull is alive.
                        tokio::time::sleep_until(last + quiet).await;
                        return;
                    }
                }
            }
            if self.reports.borrow().is_some() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// [`Self::unanswered_for`] as a probe tells it; never without a probe.
    async fn probe_quiet_for(&self, quiet: Duration, since: Instant) {
        let Some(answer) = &self.answer else { return std::future::pending().await };
        tokio::select! {
            () = probe_answered(Some(answer)) => {}
            () = tokio::time::sleep_until(since.max(self.since) + quiet) => {
                if !*answer.answered.borrow() {
                    return;
                }
            }
        }
        std::future::pending().await
    }

    /// The reports as they come, for whoever asks how the pull is going.
    pub fn reports(&self) -> watch::Receiver<Option<Report>> {
        self.reports.clone()
    }

    /// The pull succeeded: where its progress was seen, a last event says all of it is done (the
    /// polls see it only up to the last quarter second).
    pub fn completed(self) {
        let Some(registration) = &self._registration else { return };
        let pull = &registration.pull;
        if registration.pull.told_all.load(Ordering::Relaxed) || !pull.events.watched() {
            return;
        }
        let Some(last) = self.reports.borrow().clone() else { return };
        let progress = last.progress;
        let all = Progress { bytes_done: progress.bytes_total, layers_done: progress.layers_total, ..progress };
        let layers = last.layers.iter().map(|layer| LayerFacts { bytes_done: layer.size, done: true, ..layer.clone() });
        let report = Report { progress: all, layers: layers.collect(), ..last };
        pull.events.publish(progress_event(pull, &report.facts()));
    }

    /// Resolves with the report that found the pull stalled; never, for a pull that is not.
    pub async fn stalled(&self) -> Report {
        let mut reports = self.reports.clone();
        loop {
            if let Some(report) = &*reports.borrow_and_update()
                && report.stalled.is_some()
            {
                return report.clone();
            }
            if reports.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// Resolves once `answer` says the registry answered; never without one, or once its probe is
/// gone.
async fn probe_answered(answer: Option<&Answer>) {
    let Some(answer) = answer else { return std::future::pending().await };
    let mut answered = answer.answered.clone();
    if answered.wait_for(|answered| *answered).await.is_err() {
        std::future::pending::<()>().await;
    }
}

pub(super) struct Registration {
    pub(super) id: u64,
    pub(super) registry: Weak<Registry>,
    pub(super) pull: Arc<Registered>,
}

impl Registration {
    /// A registration no poller serves (tests).
    #[cfg(test)]
    fn detached() -> Self {
        let pull = Registered {
            image: String::new(),
            reference: Arc::new(ImageReference::parse("example.test/detached").expect("a valid reference")),
            started_at: SystemTime::now(),
            waiting: WaitingPods::default(),
            reports: watch::channel(None).0,
            keep_in: None,
            lease_above: None,
            activity: watch::channel(None).0,
            events: Arc::new(Events::default()),
            told_all: AtomicBool::new(false),
        };
        Self { id: 0, registry: Weak::new(), pull: Arc::new(pull) }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(registry) = self.registry.upgrade() {
            registry.pulls().remove(&self.id);
        }
    }
}
