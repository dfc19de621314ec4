//! Refusals counted, not each logged (issue 59): the first refusal of a method by a caller in an
//! interval is logged, the rest are counted and summarised once per interval, so that a caller
//! making noise cannot crowd the daemon's audit lines out of the journal. Pure: `now` is passed in.

use std::collections::HashMap;

use tokio::time::{Duration, Instant};

/// How long one logged refusal stands for the same caller and method. Short enough that a
/// summary follows a flood while it is still news; long enough that one caller costs the journal
/// (10,000 lines per 30 s per unit by default) a few lines per interval, not thousands.
pub const INTERVAL: Duration = Duration::from_secs(10);

/// The most callers tracked one by one in an interval: a flood from ever new pids must not grow
/// memory (or lines) without bound. Refusals of callers beyond it are counted together.
pub const MAX_CALLERS: usize = 1024;

/// The most method names one summary lists; the others are "and N more".
pub const MAX_NAMED: usize = 4;

/// Who was refused, as the kernel named it; `pid` is `None` for a caller in another PID namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CallerKey {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub pid: Option<i32>,
}

/// Whether a refusal is logged now or only counted toward the interval's summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Log,
    Count,
}

/// What was counted, not logged, for one caller (or the untracked ones) in an interval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// `None`: the callers beyond [`MAX_CALLERS`], together.
    pub caller: Option<CallerKey>,
    /// Refusals counted and not logged.
    pub suppressed: u64,
    /// The methods refused, in the order first counted.
    pub methods: Vec<&'static str>,
}

impl Summary {
    /// The methods, at most [`MAX_NAMED`] by name: `A, B, C, D and 3 more`.
    pub fn methods_named(&self) -> String {
        let named = self.methods.iter().take(MAX_NAMED).copied().collect::<Vec<_>>().join(", ");
        match self.methods.len().saturating_sub(MAX_NAMED) {
            0 => named,
            more => format!("{named} and {more} more"),
        }
    }
}

/// What one refusal decided: its verdict, and the summaries of the interval it closed, if any.
#[derive(Debug)]
pub struct Decision {
    pub verdict: Verdict,
    pub closed: Vec<Summary>,
}

/// One caller's interval. Its lists are bounded by the methods of the table.
#[derive(Debug, Default)]
struct Tally {
    /// Methods whose first refusal this interval was logged.
    logged: Vec<&'static str>,
    suppressed: u64,
    /// Methods counted, not logged.
    methods: Vec<&'static str>,
}

impl Tally {
    fn count(&mut self, method: &'static str) {
        self.suppressed += 1;
        if !self.methods.contains(&method) {
            self.methods.push(method);
        }
    }

    fn summary(self, caller: Option<CallerKey>) -> Option<Summary> {
        (self.suppressed > 0).then_some(Summary { caller, suppressed: self.suppressed, methods: self.methods })
    }
}

/// The refusals of the current interval.
#[derive(Debug)]
pub struct RefusalLog {
    started: Instant,
    callers: HashMap<CallerKey, Tally>,
    untracked: Tally,
}

impl RefusalLog {
    /// An empty log whose first interval starts at `now`.
    pub fn new(now: Instant) -> Self {
        Self { started: now, callers: HashMap::new(), untracked: Tally::default() }
    }

    /// Decides on `caller`'s refusal of `method` at `now`, first closing the interval if it is over.
    pub fn refused(&mut self, caller: CallerKey, method: &'static str, now: Instant) -> Decision {
        let closed = self.close_due(now);
        let tracked = self.callers.len() < MAX_CALLERS || self.callers.contains_key(&caller);
        let verdict = if tracked {
            let tally = self.callers.entry(caller).or_default();
            if tally.logged.contains(&method) {
                tally.count(method);
                Verdict::Count
            } else {
                tally.logged.push(method);
                Verdict::Log
            }
        } else {
            self.untracked.count(method);
            Verdict::Count
        };
        Decision { verdict, closed }
    }

    /// The summaries of the interval if it is over at `now` (then a new one starts), else none.
    pub fn close_due(&mut self, now: Instant) -> Vec<Summary> {
        if now.saturating_duration_since(self.started) < INTERVAL {
            return Vec::new();
        }
        self.close(now)
    }

    /// The summaries of the interval so far, ended at `now` whether over or not (at shutdown).
    pub fn close(&mut self, now: Instant) -> Vec<Summary> {
        self.started = now;
        let mut callers: Vec<_> = std::mem::take(&mut self.callers).into_iter().collect();
        // Sorted: the lines come out in the same order every time.
        callers.sort_unstable_by_key(|(caller, _)| *caller);
        let untracked = std::mem::take(&mut self.untracked);
        callers
            .into_iter()
            .filter_map(|(caller, tally)| tally.summary(Some(caller)))
            .chain(untracked.summary(None))
            .collect()
    }
}

#[cfg(test)]
mod tests;
