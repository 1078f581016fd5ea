//! When to drain the kernel's buffers: every interval, moved to halfway between two ticks of
//! the on-CPU sampler's clock. Clock events tick at a fixed phase, set when they are opened,
//! and the governor re-opens them during a drain: drains at a whole number of periods from
//! there would have every tick fall while the agent itself runs, and while its map updates
//! keep the sampling program out (the kernel skips it then). At 1 Hz with 2 s intervals, the
//! governor test's threads lost a fifth of their on-CPU time so.
use std::time::Duration;

use tokio::time::Instant;

use crate::kernel::TickPhase;

pub struct DrainSchedule {
    every: Duration,
    /// The next drain's time before it is moved off the ticks.
    nominal: Instant,
}

impl DrainSchedule {
    pub fn new(every: Duration) -> DrainSchedule {
        DrainSchedule { every, nominal: Instant::now() + every }
    }

    /// When to drain next, given the sampler's ticks (None: it does not tick on a clock).
    pub fn next(&self, ticks: Option<TickPhase>) -> Instant {
        ticks.map_or(self.nominal, |ticks| Instant::from_std(ticks.between_ticks(self.nominal.into_std())))
    }

    /// A drain is done: the next is due an interval after this one was, or after now if
    /// this one ran that late.
    pub fn drained(&mut self) {
        self.nominal += self.every;
        let now = Instant::now();
        if self.nominal < now {
            self.nominal = now + self.every;
        }
    }
}
