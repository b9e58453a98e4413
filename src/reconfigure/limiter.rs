//! [`Reconfigurable`]: one limiter ([`Limiter`]) whose quota changes at run time.

use super::cell::Cells;

use crate::clock::Clock;
#[cfg(feature = "quanta")]
use crate::clock::DefaultClock;
use crate::clock::DefaultClockOrNone;
use crate::decision::Decision;
use crate::limiter::Limiter;
use crate::limiter::algorithm::Carry;
use crate::limiter::algorithm::{Continuous, Retunable};
use crate::quota::InsufficientCapacity;
use crate::quota::{Quota, QuotaError};
use crate::rate_limiter::RateLimiter;
use core::convert::Infallible;

/// A limiter whose quota can change at run time, from any thread, while others check.
///
/// It runs the algorithm `A` ([`Gcra`](crate::Gcra)'s, `Reconfigurable<GcraAlgorithm>`,
/// [`TokenBucket`](crate::TokenBucket)'s, or a window's, built with
/// [`Reconfigurable::try_with_clock`]) on the clock `C`, and keeps its state across a change
/// as [`Carry`] says. A check is the plain
/// limiter's check plus a pointer load and two stores to its thread's slot (no lock, no
/// read-modify-write; a full fence too where the kernel cannot put the barrier on every
/// thread, outside Linux; a thread's first check registers its slot, one small allocation). A
/// change allocates the new quota's cell, takes a mutex that only changes take, and notes the
/// checks already running without waiting for them (on Linux it asks the kernel for one
/// barrier on every thread, `membarrier(2)`); the cell they read is freed once they end, by a
/// later change or with the limiter: 0.5 µs with no check running, about 16 µs (median) with
/// three threads checking on two cores. A clock that changes a quota when read, this
/// limiter's or another's, is served: no change waits on anything its own thread holds.
///
/// Exact under races: no check decides on one quota's parameters and another's state, and
/// every admission made on the old quota is in the state carried over. `docs/design.md` has
/// the argument and `loom-tests` the model.
///
/// # Examples
///
/// A tenant upgrades from 2 to 10 per second; what it spent stays spent, as time:
///
/// ```
/// use atomic_limiter::algorithm::GcraAlgorithm;
/// use atomic_limiter::{Carry, ManualClock, Quota, Reconfigurable};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let tenant: Reconfigurable<GcraAlgorithm, _> =
///     Reconfigurable::with_clock(Quota::per_second(2), clock.clone());
/// assert_eq!((0..5).filter(|_| tenant.check().is_allowed()).count(), 2);
///
/// // Both tokens spent: full again in one second, which the debt carries over.
/// tenant.set_quota(Quota::per_second(10), Carry::Debt);
/// assert!(tenant.check().is_denied());
/// clock.advance(Duration::from_millis(100));
/// assert!(tenant.check().is_allowed());
/// assert_eq!(tenant.quota().burst(), 10);
/// ```
pub struct Reconfigurable<A, C = DefaultClockOrNone> {
    pub(super) cells: Cells<Limiter<A, C>>,
}

impl<A, C> core::fmt::Debug for Reconfigurable<A, C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Reconfigurable").finish_non_exhaustive()
    }
}

#[cfg(feature = "quanta")]
impl<A: Retunable + Continuous + 'static> Reconfigurable<A, DefaultClock> {
    /// A full limiter for `quota` on the default clock.
    pub fn new(quota: Quota) -> Self {
        Reconfigurable::with_clock(quota, DefaultClock::new())
    }
}

#[cfg(feature = "quanta")]
impl<A: Retunable + 'static> Reconfigurable<A, DefaultClock> {
    /// A full limiter for `quota` on the default clock, for any algorithm (a window's limit
    /// can be too large for its packed counts).
    ///
    /// # Errors
    ///
    /// [`QuotaError::LimitTooLarge`] if the algorithm cannot serve `quota`.
    pub fn try_new(quota: Quota) -> Result<Self, QuotaError> {
        Reconfigurable::try_with_clock(quota, DefaultClock::new())
    }
}

