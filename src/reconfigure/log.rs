//! [`ReconfigurableLog`]: a [`SlidingWindowLog`] whose quota changes at run time.

use super::cell::{Cells, Content};
use crate::clock::Clock;
#[cfg(feature = "quanta")]
use crate::clock::DefaultClock;
use crate::clock::DefaultClockOrNone;
use crate::decision::Decision;
use crate::limiter::algorithm::Carry;
use crate::quota::InsufficientCapacity;
use crate::quota::{Quota, QuotaError};
use crate::rate_limiter::RateLimiter;
use crate::sync::AtomicBool;
use crate::window::log::SlidingWindowLog;

impl<C: Clock> Content for SlidingWindowLog<C> {
    fn quota(&self) -> Quota {
        RateLimiter::quota(self)
    }

    #[inline]
    fn capacity(&self) -> u32 {
        // At most `SlidingWindowLog::MAX_LIMIT`, 2^20.
        RateLimiter::quota(self).rate() as u32
    }

    #[inline(always)]
    fn check_live(&self, n: u32, retired: &AtomicBool) -> Option<Decision> {
        SlidingWindowLog::check_live(self, n, retired)
    }

    fn now(&self) -> u64 {
        self.clock().now()
    }

    fn retire_into(
        &self,
        retired: &AtomicBool,
        new: &mut Self,
        carry: Carry,
        retire: bool,
        at: u64,
    ) {
        let proportional = matches!(carry, Carry::Proportional);
        SlidingWindowLog::retire_into(self, retired, new, proportional, retire, at);
    }
}

/// A [`SlidingWindowLog`] (exact: at most `limit` admissions in any span of the window) whose
/// quota changes at run time, from any thread, while others check.
///
/// The log locks on every check, and so does a change, under the same lock: it marks the old log
/// retired and carries its admission times into the new one (see [`Carry`]: the newest as many as
/// the new limit allows, or the count in the window scaled to it). A check that finds the old log
/// retired moves to the new one. The log is reached as the other reconfigurable limiters reach
/// their cell: a pointer load and two thread-local stores on top of the plain check.
///
/// # Examples
///
/// ```
/// use atomic_limiter::{Carry, ManualClock, Quota, ReconfigurableLog};
///
/// let clock = ManualClock::new();
/// let log = ReconfigurableLog::try_with_clock(Quota::per_second(4), clock.clone())?;
/// assert_eq!((0..6).filter(|_| log.check().is_allowed()).count(), 4);
/// // Halved: the four admissions of this second are more than the new limit.
/// log.try_set_quota(Quota::per_second(2), Carry::Debt)?;
/// assert!(log.check().is_denied());
/// # Ok::<(), atomic_limiter::QuotaError>(())
/// ```
pub struct ReconfigurableLog<C = DefaultClockOrNone> {
    cells: Cells<SlidingWindowLog<C>>,
}

impl<C> core::fmt::Debug for ReconfigurableLog<C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ReconfigurableLog").finish_non_exhaustive()
    }
}

#[cfg(feature = "quanta")]
impl ReconfigurableLog<DefaultClock> {
    /// At most `quota.rate()` admissions in any span of `quota.per()`, on the default clock.
    ///
    /// # Errors
    ///
    /// [`QuotaError::LimitTooLarge`] above [`SlidingWindowLog::MAX_LIMIT`].
    pub fn try_new(quota: Quota) -> Result<Self, QuotaError> {
        ReconfigurableLog::try_with_clock(quota, DefaultClock::new())
    }
}

impl<C: Clock + Clone + Send + Sync + 'static> ReconfigurableLog<C> {
    /// At most `quota.rate()` admissions in any span of `quota.per()`, on `clock`.
    ///
    /// # Errors
    ///
    /// [`QuotaError::LimitTooLarge`] above [`SlidingWindowLog::MAX_LIMIT`].
    pub fn try_with_clock(quota: Quota, clock: C) -> Result<Self, QuotaError> {
        Ok(ReconfigurableLog {
            cells: Cells::new(SlidingWindowLog::with_clock(quota, clock)?),
        })
    }

    /// Changes the quota, carrying the admission times over as `carry` says.
    ///
    /// # Errors
    ///
    /// [`QuotaError::LimitTooLarge`] above [`SlidingWindowLog::MAX_LIMIT`]; the quota in force
    /// and its log are then left as they were.
    pub fn try_set_quota(&self, quota: Quota, carry: Carry) -> Result<(), QuotaError> {
        let build =
            |old: &SlidingWindowLog<C>| SlidingWindowLog::with_clock(quota, old.clock().clone());
        self.cells.replace(build, carry, true)
    }

    /// Asks for one admission on the quota in force.
    pub fn check(&self) -> Decision {
        self.cells.check()
    }

    /// Asks for `n` admissions at once, all or nothing, on the quota in force; `n = 0` peeks.
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] if `n` exceeds the limit in force.
    pub fn check_n(&self, n: u32) -> Result<Decision, InsufficientCapacity> {
        self.cells.check_n(n)
    }

    /// The quota in force (by value: it may change right after).
    pub fn quota(&self) -> Quota {
        self.cells.quota()
    }
}

/// The plain limiter's trait on the quota in force, so that [`Shadow`](crate::shadow::Shadow),
/// `Instrumented` and the waits of [`RateLimiter`] wrap it.
impl<C: Clock + Clone + Send + Sync + 'static> RateLimiter for ReconfigurableLog<C> {
    #[inline(always)]
    fn check(&self) -> Decision {
        self.cells.check()
    }

    #[inline(always)]
    fn check_n(&self, n: u32) -> Result<Decision, InsufficientCapacity> {
        self.cells.check_n(n)
    }

    fn quota(&self) -> Quota {
        self.cells.quota()
    }
}
