//! One registry's circuit breaker, as a pure state machine that is told the time.
//!
//! Closed, it counts the pulls that failed to reach the registry in a row (within a window);
//! at the limit it opens, and pulls from the registry are refused at once for a cool-down. Then
//! it is half-open: the next pull to start is its probe, every other is refused while the probe
//! runs, and the probe's outcome closes it or opens it again. It only ever refuses a pull about
//! to queue or start: a pull already running ends on its own.

use std::{num::NonZeroU32, sync::Arc, time::Duration};

use tokio::time::Instant;

/// When a registry's breaker opens, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Pulls failing to reach a registry in a row that open its breaker; `None` turns it off.
    pub failures: Option<NonZeroU32>,
    /// A failure further than this from the one before starts the count again.
    pub window: Duration,
    /// How long an open breaker refuses pulls before one pull tests the registry.
    pub cooldown: Duration,
}

impl Default for BreakerConfig {
    /// 5 failures in a row, each within two minutes of the last, open it for 30 s.
    fn default() -> Self {
        Self { failures: NonZeroU32::new(5), window: Duration::from_secs(120), cooldown: Duration::from_secs(30) }
    }
}

/// Where the breaker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Closed,
    /// Refusing pulls until `until`.
    Open {
        until: Instant,
    },
    /// Cooled down: one pull at a time tests the registry.
    HalfOpen {
        probing: bool,
    },
}

impl Phase {
    /// How GetStatus and the metrics name it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open { .. } => "open",
            Self::HalfOpen { .. } => "half-open",
        }
    }
}

/// Where a pull is when it asks to go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// About to wait for a pull slot.
    Queue,
    /// Holding a slot, about to call the runtime.
    Start,
}

/// The breaker's answer to a pull.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    Admitted,
    /// Admitted as the half-open breaker's one test of the registry.
    Probe,
    Refused(Refusal),
}

/// Why a pull was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// When the breaker lets a pull test the registry; `None` while one is testing it.
    pub until: Option<Instant>,
    /// The failures in a row that opened it.
    pub failures: u32,
    /// The last of them.
    pub last: Arc<str>,
}

/// How a pull from the registry ended, as far as the registry's health goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The registry answered (the pull worked, or the registry said why not).
    Answered,
    /// The registry could not be reached: refused, DNS, TLS, a timeout, a 5xx.
    Unreachable(Arc<str>),
    /// Says nothing about the registry (cancelled, rate limited here, the runtime failed).
    NoVerdict,
}

/// A change the daemon reports (an event, a log line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Opened { failures: u32, last: Arc<str>, until: Instant },
    Closed,
}

/// One registry's breaker.
#[derive(Debug, Clone)]
pub struct Breaker {
    phase: Phase,
    /// Failures in a row, and when the last of them was.
    failures: u32,
    last_failure_at: Option<Instant>,
    last_failure: Option<Arc<str>>,
}

impl Default for Breaker {
    fn default() -> Self {
        Self { phase: Phase::Closed, failures: 0, last_failure_at: None, last_failure: None }
    }
}

impl Breaker {
    /// The phase at `now` (an open breaker past its cool-down is half-open).
    pub fn phase(&self, now: Instant) -> Phase {
        match self.phase {
            Phase::Open { until } if now >= until => Phase::HalfOpen { probing: false },
            phase => phase,
        }
    }

    pub fn failures(&self) -> u32 {
        self.failures
    }

    pub fn last_failure(&self) -> Option<&Arc<str>> {
        self.last_failure.as_ref()
    }

    /// Whether it holds nothing worth keeping: closed, with no failure counted.
    pub fn is_idle(&self) -> bool {
        self.phase == Phase::Closed && self.failures == 0
    }

    /// Whether a pull at `stage` may go on.
    pub fn admit(&mut self, stage: Stage, now: Instant) -> Admission {
        self.phase = self.phase(now);
        match (self.phase, stage) {
            (Phase::Closed, _) | (Phase::HalfOpen { probing: false }, Stage::Queue) => Admission::Admitted,
            (Phase::HalfOpen { probing: false }, Stage::Start) => {
                self.phase = Phase::HalfOpen { probing: true };
                Admission::Probe
            }
            (Phase::Open { until }, _) => Admission::Refused(self.refusal(Some(until))),
            (Phase::HalfOpen { probing: true }, _) => Admission::Refused(self.refusal(None)),
        }
    }

    fn refusal(&self, until: Option<Instant>) -> Refusal {
        let last = self.last_failure.clone().unwrap_or_else(|| Arc::from("no answer"));
        Refusal { until, failures: self.failures, last }
    }

    /// A pull that was admitted (`probe` if it was the probe) ended with `outcome`.
    pub fn ended(&mut self, outcome: Outcome, probe: bool, now: Instant, config: &BreakerConfig) -> Option<Change> {
        self.phase = self.phase(now);
        match outcome {
            Outcome::Answered => {
                let was_open = self.phase != Phase::Closed;
                *self = Self::default();
                was_open.then_some(Change::Closed)
            }
            Outcome::NoVerdict => {
                if probe && self.phase == (Phase::HalfOpen { probing: true }) {
                    self.phase = Phase::HalfOpen { probing: false };
                }
                None
            }
            Outcome::Unreachable(message) => self.failed(message, probe, now, config),
        }
    }