impl<A, C> Reconfigurable<A, C>
where
    A: Retunable + Continuous + 'static,
    C: Clock + Clone + Send + Sync + 'static,
{
    /// A full limiter for `quota` on `clock`.
    pub fn with_clock(quota: Quota, clock: C) -> Self {
        Reconfigurable {
            cells: Cells::new(Limiter::continuous(quota, clock)),
        }
    }

    /// Changes the quota, carrying the state over as `carry` says. Checks racing the change
    /// are decided on the old quota or the new one, each on its own state; none is lost.
    pub fn set_quota(&self, quota: Quota, carry: Carry) {
        let build = |old: &Limiter<A, C>| {
            Ok::<_, Infallible>(Limiter::continuous(quota, old.clock().clone()))
        };
        match self.cells.replace(build, carry, true) {
            Ok(()) => {}
            Err(never) => match never {},
        }
    }

    /// For the loom models' teeth: a change that reads the old word instead of retiring it,
    /// as swapping limiters behind a lock does, so a check racing it can admit on the old
    /// cell after its word was carried over.
    #[cfg(atomic_limiter_loom)]
    pub(crate) fn loom_broken_set_quota(&self, quota: Quota, carry: Carry) {
        let build = |old: &Limiter<A, C>| {
            Ok::<_, Infallible>(Limiter::continuous(quota, old.clock().clone()))
        };
        match self.cells.replace(build, carry, false) {
            Ok(()) => {}
            Err(never) => match never {},
        }
    }
}

impl<A, C> Reconfigurable<A, C>
where
    A: Retunable + 'static,
    C: Clock + Clone + Send + Sync + 'static,
{
    /// A full limiter for `quota` on `clock`, for any algorithm: the windows
    /// ([`FixedWindow`](crate::FixedWindow)'s `Reconfigurable<WindowAlgorithm<Fixed>>`,
    /// [`SlidingWindowCounter`](crate::SlidingWindowCounter)'s) as well as GCRA and the
    /// token bucket.
    ///
    /// # Errors
    ///
    /// [`QuotaError::LimitTooLarge`] if the algorithm cannot serve `quota` (a window's limit
    /// too large for its packed counts).
    pub fn try_with_clock(quota: Quota, clock: C) -> Result<Self, QuotaError> {
        Ok(Reconfigurable {
            cells: Cells::new(Limiter::try_with_clock(quota, clock)?),
        })
    }

    /// [`Reconfigurable::set_quota`] for any algorithm: a window's counts carry over (see
    /// [`Carry`]).
    ///
    /// # Examples
    ///
    /// An incident halves a fixed window's limit; what was admitted in this window stays
    /// counted:
    ///
    /// ```
    /// use atomic_limiter::algorithm::{Fixed, WindowAlgorithm};
    /// use atomic_limiter::{Carry, ManualClock, Quota, Reconfigurable};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let api: Reconfigurable<WindowAlgorithm<Fixed>, _> =
    ///     Reconfigurable::try_with_clock(Quota::per_second(10), clock.clone())?;
    /// assert_eq!((0..6).filter(|_| api.check().is_allowed()).count(), 6);
    /// api.try_set_quota(Quota::per_second(5), Carry::Debt)?;
    /// assert!(api.check().is_denied()); // 6 counted, at least the new limit
    /// clock.advance(Duration::from_secs(1)); // the same grid: the next window is fresh
    /// assert_eq!((0..10).filter(|_| api.check().is_allowed()).count(), 5);
    /// # Ok::<(), atomic_limiter::QuotaError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`QuotaError::LimitTooLarge`] if the algorithm cannot serve `quota`; the quota in
    /// force and its state are then left as they were.
    pub fn try_set_quota(&self, quota: Quota, carry: Carry) -> Result<(), QuotaError> {
        self.cells.replace(
            |old| Limiter::try_with_clock(quota, old.clock().clone()),
            carry,
            true,
        )
    }

    /// Asks for `n` tokens, all or nothing, on the quota in force; `n = 0` peeks.
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] if `n` exceeds the burst of the quota in force.
    #[inline(always)]
    pub fn check_n(&self, n: u32) -> Result<Decision, InsufficientCapacity> {
        self.cells.check_n(n)
    }

    /// Asks for one token on the quota in force.
    #[inline(always)]
    pub fn check(&self) -> Decision {
        self.cells.check()
    }

    /// The quota in force (by value: it may change right after).
    pub fn quota(&self) -> Quota {
        self.cells.quota()
    }
}

/// The plain limiter's trait on the quota in force: [`Shadow`](crate::shadow::Shadow),
/// `Instrumented`, [`RateLimiter::wait_n`] and [`RateLimiter::until_n_ready_with`] wrap it
/// (a change of quota while one waits applies to its next try).
impl<A, C> RateLimiter for Reconfigurable<A, C>
where
    A: Retunable + 'static,
    C: Clock + Clone + Send + Sync + 'static,
{
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
