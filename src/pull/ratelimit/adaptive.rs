//! A registry's pull rate while it answers 429 (Docker Hub's pull limits): halved at each 429,
//! never below the floor, then raised by a tenth of its configured rate for each quiet period
//! without another, until it is back where it was configured (multiplicative decrease, additive
//! increase). Told the time.

use std::{num::NonZeroU32, time::Duration};

use tokio::time::Instant;

use super::{RateLimit, bucket::TokenBucket};

/// How a registry's rate adapts to its 429s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveConfig {
    /// The lowest rate, in pulls a second (above 0).
    pub floor: f64,
    /// After this long without a 429, the rate goes up a step; as long again, another.
    pub recovery: Duration,
}

impl Default for AdaptiveConfig {
    /// One pull every 10 s at the lowest; a step up every 30 s.
    fn default() -> Self {
        Self { floor: 0.1, recovery: Duration::from_secs(30) }
    }
}

/// The rate a registry without a limit of its own starts lowering from: the kubelet's default.
pub const UNLIMITED_START: RateLimit = RateLimit { qps: 5.0, burst: NonZeroU32::MIN };

/// A registry whose rate was lowered, and its bucket at that rate.
#[derive(Debug, Clone)]
pub struct Lowered {
    configured: RateLimit,
    pub bucket: TokenBucket,
    /// When the rate last changed, either way: the quiet period counts from it.
    last_change: Instant,
    /// When it was last halved: the 429s of one moment count once from it.
    last_lowered: Instant,
}

impl Lowered {
    /// After the first 429 of a registry limited to `configured`: half of it, starting empty
    /// (the pull that was refused had the moment's token).
    pub fn new(configured: RateLimit, now: Instant, config: &AdaptiveConfig) -> Self {
        let bucket = TokenBucket::empty(configured, now);
        let mut lowered = Self { configured, bucket, last_change: now, last_lowered: now };
        lowered.set(lowered.configured.qps / 2.0, now, config);
        lowered
    }

    pub fn configured(&self) -> RateLimit {
        self.configured
    }

    pub fn qps(&self) -> f64 {
        self.bucket.limit().qps
    }

    /// Another 429: halves the rate again, unless it was halved within the last second or one
    /// pull's time at its rate (the pulls that answered together were admitted together); a
    /// step up since does not shield it. Returns whether it changed.
    pub fn lower(&mut self, now: Instant, config: &AdaptiveConfig) -> bool {
        let settle = Duration::from_secs_f64((1.0 / self.qps()).clamp(1.0, 3600.0));
        if now.saturating_duration_since(self.last_lowered) < settle {
            return false;
        }
        let before = self.qps();
        self.set(before / 2.0, now, config);
        self.last_lowered = now;
        self.qps() < before
    }

    /// Raises the rate a step for each quiet period since the last change; `true` once it is
    /// back where it was configured (and the registry need not be followed any more).
    pub fn recover(&mut self, now: Instant, config: &AdaptiveConfig) -> bool {
        let step = self.configured.qps / 10.0;
        while now.saturating_duration_since(self.last_change) >= config.recovery {
            let at = self.last_change + config.recovery;
            self.set(self.qps() + step, at, config);
            // Steps of a tenth add up to a hair under the whole.
            if self.qps() >= self.configured.qps - step / 1000.0 {
                return true;
            }
        }
        false
    }

    /// A burst of one while lowered: a registry that refuses pulls gets them one at a time.
    fn set(&mut self, qps: f64, now: Instant, config: &AdaptiveConfig) {
        let qps = qps.max(config.floor).min(self.configured.qps);
        self.bucket.set_limit(RateLimit { qps, burst: NonZeroU32::MIN }, now);
        self.last_change = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configured() -> RateLimit {
        RateLimit { qps: 4.0, burst: NonZeroU32::new(10).expect("a burst") }
    }

    #[test]
    fn each_429_halves_the_rate_down_to_the_floor_but_answers_of_one_moment_count_once() {
        let (config, start) = (AdaptiveConfig { floor: 0.5, recovery: Duration::from_secs(30) }, Instant::now());
        let mut lowered = Lowered::new(configured(), start, &config);
        assert_eq!((lowered.qps(), lowered.bucket.limit().burst.get()), (2.0, 1));
        assert!(!lowered.lower(start + Duration::from_millis(900), &config), "the same moment's 429s");
        let mut at = start;
        for expected in [1.0, 0.5, 0.5] {
            at += Duration::from_secs(2);
            lowered.lower(at, &config);
            assert_eq!(lowered.qps(), expected);
        }
    }

    #[test]
    fn quiet_periods_raise_it_a_tenth_of_the_configured_rate_each_until_it_is_back() {
        let (config, start) = (AdaptiveConfig { floor: 0.1, recovery: Duration::from_secs(30) }, Instant::now());
        let mut lowered = Lowered::new(configured(), start, &config);
        assert!(!lowered.recover(start + Duration::from_secs(29), &config));
        assert_eq!(lowered.qps(), 2.0);
        assert!(!lowered.recover(start + Duration::from_secs(60), &config));
        assert!((lowered.qps() - 2.8).abs() < 1e-9, "two steps of 0.4: {}", lowered.qps());
        assert!(lowered.recover(start + Duration::from_secs(150), &config), "five steps make it whole");
    }

    #[test]
    fn a_429_just_after_a_step_up_halves_from_the_step() {
        let config = AdaptiveConfig { floor: 0.1, recovery: Duration::from_millis(500) };
        let start = Instant::now();
        let mut lowered = Lowered::new(configured(), start, &config);
        let after_step = start + Duration::from_millis(1100);
        lowered.recover(after_step, &config);
        assert!((lowered.qps() - 2.8).abs() < 1e-9, "two steps: {}", lowered.qps());
        assert!(lowered.lower(after_step, &config), "the step 100 ms ago does not count as a 429");
        assert!((lowered.qps() - 1.4).abs() < 1e-9);
    }

    #[test]
    fn a_429_while_recovering_halves_from_where_it_got_and_the_quiet_period_starts_again() {
        let (config, start) = (AdaptiveConfig::default(), Instant::now());
        let mut lowered = Lowered::new(configured(), start, &config);
        lowered.recover(start + Duration::from_secs(30), &config);
        let again = start + Duration::from_secs(45);
        assert!(lowered.lower(again, &config));
        assert!((lowered.qps() - 1.2).abs() < 1e-9);
        assert!(!lowered.recover(again + Duration::from_secs(29), &config));
        assert!((lowered.qps() - 1.2).abs() < 1e-9);
    }
}
