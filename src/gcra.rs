pub(crate) mod math;
pub(crate) mod reservation;
pub(crate) mod throttle;

use self::math::GcraParams;
#[cfg(feature = "quanta")]
use crate::clock::DefaultClock;
use crate::clock::{Clock, DefaultClockOrNone, is_coarse};
use crate::decision::Decision;
use crate::quota::Quota;
use crate::rate_limiter::{InsufficientCapacity, RateLimiter};
use crate::state_cell::{StateCell, Step};

/// A lock-free GCRA (generic cell rate algorithm) limiter: the whole state is one `AtomicU64`.
///
/// GCRA is the "virtual scheduling" form of a leaky bucket used as a meter (and of a token bucket:
/// both admit exactly the same requests). It keeps one number, the theoretical arrival time, and a
/// check is one clock read, one load and, when the request passes, one compare-and-swap. A denial
/// writes nothing. The period is kept as an exact fraction of a nanosecond, so a limiter never
/// drifts from its quota, however long it runs.
///
/// # Examples
///
/// A burst of three, then a denial that says when to come back:
///
/// ```
/// use atomic_limiter::{Gcra, ManualClock, Quota, RateLimiter};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let limiter = Gcra::with_clock(Quota::per_second(10).with_burst(3), clock.clone());
/// for _ in 0..3 {
///     assert!(limiter.check().is_allowed());
/// }
/// let denied = limiter.check();
/// assert_eq!(denied.retry_after(), Duration::from_millis(100));
/// clock.advance(denied.retry_after());
/// assert!(limiter.check().is_allowed());
/// ```
///
/// # Size
///
/// The state is 8 bytes; the limiter also carries its parameters (32 bytes), the quota and its
/// clock.
#[derive(Debug)]
pub struct Gcra<C = DefaultClockOrNone> {
    /// The theoretical arrival time, in units of `1 / scale` ns, wrapping.
    tat: StateCell,
    params: GcraParams,
    quota: Quota,
    clock: C,
}

#[cfg(feature = "quanta")]
impl Gcra<DefaultClock> {
    /// A full limiter on the default clock ([`QuantaClock`](crate::QuantaClock)).
    ///
    /// # Examples
    ///
    /// Ten per second for an API, on real time:
    ///
    /// ```
    /// use atomic_limiter::{Gcra, Quota};
    ///
    /// let api = Gcra::new(Quota::per_second(10));
    /// assert_eq!((0..20).filter(|_| api.check().is_allowed()).count(), 10);
    /// ```
    pub fn new(quota: Quota) -> Gcra<DefaultClock> {
        Gcra::with_clock(quota, DefaultClock::new())
    }
}

impl<C: Clock> Gcra<C> {
    /// A full limiter on `clock`.
    pub fn with_clock(quota: Quota, clock: C) -> Gcra<C> {
        let params = GcraParams::new(&quota);
        let now = params.units(clock.now());
        Gcra {
            tat: StateCell::new(now),
            params,
            quota,
            clock,
        }
    }

    /// The longest idle, and the largest backwards clock step, that the limiter reads exactly:
    /// `(2^63 - 1 - window) / denominator` ns, where the window is `burst × period` in units of
    /// `1/denominator` ns (so about 292 years for whole-nanosecond periods and short windows, and
    /// at least 1.1 years for any quota). See `docs/design.md` for what happens beyond it.
    pub fn horizon(&self) -> core::time::Duration {
        let room = (i64::MAX as u64) - self.params.window;
        core::time::Duration::from_nanos(room / self.params.scale)
    }

    /// The clock the limiter reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Asks for one token.
    #[inline]
    pub fn check(&self) -> Decision {
        self.run(1)
    }

