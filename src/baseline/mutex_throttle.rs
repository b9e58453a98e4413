use core::time::Duration;
use std::sync::Mutex;

use crate::baseline::lock::BaselineLock;
use crate::clock::Clock;
use crate::gcra::math::{self, GcraParams};
use crate::gcra::throttle::ThrottleError;
use crate::quota::Quota;

/// [`Throttle`](crate::Throttle)'s reservation maths behind a lock, the way a textbook throttler
/// keeps its next slot under a mutex. For benchmarks and differential tests.
///
/// # Examples
///
/// It hands out the same slots:
///
/// ```
/// use atomic_limiter::baseline::MutexThrottle;
/// use atomic_limiter::{ManualClock, Quota, Throttle};
/// use std::time::Duration;
///
/// let q = Quota::per_second(4).with_burst(1);
/// let locked: MutexThrottle<_> = MutexThrottle::with_clock(q, ManualClock::new());
/// let free = Throttle::with_clock(q, ManualClock::new());
/// for _ in 0..5 {
///     assert_eq!(locked.reserve(Duration::MAX), free.reserve(Duration::MAX).map(|r| r.wait()));
/// }
/// ```
#[derive(Debug)]
pub struct MutexThrottle<C, L = Mutex<u64>> {
    tat: L,
    params: GcraParams,
    clock: C,
}

impl<C: Clock, L: BaselineLock<u64>> MutexThrottle<C, L> {
    /// As [`Throttle::with_clock`](crate::Throttle::with_clock).
    pub fn with_clock(quota: Quota, clock: C) -> Self {
        let params = GcraParams::new(&quota);
        MutexThrottle {
            tat: L::new(params.units(clock.now())),
            params,
            clock,
        }
    }

    /// As [`Throttle::reserve`](crate::Throttle::reserve).
    ///
    /// # Errors
    ///
    /// As [`Throttle::reserve_n`](crate::Throttle::reserve_n).
    pub fn reserve(&self, max_wait: Duration) -> Result<Duration, ThrottleError> {
        self.reserve_n(1, max_wait)
    }

    /// As [`Throttle::reserve_n`](crate::Throttle::reserve_n), answering the wait alone.
    ///
    /// # Errors
    ///
    /// As [`Throttle::reserve_n`](crate::Throttle::reserve_n).
    pub fn reserve_n(&self, n: u32, max_wait: Duration) -> Result<Duration, ThrottleError> {
        self.params.within_burst(n)?;
        let max = self.params.queue_limit(max_wait);
        let now = self.params.units(self.clock.now());
        let reserved = self.tat.with(|tat| {
            let r = math::reserve(*tat, now, n, &self.params, max);
            if let Ok((new, _)) = r {
                *tat = new;
            }
            r.map(|(_, wait)| wait)
        });
        reserved
            .map(|wait| self.params.duration(wait))
            .map_err(|wait| ThrottleError::WouldWait(self.params.duration(wait)))
    }
}
