//! The waits between attempts to reach a peer (a collector to push to, an agent to pull
//! from): exponential with jitter while it stays unreachable, so that agents that lost the
//! collector together do not come back together, and back to the shortest after a success.
use std::time::Duration;

use backon::{BackoffBuilder as _, ExponentialBackoff, ExponentialBuilder};

pub struct Backoff {
    min: Duration,
    max: Duration,
    waits: ExponentialBackoff,
}

impl Backoff {
    /// Waits from `min` up to `max` (with jitter, each up to twice that).
    pub fn new(min: Duration, max: Duration) -> Backoff {
        Backoff { min, max, waits: Self::waits(min, max) }
    }

    fn waits(min: Duration, max: Duration) -> ExponentialBackoff {
        ExponentialBuilder::new().with_min_delay(min).with_max_delay(max).with_jitter().without_max_times().build()
    }

    /// The wait before the next attempt after a failure.
    pub fn next(&mut self) -> Duration {
        self.waits.next().unwrap_or(self.max)
    }

    /// After a success: the next failure waits the shortest again.
    pub fn reset(&mut self) {
        self.waits = Self::waits(self.min, self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_grow_to_the_maximum_and_start_over_after_a_reset() {
        let (min, max) = (Duration::from_millis(100), Duration::from_secs(2));
        let mut backoff = Backoff::new(min, max);
        let waits: Vec<Duration> = (0..10).map(|_| backoff.next()).collect();
        assert!(waits[0] >= min && waits[0] <= 2 * min, "{waits:?}");
        assert!(waits[9] >= max && waits[9] <= 2 * max, "{waits:?}");
        backoff.reset();
        assert!(backoff.next() <= 2 * min);
    }
}
