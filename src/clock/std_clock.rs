use std::time::Instant;

use crate::clock::Clock;

/// `std::time::Instant` as a [`Clock`]: nanoseconds since the clock was made.
///
/// Portable and monotonic; costs one `clock_gettime(CLOCK_MONOTONIC)` through the vDSO on Linux,
/// slower than [`QuantaClock`](crate::QuantaClock)'s TSC read. Readings saturate at `u64::MAX` ns
/// (584 years after creation).
#[derive(Debug, Clone, Copy)]
pub struct StdClock {
    origin: Instant,
}

impl StdClock {
    /// A clock whose origin is now.
    pub fn new() -> StdClock {
        StdClock {
            origin: Instant::now(),
        }
    }
}

impl Default for StdClock {
    fn default() -> StdClock {
        StdClock::new()
    }
}

impl Clock for StdClock {
    #[inline]
    fn now(&self) -> u64 {
        let ns = self.origin.elapsed().as_nanos();
        u64::try_from(ns).unwrap_or(u64::MAX)
    }

    /// `Instant` is monotonic.
    #[inline]
    fn is_monotonic(&self) -> bool {
        true
    }
}
