use core::time::Duration;

use super::math::{self, GcraParams};
use super::reservation::{Reservation, ReservationGuard};
#[cfg(feature = "quanta")]
use crate::clock::DefaultClock;
use crate::clock::{Clock, DefaultClockOrNone, is_coarse};
use crate::decision::Decision;
use crate::quota::InsufficientCapacity;
use crate::quota::Quota;
use crate::rate_limiter::RateLimiter;
use crate::state_cell::{StateCell, Step};

/// The leaky bucket as a **queue**: it spaces requests at the quota's pace instead of refusing
/// them. Each caller reserves the next free slot with one compare-and-swap and learns how long to
/// wait before it may proceed (`Duration::ZERO` while the burst lasts). A reservation can be
/// given back ([`Reservation::refund`]), or given back by itself when dropped unused
/// ([`Throttle::reserve_guarded`]).
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
/// assert_eq!(t.reserve(max)?.wait(), Duration::ZERO);
/// assert_eq!(t.reserve(max)?.wait(), Duration::from_millis(500));
/// assert_eq!(t.reserve(max)?.wait(), Duration::from_millis(1000));
/// // Not willing to wait that long: nothing is reserved.
/// assert!(t.reserve(Duration::from_millis(100)).is_err());
/// assert_eq!(t.reserve(max)?.wait(), Duration::from_millis(1500));
/// # Ok::<(), atomic_limiter::ThrottleError>(())
/// ```
#[derive(Debug)]
pub struct Throttle<C = DefaultClockOrNone> {
    /// The next free slot (theoretical arrival time), in units of `1/scale` ns.
    tat: StateCell,
    params: GcraParams,
    quota: Quota,
    clock: C,
}

#[cfg(feature = "quanta")]
impl Throttle<DefaultClock> {
    /// A throttle on the default clock ([`QuantaClock`](crate::QuantaClock)) whose first `burst`
    /// slots are free now, then one per period.
    pub fn new(quota: Quota) -> Throttle<DefaultClock> {
        Throttle::with_clock(quota, DefaultClock::new())
    }
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

