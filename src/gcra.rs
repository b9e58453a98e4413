pub(crate) mod admin;
pub(crate) mod math;
pub(crate) mod reservation;
pub(crate) mod throttle;

use self::math::{GcraParams, Metered};
use crate::clock::{Clock, DefaultClockOrNone, Reading};
use crate::decision::Decision;
use crate::limiter::Limiter;
use crate::limiter::algorithm::engine::{Answer, Carried, Engine, Total};
use crate::limiter::algorithm::{Algorithm, Carry, Continuous, Retunable};
use crate::quota::{Quota, QuotaError};
use crate::state_cell::Step;

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
///
/// # Methods
///
/// `Gcra` is a [`Limiter`] running [`GcraAlgorithm`]: [`new`](Limiter::new),
/// [`with_clock`](Limiter::with_clock), [`check`](Limiter::check),
/// [`check_n`](Limiter::check_n), [`quota`](Limiter::quota) and [`clock`](Limiter::clock) are the
/// shell's, written once for every algorithm; [`Gcra::horizon`] is GCRA's own.
pub type Gcra<C = DefaultClockOrNone> = Limiter<GcraAlgorithm, C>;

/// GCRA's parameters: the period and the window in units of `1 / scale` ns. The algorithm
/// [`Gcra`] runs.
#[derive(Debug, Clone, Copy)]
pub struct GcraAlgorithm(GcraParams);

impl Algorithm for GcraAlgorithm {}
impl Continuous for GcraAlgorithm {}
impl Retunable for GcraAlgorithm {}

impl Carried for GcraAlgorithm {
    fn carry(&self, tat: u64, now: u64, to: &Self, now_to: u64, how: Carry) -> u64 {
        let proportional = matches!(how, Carry::Proportional);
        math::carry(tat, now, &self.0, now_to, &to.0, proportional)
    }
}

impl Total for GcraAlgorithm {
    fn continuous(quota: &Quota) -> GcraAlgorithm {
        GcraAlgorithm(GcraParams::new(quota))
    }

    /// The TAT moves back by the tokens' cost, never behind now, so never past full.
    fn give_back(&self, tat: u64, now: u64, n: u32) -> Option<u64> {
        math::refund(tat, now, u64::from(n) * self.0.token)
    }

    fn settle(&self, tat: u64, now: u64, end: u64, taken: u32, actual: u32) -> Option<u64> {
        let p = &self.0;
        let owed = u64::from(actual).saturating_mul(p.token);
        math::settle(tat, now, end, u64::from(taken) * p.token, owed, p)
    }
}

impl Answer<GcraAlgorithm> for Metered {
    #[inline(always)]
    fn decide(self, algorithm: &GcraAlgorithm, _now: u64, resolution: u64) -> Option<Decision> {
        Some(self.decision(&algorithm.0, resolution))
    }

    #[inline(always)]
    fn is_allowed(&self) -> bool {
        Metered::is_allowed(self)
    }
}

impl Engine for GcraAlgorithm {
    type Answer = Metered;

    fn from_quota(quota: &Quota, _now_ns: u64) -> Result<GcraAlgorithm, QuotaError> {
        Ok(GcraAlgorithm::continuous(quota))
    }

    #[inline]
    fn capacity(&self) -> u32 {
        self.0.burst
    }

    #[inline]
    fn units(&self, now_ns: u64) -> u64 {
        self.0.units(now_ns)
    }

    /// A TAT of now: nothing owed.
    fn full_word(&self, now: u64) -> u64 {
        now
    }

    /// A denial decided on a stale (earlier, smaller) TAT stands for any later value too, since
    /// admissions only move the TAT forward; so keeping the word is final. GCRA needs no fresh
    /// reading: a reading behind the TAT is debt, never credit.
    #[inline]
    fn step(&self, tat: u64, now: u64, n: u32, _reading: Reading) -> Step<Metered> {
        math::meter(tat, now, n, &self.0)
    }
}

impl<C: Clock> Gcra<C> {
    /// The longest idle, and the largest backwards clock step, that the limiter reads exactly:
    /// `(2^63 - 1 - window) / denominator` ns, where the window is `burst × period` in units of
    /// `1/denominator` ns (so about 292 years for whole-nanosecond periods and short windows, and
    /// at least 1.1 years for any quota). See `docs/design.md` for what happens beyond it.
    pub fn horizon(&self) -> core::time::Duration {
        let p = &self.algorithm().0;
        let room = (i64::MAX as u64) - p.window;
        core::time::Duration::from_nanos(room / p.scale)
    }
}

#[cfg(all(test, not(atomic_limiter_loom)))]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

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
