//! [`ReconfigurableThrottle`]: a [`Throttle`] whose quota changes at run time.

use core::convert::Infallible;
use core::time::Duration;

use super::cell::{Cells, Content};
use crate::clock::Clock;
#[cfg(feature = "quanta")]
use crate::clock::DefaultClock;
use crate::clock::DefaultClockOrNone;
use crate::clock::is_coarse;
use crate::decision::Decision;
use crate::gcra::math as gcra_math;
use crate::gcra::reservation::{Refund, Reservation, ReservationGuard};
use crate::gcra::throttle::{Throttle, ThrottleError};
use crate::limiter::algorithm::Carry;
use crate::limiter::retire::{live, retire_word};
use crate::quota::InsufficientCapacity;
use crate::quota::Quota;
use crate::rate_limiter::RateLimiter;
use crate::sync::AtomicBool;

impl<C: Clock> Content for Throttle<C> {
    fn quota(&self) -> Quota {
        Throttle::quota(self)
    }

    #[inline]
    fn capacity(&self) -> u32 {
        Throttle::quota(self).burst()
    }

    #[inline(always)]
    fn check_live(&self, n: u32, retired: &AtomicBool) -> Option<Decision> {
        Throttle::check_live(self, n, retired)
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
        debug_assert!(
            retire,
            "no loom model reads a throttle's word instead of retiring it"
        );
        let proportional = matches!(carry, Carry::Proportional);
        Throttle::retire_into(self, retired, new, proportional, at);
    }
}

/// The hooks of a throttle in a cell: its live reservation, refund and check, and its
/// retirement, over the throttle's crate-private accessors.
impl<C: Clock> Throttle<C> {
    /// [`Throttle::reserve_n`] on a throttle that a reconfiguration may retire: `None` once
    /// `retired` is set, else the slot's wait, cost and end (for the reservation to build).
    fn reserve_live(
        &self,
        n: u32,
        max_wait: Duration,
        retired: &AtomicBool,
    ) -> Option<Result<(Duration, u64, u64), ThrottleError>> {
        if let Err(e) = self.params().within_burst(n) {
            return Some(Err(e));
        }
        let now = self.params().units(self.clock().now());
        let max = self.params().queue_limit(max_wait);
        let answer = self
            .tat()
            .update(live(retired, self.reserve_step(now, n, max)))?;
        Some(self.slot(n, answer))
    }

    /// [`Throttle::refund_latest`] on a throttle that a reconfiguration may retire: `None` once
    /// `retired` is set.
    fn refund_latest_live(&self, end: u64, cost: u64, retired: &AtomicBool) -> Option<bool> {
        let now = self.params().units(self.clock().now());
        self.tat().update(live(
            retired,
            Throttle::<C>::refund_latest_step(now, end, cost),
        ))
    }

    /// The check of a throttle that a reconfiguration may retire, for `n <= burst`: `None` once
    /// `retired` is set.
    #[inline(always)]
    fn check_live(&self, n: u32, retired: &AtomicBool) -> Option<Decision> {
        let meter = |now| {
            self.tat().update(live(retired, |tat| {
                gcra_math::meter(tat, now, n, self.params())
            }))
        };
        let mut metered = meter(self.params().units(self.clock().now()))?;
        if !metered.is_allowed() && is_coarse(self.clock()) {
            // A denial on a coarse reading: decided again on a fresh one.
            metered = meter(self.params().units(self.clock().now_fresh()))?;
        }
        Some(metered.decision(self.params(), self.clock().resolution()))
    }

    /// Takes the TAT out of use (`retired` set first, then the word changed by a CAS) and carries
    /// it into `new`, which no other thread can see yet: the queue of granted reservations is
    /// kept as time whichever the carry ([`gcra_math::carry_queue`]).
    fn retire_into(
        &self,
        retired: &AtomicBool,
        new: &mut Throttle<C>,
        proportional: bool,
        at: u64,
    ) {
        let tat = retire_word(self.tat(), retired);
        let (now, now_to) = (self.params().units(at), new.params().units(at));
        let carried =
            gcra_math::carry_queue(tat, now, self.params(), now_to, new.params(), proportional);
        new.set_tat(carried);
    }
}