    /// Reserves one slot: a [`Reservation`] says how long to wait before using it
    /// ([`Reservation::wait`]), and can give the slot back ([`Reservation::refund`]).
    ///
    /// # Errors
    ///
    /// [`ThrottleError::WouldWait`] if the slot is more than `max_wait` away (nothing reserved).
    #[inline]
    pub fn reserve(&self, max_wait: Duration) -> Result<Reservation<'_, C>, ThrottleError> {
        self.reserve_n(1, max_wait)
    }

    /// Reserves `n` tokens' worth of slots at once, as [`Throttle::reserve`].
    ///
    /// # Errors
    ///
    /// [`ThrottleError::InsufficientCapacity`] if `n` exceeds the burst;
    /// [`ThrottleError::WouldWait`] if the wait would exceed `max_wait` (capped at about
    /// `2^61 / denominator` ns, 73 years for whole-nanosecond periods). Nothing is reserved.
    #[inline]
    pub fn reserve_n(
        &self,
        n: u32,
        max_wait: Duration,
    ) -> Result<Reservation<'_, C>, ThrottleError> {
        self.params.within_burst(n)?;
        let now = self.params.units(self.clock.now());
        let max = self.params.queue_limit(max_wait);
        let (wait, cost, end) = self.slot(n, self.tat.update(self.reserve_step(now, n, max)))?;
        Ok(Reservation::new(self, wait, cost, end))
    }

    /// What a reservation of `n` holds, from its step's answer (the wait and the slot's end, or
    /// the wait it would have taken): when to go, its cost and its end; or the error.
    pub(crate) fn slot(
        &self,
        n: u32,
        answer: Result<(u64, u64), u64>,
    ) -> Result<(Duration, u64, u64), ThrottleError> {
        let cost = u64::from(n) * self.params.token;
        answer
            .map(|(wait, end)| (self.params.duration(wait), cost, end))
            .map_err(|wait| ThrottleError::WouldWait(self.params.duration(wait)))
    }

    /// The reservation step at `now` (GCRA units), as `StateCell` runs it: the wait and the next
    /// free slot left behind, or how far off the refused slot was.
    pub(crate) fn reserve_step(
        &self,
        now: u64,
        n: u32,
        max: u64,
    ) -> impl Fn(u64) -> Step<Result<(u64, u64), u64>> + '_ {
        move |tat| match math::reserve(tat, now, n, &self.params, max) {
            Ok((new, wait)) => Step::Store(Ok((wait, new)), new),
            Err(wait) => Step::Keep(Err(wait)),
        }
    }

    /// [`Throttle::reserve_n`] as a guard that gives the slot back when dropped unless committed
    /// ([`ReservationGuard`]): for work that may be cancelled.
    ///
    /// # Errors
    ///
    /// As [`Throttle::reserve_n`].
    pub fn reserve_guarded(
        &self,
        n: u32,
        max_wait: Duration,
    ) -> Result<ReservationGuard<'_, C>, ThrottleError> {
        Ok(self.reserve_n(n, max_wait)?.refund_on_drop())
    }

    /// Gives back the reservation that left the next free slot at `end`, if it still does.
    pub(crate) fn refund_latest(&self, end: u64, cost: u64) -> bool {
        let now = self.params.units(self.clock.now());
        self.tat.update(Self::refund_latest_step(now, end, cost))
    }

    pub(crate) fn refund_latest_step(now: u64, end: u64, cost: u64) -> impl Fn(u64) -> Step<bool> {
        move |tat| match math::refund_latest(tat, now, end, cost) {
            Some(new) => Step::Store(true, new),
            None => Step::Keep(false),
        }
    }

    /// For the loom models' teeth: `refund_latest` with the CAS replaced by a load and a store.
    #[cfg(atomic_limiter_loom)]
    pub(crate) fn loom_broken_refund_latest(&self, end: u64, cost: u64) -> bool {
        let now = self.params.units(self.clock.now());
        self.tat
            .update_racy(Self::refund_latest_step(now, end, cost))
    }

    /// GCRA's check on the throttle's state, for `n <= burst`: passes only if the slot is free now.
    fn meter(&self, n: u32) -> Decision {
        let mut metered = self.meter_at(self.params.units(self.clock.now()), n);
        if !metered.is_allowed() && is_coarse(&self.clock) {
            // A denial on a coarse reading: decided again on a fresh one.
            metered = self.meter_at(self.params.units(self.clock.now_fresh()), n);
        }
        metered.decision(&self.params, self.clock.resolution())
    }

    fn meter_at(&self, now: u64, n: u32) -> math::Metered {
        self.tat
            .update(|tat| math::meter(tat, now, n, &self.params))
    }

    /// The quota it paces to.
    pub fn quota(&self) -> Quota {
        self.quota
    }

    /// The clock the throttle reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The GCRA parameters of its quota, for the reconfiguration wing.
    #[cfg(feature = "std")]
    pub(crate) fn params(&self) -> &GcraParams {
        &self.params
    }

    /// Its state word (the next free slot), for the reconfiguration wing.
    #[cfg(feature = "std")]
    pub(crate) fn tat(&self) -> &StateCell {
        &self.tat
    }

    /// Replaces the state word of a throttle no other thread can see yet.
    #[cfg(feature = "std")]
    pub(crate) fn set_tat(&mut self, tat: u64) {
        self.tat = StateCell::new(tat);
    }

    /// For the loom models' teeth: `reserve_n` with the CAS replaced by a load and a store.
    #[cfg(atomic_limiter_loom)]
    pub(crate) fn loom_broken_reserve(
        &self,
        max_wait: Duration,
    ) -> Result<Reservation<'_, C>, ThrottleError> {
        let now = self.params.units(self.clock.now());
        let step = self.reserve_step(now, 1, self.params.queue_limit(max_wait));
        let (wait, cost, end) = self.slot(1, self.tat.update_racy(step))?;
        Ok(Reservation::new(self, wait, cost, end))
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

    fn quota(&self) -> Quota {
        self.quota
    }
}

/// Why a [`Throttle`](crate::Throttle) reservation was not made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThrottleError {
    /// More tokens than the burst: no slot could ever hold them.
    InsufficientCapacity(InsufficientCapacity),
    /// The slot is further off than the caller's maximum wait; nothing was reserved.
    WouldWait(Duration),
}

impl core::fmt::Display for ThrottleError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ThrottleError::InsufficientCapacity(e) => e.fmt(f),
            ThrottleError::WouldWait(d) => {
                write!(f, "the next slot is {d:?} away, past the maximum wait")
            }
        }
    }
}

impl core::error::Error for ThrottleError {}
