pub(crate) mod math;

use self::math::{BucketParams, Outcome, Reading};
#[cfg(feature = "quanta")]
use crate::clock::DefaultClock;
use crate::clock::{Clock, DefaultClockOrNone, is_coarse};
use crate::decision::Decision;
use crate::decision::Detail;
use crate::quota::Quota;
use crate::rate_limiter::{InsufficientCapacity, RateLimiter};
use crate::state_cell::{StateCell, Step};

/// A lock-free token bucket: fixed-point tokens and the tick of the last refill packed in one
/// `AtomicU64`, refilled lazily on each check.
///
/// It admits what [`Gcra`](crate::Gcra) admits, within its fixed-point resolution: tokens are
/// counted in 1/1024ths and time in ticks of at most 1/1024 of the period. It never admits a
/// request the exact model refuses; it may refuse one while the exact count exceeds the request by
/// less than 2/1024 of a token plus one tick's refill, and its waits are never shorter than exact.
/// Refills below the cap never drift (see `docs/design.md`). Choose it when you want the state to
/// *be* a token count; choose GCRA when you want exact figures and the longest idle horizon.
///
/// # Examples
///
/// A burst, a denial, and the bucket filling back up:
///
/// ```
/// use atomic_limiter::{ManualClock, Quota, RateLimiter, TokenBucket};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let bucket = TokenBucket::with_clock(Quota::per_second(100).with_burst(10), clock.clone());
/// assert!(bucket.check_n(10).unwrap().is_allowed());
/// let d = bucket.check();
/// assert!(d.is_denied());
/// clock.advance(d.reset_after());
/// assert_eq!(bucket.check_n(0).unwrap().remaining(), 10);
/// ```
///
/// # Layout
///
/// The low `token_bits` bits hold the tokens in fixed point (10 fraction bits), just wide enough for
/// `burst × 1024`; the other `64 - token_bits` bits (33 to 53) hold the tick of the last refill,
/// wrapping. The tick is the largest power of two nanoseconds not above `period / 1024`, coarsened
/// for very large bursts so that sixteen fill times fit in one stamp cycle.
///
/// # Horizons
///
/// An idle of up to [`TokenBucket::idle_horizon`] (three quarters of the stamp cycle) is read
/// exactly; a clock stepping back by up to [`TokenBucket::backward_tolerance`] (a quarter cycle)
/// grants nothing. For `per_second(100).with_burst(10)` these are 219 and 73 years; for a
/// nanosecond tick (periods under 1024 ns) they are `3/4 × 2^(64 - token_bits)` ns, days rather
/// than years. Beyond them see `docs/design.md`; [`Gcra`](crate::Gcra)'s horizon is at least a
/// year for every quota.
#[derive(Debug)]
pub struct TokenBucket<C = DefaultClockOrNone> {
    word: StateCell,
    params: BucketParams,
    quota: Quota,
    clock: C,
}

#[cfg(feature = "quanta")]
impl TokenBucket<DefaultClock> {
    /// A full bucket on the default clock ([`QuantaClock`](crate::QuantaClock)).
    pub fn new(quota: Quota) -> TokenBucket<DefaultClock> {
        TokenBucket::with_clock(quota, DefaultClock::new())
    }
}

impl<C: Clock> TokenBucket<C> {
    /// A full bucket on `clock`.
    pub fn with_clock(quota: Quota, clock: C) -> TokenBucket<C> {
        let params = BucketParams::new(&quota);
        TokenBucket {
            word: StateCell::new(params.full(clock.now())),
            params,
            quota,
            clock,
        }
    }

    /// The longest idle after which the bucket is still read exactly (full once the fill time
    /// has passed): the stamp cycle less a millisecond on a monotonic clock
    /// ([`Clock::is_monotonic`]), three quarters of it on others. Longer idles are read modulo
    /// the cycle; see `docs/design.md`.
    pub fn idle_horizon(&self) -> core::time::Duration {
        let monotonic = self.clock.is_monotonic();
        core::time::Duration::from_nanos(self.params.idle_horizon_ns(monotonic))
    }

    /// The largest backwards clock step the bucket tells apart from a long idle; up to it, a
    /// backwards step refills nothing and grants nothing. A quarter of the stamp cycle on a clock
    /// that may step back; on a monotonic one, the millisecond its cores may differ by (stale
    /// readings from other threads are settled by a fresh one, whatever their age up to half
    /// the cycle).
    pub fn backward_tolerance(&self) -> core::time::Duration {
        let monotonic = self.clock.is_monotonic();
        core::time::Duration::from_nanos(self.params.backward_tolerance_ns(monotonic))
    }

    /// The length of one tick, the bucket's time resolution.
    pub fn tick(&self) -> core::time::Duration {
        core::time::Duration::from_nanos(self.params.tick_ns())
    }