    /// Asks for `n` tokens, all or nothing; `n = 0` peeks.
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] if `n` exceeds the burst.
    #[inline]
    pub fn check_n(&self, n: u32) -> Result<Decision, InsufficientCapacity> {
        InsufficientCapacity::check(n, self.params.burst)?;
        Ok(self.run(n))
    }

    /// One clock read, then one load and (when the request passes) one CAS. `n <= burst`.
    #[inline]
    fn run(&self, n: u32) -> Decision {
        self.run_on(&self.tat, n)
    }

    /// The same check on another state word with this limiter's quota and clock (keyed limiters
    /// keep one word per key and share the rest).
    #[inline]
    pub(crate) fn run_on(&self, cell: &StateCell, n: u32) -> Decision {
        let d = cell.update(self.step(self.reading(), n));
        if d.is_allowed() || !is_coarse(&self.clock) {
            return d;
        }
        self.confirm_on(cell, n)
    }

    /// A denial made on a coarse reading, decided again on a fresh one.
    #[cold]
    #[inline(never)]
    fn confirm_on(&self, cell: &StateCell, n: u32) -> Decision {
        cell.update(self.step(self.fresh_reading(), n))
    }

    /// The clock reading in the units [`Gcra::step`] takes.
    #[inline]
    pub(crate) fn reading(&self) -> u64 {
        self.params.units(self.clock.now())
    }

    /// [`Gcra::reading`] from [`Clock::now_fresh`].
    pub(crate) fn fresh_reading(&self) -> u64 {
        self.params.units(self.clock.now_fresh())
    }

    /// A fresh state word, full at the clock's current reading.
    #[cfg(feature = "std")]
    pub(crate) fn fresh_word(&self) -> u64 {
        self.params.units(self.clock.now())
    }

    /// The GCRA step at `now` (GCRA units) for `n` tokens, as `StateCell` runs it. A denial decided
    /// on a stale (earlier, smaller) TAT stands for any later value too, since admissions only move
    /// the TAT forward; so keeping the word is final.
    #[inline]
    pub(crate) fn step(&self, now: u64, n: u32) -> impl Fn(u64) -> Step<Decision> + '_ {
        let resolution = self.clock.resolution();
        move |tat| math::meter(tat, now, n, &self.params, resolution)
    }

    #[cfg(feature = "std")]
    /// Gives back `n` tokens taken moments ago and never used (a gather across shards that failed
    /// half-way): the TAT moves back by their cost, never behind now, so never past full.
    pub(crate) fn give_back(&self, n: u32) {
        let now = self.reading();
        self.tat
            .update(math::refund_step(now, u64::from(n) * self.params.token));
    }

    /// For the loom models' teeth: `check_n` with the CAS replaced by a load and a store.
    #[cfg(atomic_limiter_loom)]
    #[doc(hidden)]
    pub fn loom_broken_check_n(&self, n: u32) -> Decision {
        let now = self.params.units(self.clock.now());
        self.tat.update_racy(self.step(now, n))
    }

    /// For the loom models: the raw state word.
    #[cfg(atomic_limiter_loom)]
    #[doc(hidden)]
    pub fn loom_state(&self) -> u64 {
        self.tat.load()
    }
}

impl<C: Clock> RateLimiter for Gcra<C> {
    #[inline]
    fn check(&self) -> Decision {
        Gcra::check(self)
    }

    #[inline]
    fn check_n(&self, n: u32) -> Result<Decision, InsufficientCapacity> {
        Gcra::check_n(self, n)
    }

    fn quota(&self) -> &Quota {
        &self.quota
    }
}

#[cfg(all(test, not(atomic_limiter_loom)))]
mod tests {
    use super::*;
    use crate::ManualClock;

    /// Four threads on a frozen clock take exactly the burst (through the CAS retry path).
    #[test]
    fn threads_on_a_frozen_clock_take_exactly_the_burst() {
        let burst = if cfg!(miri) { 6 } else { 1000 };
        let limiter = Gcra::with_clock(Quota::per_second(1).with_burst(burst), ManualClock::new());
        let admitted: u32 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..burst).filter(|_| limiter.check().is_allowed()).count()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap() as u32).sum()
        });
        assert_eq!(admitted, burst);
    }
}
