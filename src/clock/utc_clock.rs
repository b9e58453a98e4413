use std::time::{SystemTime, UNIX_EPOCH};

use crate::clock::Clock;

/// The system's wall clock as a [`Clock`]: nanoseconds since the Unix epoch, UTC, for limiters
/// whose windows are the calendar's ([`CalendarWindow`](crate::CalendarWindow)).
///
/// Not monotonic: an NTP step or an operator moves it either way. Readings before the epoch are
/// 0, and past 2554 saturate at `u64::MAX`.
///
/// # Examples
///
/// ```
/// use atomic_limiter::{Clock, UtcClock};
///
/// let since_epoch = UtcClock::new().now();
/// assert!(since_epoch > 1_700_000_000_000_000_000); // after November 2023
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct UtcClock;

impl UtcClock {
    /// The system clock.
    pub fn new() -> UtcClock {
        UtcClock
    }
}

impl Clock for UtcClock {
    #[inline]
    fn now(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }

    /// The wall clock can step back.
    #[inline]
    fn is_monotonic(&self) -> bool {
        false
    }
}