    /// The clock the bucket reads.
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
        self.run_on(&self.word, n)
    }

    /// The same check on another state word with this bucket's quota and clock (keyed limiters
    /// keep one word per key and share the rest).
    #[inline]
    pub(crate) fn run_on(&self, cell: &StateCell, n: u32) -> Decision {
        let Some(d) = cell.update(self.step(self.reading(), n)) else {
            return self.fresh_on(cell, n);
        };
        if d.is_allowed() || !is_coarse(&self.clock) {
            return d;
        }
        self.fresh_on(cell, n)
    }

    /// The check decided again on a fresh reading: a denial made on a coarse one, or a reading
    /// that may be stale (see [`Reading`]).
    #[cold]
    #[inline(never)]
    fn fresh_on(&self, cell: &StateCell, n: u32) -> Decision {
        settle(cell.update(self.step_in(self.fresh_reading(), n, self.fresh_mode())))
    }

    /// How this bucket's clock readings are trusted.
    #[inline]
    pub(crate) fn mode(&self) -> Reading {
        if self.clock.is_monotonic() {
            Reading::Monotonic
        } else {
            Reading::Any
        }
    }

    /// How a reading taken after the word was loaded is trusted.
    pub(crate) fn fresh_mode(&self) -> Reading {
        if self.clock.is_monotonic() {
            Reading::Fresh
        } else {
            Reading::Any
        }
    }

    /// The clock reading in the units [`TokenBucket::step`] takes (nanoseconds).
    #[inline]
    pub(crate) fn reading(&self) -> u64 {
        self.clock.now()
    }

    /// [`TokenBucket::reading`] from [`Clock::now_fresh`].
    pub(crate) fn fresh_reading(&self) -> u64 {
        self.clock.now_fresh()
    }

    /// A fresh state word, full at the clock's current reading.
    #[cfg(feature = "std")]
    pub(crate) fn fresh_word(&self) -> u64 {
        self.params.full(self.clock.now())
    }

    /// The bucket step at `now` (ns) for `n` tokens, as `StateCell` runs it, trusting the
    /// reading as the clock allows; `None` asks for a fresh reading. A denial decided on a stale
    /// word stands for any later word too: later words hold no more tokens at any given time
    /// (admissions only take, refills are capped the same way).
    #[inline]
    pub(crate) fn step(&self, now: u64, n: u32) -> impl Fn(u64) -> Step<Option<Decision>> + '_ {
        self.step_in(now, n, self.mode())
    }

    /// [`TokenBucket::step`] with the reading trusted as `reading` says.
    #[inline]
    pub(crate) fn step_in(
        &self,
        now: u64,
        n: u32,
        reading: Reading,
    ) -> impl Fn(u64) -> Step<Option<Decision>> + '_ {
        let resolution = self.clock.resolution();
        let decision = move |allowed, figures| {
            Some(Decision::new(allowed, resolution, Detail::Bucket(figures)))
        };
        move |word| match math::decide(word, now, n, &self.params, reading) {
            Outcome::Deny { figures } => Step::Keep(decision(false, figures)),
            Outcome::Allow { figures, .. } if n == 0 => Step::Keep(decision(true, figures)),
            Outcome::Allow { word, figures } => Step::Store(word, decision(true, figures)),
            Outcome::Recheck => Step::Keep(None),
        }
    }

    #[cfg(feature = "std")]
    /// Gives back `n` tokens taken moments ago and never used (a gather across shards that failed
    /// half-way): never past the cap, re-phased like any bucket that fills.
    pub(crate) fn give_back(&self, n: u32) {
        let now = self.clock.now();
        let cost = u64::from(n) * math::UNIT;
        self.word.update(
            |word| match math::give_back(word, now, cost, &self.params) {
                Some(new) => Step::Store(new, ()),
                None => Step::Keep(()),
            },
        );
    }

    /// For the loom models' teeth: `check_n` with the CAS replaced by a load and a store.
    #[cfg(atomic_limiter_loom)]
    #[doc(hidden)]
    pub fn loom_broken_check_n(&self, n: u32) -> Decision {
        settle(self.word.update_racy(self.step(self.clock.now(), n)))
    }

    /// For the loom models: the raw state word.
    #[cfg(atomic_limiter_loom)]
    #[doc(hidden)]
    pub fn loom_state(&self) -> u64 {
        self.word.load()
    }
}

/// A step's answer on a reading that needs no other: only a possibly stale reading asks for a
/// fresh one, so this never sees `None`; were it to, it refuses (never over-admits).
#[inline]
pub(crate) fn settle(answer: Option<Decision>) -> Decision {
    answer.unwrap_or(Decision::new(
        false,
        1,
        Detail::Eager {
            remaining: 0,
            retry_ns: 1,
            reset_ns: 1,
            limit: 0,
        },
    ))
}

impl<C: Clock> RateLimiter for TokenBucket<C> {
    #[inline]
    fn check(&self) -> Decision {
        TokenBucket::check(self)
    }

    #[inline]
    fn check_n(&self, n: u32) -> Result<Decision, InsufficientCapacity> {
        TokenBucket::check_n(self, n)
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
        let bucket =
            TokenBucket::with_clock(Quota::per_second(1).with_burst(burst), ManualClock::new());
        let admitted: u32 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..burst).filter(|_| bucket.check().is_allowed()).count()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap() as u32).sum()
        });
        assert_eq!(admitted, burst);
    }
}
