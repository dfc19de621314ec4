//! The one retry schedule of the daemon's loops (accepting, re-subscribing to the runtime's
//! events, settling the pull records): waits that double from a first one up to a longest.
//! The kubelet's per-(pod, image) pull backoff is domain logic and lives in [`crate::backoff`].

use std::time::Duration;

/// Doubling waits; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Doubling {
    first: Duration,
    longest: Duration,
    next: Duration,
}

impl Doubling {
    /// Waits of `first`, then twice as long each time, never longer than `longest`.
    pub const fn new(first: Duration, longest: Duration) -> Self {
        Self { first, longest, next: first }
    }

    /// The wait before the next try; the one after is twice as long (up to the longest).
    pub fn next_wait(&mut self) -> Duration {
        let wait = self.next;
        self.next = self.next.saturating_mul(2).min(self.longest);
        wait
    }

    /// Starts again from the first wait: the last try succeeded.
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_longest_and_start_again_after_a_reset() {
        let mut waits = Doubling::new(Duration::from_millis(10), Duration::from_millis(50));
        let taken: Vec<_> = (0..5).map(|_| waits.next_wait().as_millis()).collect();
        assert_eq!(taken, [10, 20, 40, 50, 50]);
        waits.reset();
        assert_eq!(waits.next_wait(), Duration::from_millis(10));
    }

    #[test]
    fn a_huge_longest_wait_never_overflows() {
        let mut waits = Doubling::new(Duration::from_secs(u64::MAX / 2 + 1), Duration::MAX);
        waits.next_wait();
        assert_eq!(waits.next_wait(), Duration::MAX);
    }
}