/// A [`Throttle`] (the leaky bucket as a queue: reservations of future slots) whose quota changes
/// at run time, from any thread, while others reserve and check.
///
/// A change retires the old throttle's next free slot by a CAS and carries it over as
/// [`Carry`] says, with one difference: the queue of reservations already granted past the
/// window is kept as time whichever the carry, since those reservations go ahead at their slots
/// and new ones must queue behind them. A [`Reservation`] made before a change can no longer be
/// given back ([`Reservation::refund`] answers `false`): its slot is part of the queue the change
/// carried over.
///
/// # Examples
///
/// ```
/// use atomic_limiter::{Carry, ManualClock, Quota, ReconfigurableThrottle};
/// use std::time::Duration;
///
/// let t = ReconfigurableThrottle::with_clock(Quota::per_second(10).with_burst(1), ManualClock::new());
/// let max = Duration::from_secs(1);
/// assert_eq!(t.reserve(max).unwrap().wait(), Duration::ZERO);
/// assert_eq!(t.reserve(max).unwrap().wait(), Duration::from_millis(100));
/// // Slower: the two granted slots keep their places; the next one queues behind them.
/// t.set_quota(Quota::per_second(1).with_burst(1), Carry::Debt);
/// assert_eq!(t.reserve(max).unwrap().wait(), Duration::from_millis(200));
/// ```
pub struct ReconfigurableThrottle<C = DefaultClockOrNone> {
    cells: Cells<Throttle<C>>,
}

impl<C> core::fmt::Debug for ReconfigurableThrottle<C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ReconfigurableThrottle")
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "quanta")]
impl ReconfigurableThrottle<DefaultClock> {
    /// A throttle for `quota` on the default clock.
    pub fn new(quota: Quota) -> Self {
        ReconfigurableThrottle::with_clock(quota, DefaultClock::new())
    }
}

impl<C: Clock> Refund for ReconfigurableThrottle<C> {
    /// Gives back the slot ending at `end` if the cell `generation` is still in force and the
    /// slot is its latest ([`Reservation::refund`]).
    fn refund_latest(&self, generation: u64, end: u64, cost: u64) -> bool {
        self.cells
            .run_on(generation, |t, retired| {
                t.refund_latest_live(end, cost, retired)
            })
            .unwrap_or(false)
    }
}

impl<C: Clock + Clone + Send + Sync + 'static> ReconfigurableThrottle<C> {
    /// A throttle for `quota` on `clock`.
    pub fn with_clock(quota: Quota, clock: C) -> Self {
        ReconfigurableThrottle {
            cells: Cells::new(Throttle::with_clock(quota, clock)),
        }
    }

    /// Changes the quota, carrying the next free slot over as `carry` says (the queue of granted
    /// reservations kept as time).
    pub fn set_quota(&self, quota: Quota, carry: Carry) {
        let build = |old: &Throttle<C>| {
            Ok::<_, Infallible>(Throttle::with_clock(quota, old.clock().clone()))
        };
        match self.cells.replace(build, carry, true) {
            Ok(()) => {}
            Err(never) => match never {},
        }
    }

    /// [`Throttle::reserve`] on the quota in force.
    ///
    /// # Errors
    ///
    /// As [`Throttle::reserve`].
    pub fn reserve(&self, max_wait: Duration) -> Result<Reservation<'_, C>, ThrottleError> {
        self.reserve_n(1, max_wait)
    }

    /// [`Throttle::reserve_n`] on the quota in force.
    ///
    /// # Errors
    ///
    /// As [`Throttle::reserve_n`].
    pub fn reserve_n(
        &self,
        n: u32,
        max_wait: Duration,
    ) -> Result<Reservation<'_, C>, ThrottleError> {
        let (slot, generation) = self.cells.run_live(|t, retired, generation| {
            t.reserve_live(n, max_wait, retired)
                .map(|slot| (slot, generation))
        });
        Ok(Reservation::of_other(self, generation, slot?))
    }

    /// [`Throttle::reserve_guarded`] on the quota in force.
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

    /// Asks for one token now, without queueing.
    pub fn check(&self) -> Decision {
        self.cells.check()
    }

    /// Asks for `n` tokens now, without queueing; `n = 0` peeks.
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] if `n` exceeds the burst in force.
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
impl<C: Clock + Clone + Send + Sync + 'static> RateLimiter for ReconfigurableThrottle<C> {
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
