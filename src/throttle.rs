use core::time::Duration;

use crate::clock::{Clock, is_coarse};
use crate::gcra_math::{self, GcraParams};
use crate::state_cell::{StateCell, Step};
use crate::{Decision, InsufficientCapacity, Quota, RateLimiter, Reservation, ThrottleError};

/// The leaky bucket as a **queue**: it spaces requests at the quota's pace instead of refusing
/// them. Reservations can be refunded ([`Throttle::reserve_refundable`]). Each caller reserves the next free slot with one compare-and-swap and learns how long to
/// wait before it may proceed (`Duration::ZERO` while the burst lasts).
///
/// The leaky bucket as a *meter* (refuse what overflows) is GCRA, that is [`Gcra`](crate::Gcra):
/// the same theoretical arrival time, where a check that would have to wait is refused instead.
/// Here the wait is handed to the caller, and the slot is theirs: a reservation is never refused
/// unless the wait would exceed the caller's maximum (then nothing is reserved).
///
/// # Examples
///
/// Two per second with no burst: slots every 500 ms.
///
/// ```
/// use atomic_limiter::{ManualClock, Quota, Throttle};
/// use std::time::Duration;
///
/// let t = Throttle::with_clock(Quota::per_second(2).with_burst(1), ManualClock::new());
/// let max = Duration::from_secs(10);
/// assert_eq!(t.reserve(max), Ok(Duration::ZERO));
/// assert_eq!(t.reserve(max), Ok(Duration::from_millis(500)));
/// assert_eq!(t.reserve(max), Ok(Duration::from_millis(1000)));
/// // Not willing to wait that long: nothing is reserved.
/// assert!(t.reserve(Duration::from_millis(100)).is_err());
/// assert_eq!(t.reserve(max), Ok(Duration::from_millis(1500)));
/// ```
#[derive(Debug)]
pub struct Throttle<C> {
    /// The next free slot (theoretical arrival time), in units of `1/scale` ns.
    tat: StateCell,
    params: GcraParams,
    quota: Quota,
    clock: C,
}

impl<C: Clock> Throttle<C> {
    /// A throttle on `clock` whose first `burst` slots are free now, then one per period.
    pub fn with_clock(quota: Quota, clock: C) -> Throttle<C> {
        let params = GcraParams::new(&quota);
        Throttle {
            tat: StateCell::new(params.units(clock.now())),
            params,
            quota,
            clock,
        }
    }

    /// Reserves one slot; returns how long to wait before using it.
    ///
    /// # Errors
    ///
    /// [`ThrottleError::WouldWait`] if the slot is more than `max_wait` away (nothing reserved).
    #[inline]
    pub fn reserve(&self, max_wait: Duration) -> Result<Duration, ThrottleError> {
        self.reserve_n(1, max_wait)
    }

    /// Reserves `n` tokens' worth of slots at once.
    ///
    /// # Errors
    ///
    /// [`ThrottleError::InsufficientCapacity`] if `n` exceeds the burst;
    /// [`ThrottleError::WouldWait`] if the wait would exceed `max_wait` (capped at about
    /// `2^61 / denominator` ns, 73 years for whole-nanosecond periods). Nothing is reserved.
    #[inline]
    pub fn reserve_n(&self, n: u32, max_wait: Duration) -> Result<Duration, ThrottleError> {
        self.params.within_burst(n)?;
        let now = self.params.units(self.clock.now());
        self.tat
            .update(self.reserve_step(now, n, self.params.queue_limit(max_wait)))
    }

    /// The reservation step at `now` (GCRA units), as `StateCell` runs it.
    fn reserve_step(
        &self,
        now: u64,
        n: u32,
        max: u64,
    ) -> impl Fn(u64) -> Step<Result<Duration, ThrottleError>> + '_ {
        move |tat| match gcra_math::reserve(tat, now, n, &self.params, max) {
            Ok((new, wait)) => Step::Store(new, self.params.reservation(Ok(wait))),
            Err(wait) => Step::Keep(self.params.reservation(Err(wait))),
        }
    }

    /// Reserves `n` tokens' worth of slots, as [`Throttle::reserve_n`], and returns a
    /// [`Reservation`] that can be handed back with [`Throttle::refund`] if the work is abandoned.
    ///
    /// # Errors
    ///
    /// As [`Throttle::reserve_n`].
    pub fn reserve_refundable(
        &self,
        n: u32,
        max_wait: Duration,
    ) -> Result<Reservation, ThrottleError> {
        let wait = self.reserve_n(n, max_wait)?;
        Ok(Reservation {
            wait,
            cost: u64::from(n) * self.params.token,
        })
    }

    /// Gives back a reservation that was not used: the next free slot moves back by its cost, but
    /// never behind now, so no refund makes the throttle fuller than full and the tokens handed
    /// back are exactly ones never used: the quota holds. Slots already handed to others are not
    /// moved (they only wait longer than they would have).
    pub fn refund(&self, reservation: Reservation) {
        let now = self.params.units(self.clock.now());
        self.tat
            .update(gcra_math::refund_step(now, reservation.cost));
    }

    /// For the loom models' teeth: `refund` with the CAS replaced by a load and a store.
    #[cfg(atomic_limiter_loom)]
    #[doc(hidden)]
    pub fn loom_broken_refund(&self, reservation: Reservation) {
        let now = self.params.units(self.clock.now());
        self.tat
            .update_racy(gcra_math::refund_step(now, reservation.cost));
    }

    /// GCRA's check on the throttle's state, for `n <= burst`: passes only if the slot is free now.
    fn meter(&self, n: u32) -> Decision {
        let d = self.meter_at(self.params.units(self.clock.now()), n);
        if d.is_allowed() || !is_coarse(&self.clock) {
            return d;
        }
        // A denial on a coarse reading: decided again on a fresh one.
        self.meter_at(self.params.units(self.clock.now_fresh()), n)
    }

    fn meter_at(&self, now: u64, n: u32) -> Decision {
        let resolution = self.clock.resolution();
        self.tat
            .update(|tat| gcra_math::meter(tat, now, n, &self.params, resolution))
    }

    /// The quota it paces to.
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// For the loom models' teeth: `reserve_n` with the CAS replaced by a load and a store.
    #[cfg(atomic_limiter_loom)]
    #[doc(hidden)]
    pub fn loom_broken_reserve(&self, max_wait: Duration) -> Result<Duration, ThrottleError> {
        let now = self.params.units(self.clock.now());
        self.tat
            .update_racy(self.reserve_step(now, 1, self.params.queue_limit(max_wait)))
    }
}

/// The throttle as a meter: a check passes only if its slot is free now, and reserves nothing
/// otherwise (GCRA's check on the same state), so it can serve wherever a `RateLimiter` is wanted.
impl<C: Clock> RateLimiter for Throttle<C> {
    fn check(&self) -> Decision {
        self.meter(1)
    }

    fn check_n(&self, n: u32) -> Result<Decision, InsufficientCapacity> {
        InsufficientCapacity::check(n, self.params.burst)?;
        Ok(self.meter(n))
    }

    fn quota(&self) -> &Quota {
        &self.quota
    }
}
