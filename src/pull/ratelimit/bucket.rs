//! A token bucket, told the time: `qps` tokens a second, at most `burst` held.

use std::time::Duration;

use tokio::time::Instant;

use super::RateLimit;

#[derive(Debug, Clone)]
pub struct TokenBucket {
    limit: RateLimit,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A bucket of `limit`, full at `now`.
    pub fn full(limit: RateLimit, now: Instant) -> Self {
        Self { limit, tokens: f64::from(limit.burst.get()), at: now }
    }

    /// A bucket of `limit`, empty at `now`.
    pub fn empty(limit: RateLimit, now: Instant) -> Self {
        Self { limit, tokens: 0.0, at: now }
    }

    pub fn limit(&self) -> RateLimit {
        self.limit
    }

    /// The tokens at `now`, with the fraction of the next one refilled.
    pub fn tokens(&self, now: Instant) -> f64 {
        let refilled = now.saturating_duration_since(self.at).as_secs_f64() * self.limit.qps;
        (self.tokens + refilled).min(f64::from(self.limit.burst.get()))
    }

    /// Takes a token; `Err` says how long until one is there.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        self.tokens = self.tokens(now);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        Err(Duration::from_secs_f64(((1.0 - self.tokens) / self.limit.qps).min(1e9)))
    }

    /// Refills at `limit` from `now` on, keeping the tokens it has (up to the new burst).
    pub fn set_limit(&mut self, limit: RateLimit, now: Instant) {
        self.tokens = self.tokens(now).min(f64::from(limit.burst.get()));
        self.at = now;
        self.limit = limit;
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;

    fn limit(qps: f64, burst: u32) -> RateLimit {
        RateLimit { qps, burst: NonZeroU32::new(burst).expect("a burst") }
    }

    #[test]
    fn it_refills_at_its_rate_up_to_its_burst_and_says_when_the_next_token_comes() {
        let start = Instant::now();
        let mut bucket = TokenBucket::full(limit(4.0, 2), start);
        assert_eq!((bucket.take(start), bucket.take(start)), (Ok(()), Ok(())));
        assert_eq!(bucket.take(start), Err(Duration::from_millis(250)));
        let later = start + Duration::from_millis(125);
        assert_eq!(bucket.tokens(later), 0.5);
        assert_eq!(bucket.take(later), Err(Duration::from_millis(125)));
        assert_eq!(bucket.tokens(start + Duration::from_secs(60)), 2.0, "never above the burst");
    }

    #[test]
    fn a_new_limit_keeps_the_tokens_up_to_its_burst() {
        let start = Instant::now();
        let mut bucket = TokenBucket::full(limit(5.0, 10), start);
        bucket.set_limit(limit(0.5, 1), start);
        assert_eq!(bucket.tokens(start), 1.0);
        assert_eq!(bucket.take(start), Ok(()));
        assert_eq!(bucket.take(start), Err(Duration::from_secs(2)));
    }
}