    fn failed(&mut self, message: Arc<str>, probe: bool, now: Instant, config: &BreakerConfig) -> Option<Change> {
        if self.last_failure_at.is_none_or(|last| now.saturating_duration_since(last) > config.window) {
            self.failures = 0;
        }
        self.last_failure_at = Some(now);
        self.failures = self.failures.saturating_add(1);
        self.last_failure = Some(message.clone());
        let limit = config.failures?;
        let open = match self.phase {
            Phase::Closed => self.failures >= limit.get(),
            // The probe failed: the registry is still down. A pull admitted before the breaker
            // opened that fails now says nothing new.
            Phase::HalfOpen { probing: true } => probe,
            Phase::HalfOpen { probing: false } | Phase::Open { .. } => false,
        };
        if !open {
            return None;
        }
        let until = now + config.cooldown;
        self.phase = Phase::Open { until };
        Some(Change::Opened { failures: self.failures, last: message, until })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(failures: u32) -> BreakerConfig {
        BreakerConfig {
            failures: NonZeroU32::new(failures),
            window: Duration::from_secs(60),
            cooldown: Duration::from_secs(30),
        }
    }

    fn unreachable() -> Outcome {
        Outcome::Unreachable(Arc::from("dial tcp 10.0.0.1:443: connect: connection refused"))
    }

    #[test]
    fn it_opens_after_the_configured_failures_in_a_row_and_refuses_until_the_cooldown_ends() {
        let (config, start) = (config(3), Instant::now());
        let mut breaker = Breaker::default();
        for at in 0..2 {
            assert_eq!(breaker.admit(Stage::Start, start), Admission::Admitted);
            assert_eq!(breaker.ended(unreachable(), false, start + Duration::from_secs(at), &config), None);
        }
        let third = start + Duration::from_secs(2);
        let opened = breaker.ended(unreachable(), false, third, &config);
        let until = third + Duration::from_secs(30);
        assert!(matches!(opened, Some(Change::Opened { failures: 3, until: at, .. }) if at == until));
        let Admission::Refused(refusal) = breaker.admit(Stage::Queue, third + Duration::from_secs(29)) else {
            panic!("an open breaker refuses a pull about to queue");
        };
        assert_eq!((refusal.until, refusal.failures), (Some(until), 3));
        assert!(refusal.last.contains("connection refused"));
        assert_eq!(breaker.phase(until), Phase::HalfOpen { probing: false });
    }

    #[test]
    fn an_answer_starts_the_count_again_and_so_do_failures_further_apart_than_the_window() {
        let (config, start) = (config(2), Instant::now());
        let mut breaker = Breaker::default();
        breaker.ended(unreachable(), false, start, &config);
        breaker.ended(Outcome::Answered, false, start, &config);
        assert_eq!(breaker.ended(unreachable(), false, start, &config), None, "one failure since the answer");
        let later = start + Duration::from_secs(61);
        assert_eq!(breaker.ended(unreachable(), false, later, &config), None, "too long after the one before");
        let next = later + Duration::from_secs(59);
        assert!(matches!(breaker.ended(unreachable(), false, next, &config), Some(Change::Opened { .. })));
    }

    #[test]
    fn half_open_lets_one_probe_start_and_its_outcome_decides() {
        let (config, start) = (config(1), Instant::now());
        let mut breaker = Breaker::default();
        breaker.ended(unreachable(), false, start, &config);
        let cooled = start + Duration::from_secs(30);
        assert_eq!(breaker.admit(Stage::Queue, cooled), Admission::Admitted, "may queue for a slot");
        assert_eq!(breaker.admit(Stage::Start, cooled), Admission::Probe);
        let Admission::Refused(refusal) = breaker.admit(Stage::Start, cooled) else {
            panic!("a second pull is refused while the probe runs");
        };
        assert_eq!(refusal.until, None);
        // The probe failing opens it for another cool-down.
        let opened = breaker.ended(unreachable(), true, cooled, &config);
        assert!(matches!(opened, Some(Change::Opened { until, .. }) if until == cooled + config.cooldown));
        let again = cooled + config.cooldown;
        assert_eq!(breaker.admit(Stage::Start, again), Admission::Probe);
        assert_eq!(breaker.ended(Outcome::Answered, true, again, &config), Some(Change::Closed));
        assert_eq!(breaker.admit(Stage::Start, again), Admission::Admitted);
        assert!(breaker.is_idle());
    }

    #[test]
    fn a_probe_that_ends_without_a_verdict_lets_the_next_pull_probe() {
        let (config, start) = (config(1), Instant::now());
        let mut breaker = Breaker::default();
        breaker.ended(unreachable(), false, start, &config);
        let cooled = start + config.cooldown;
        assert_eq!(breaker.admit(Stage::Start, cooled), Admission::Probe);
        assert_eq!(breaker.ended(Outcome::NoVerdict, true, cooled, &config), None);
        assert_eq!(breaker.admit(Stage::Start, cooled), Admission::Probe);
    }

    #[test]
    fn a_pull_admitted_before_it_opened_neither_reopens_nor_closes_it_by_failing() {
        let (config, start) = (config(1), Instant::now());
        let mut breaker = Breaker::default();
        breaker.ended(unreachable(), false, start, &config);
        let cooled = start + config.cooldown;
        assert_eq!(breaker.admit(Stage::Start, cooled), Admission::Probe);
        assert_eq!(breaker.ended(unreachable(), false, cooled, &config), None, "not the probe");
        assert_eq!(breaker.phase(cooled), Phase::HalfOpen { probing: true });
    }

    #[test]
    fn turned_off_it_counts_but_never_opens() {
        let (config, start) = (config(0), Instant::now());
        let mut breaker = Breaker::default();
        for _ in 0..100 {
            assert_eq!(breaker.ended(unreachable(), false, start, &config), None);
        }
        assert_eq!(breaker.admit(Stage::Start, start), Admission::Admitted);
        assert_eq!(breaker.failures(), 100);
    }
}
