//! The window limiters: a fixed window and the sliding window counter, each a count (or two) and
//! the window's index packed in one word ([`math`]); the exact sliding window log ([`log`]); and
//! the fixed window on the calendar's boundaries ([`calendar`], its dates in [`civil`]).

pub(crate) mod calendar;
pub(crate) mod civil;
pub(crate) mod math;

#[cfg(feature = "std")]
pub(crate) mod log;

use core::marker::PhantomData;

use self::math::{Figures, WindowAnswer, WindowParams};
#[cfg(feature = "quanta")]
use crate::clock::DefaultClock;
use crate::clock::{Clock, DefaultClockOrNone, Reading};
use crate::decision::Decision;
use crate::limiter::Limiter;
use crate::limiter::algorithm::engine::{Answer, Carried, Engine};
use crate::limiter::algorithm::{Algorithm, Carry, Retunable};
use crate::quota::{Quota, QuotaError};
use crate::state_cell::Step;

/// At most `limit` admissions per fixed window of time: a counter and the window's index in
/// one `AtomicU64`, reset when a new window starts.
///
/// The cheapest window, and the coarsest: the limit holds per window, not per any span of that
/// length. A client can take the whole limit at the end of one window and the whole limit again
/// at the start of the next, **twice the limit within a moment**; use
/// [`SlidingWindowCounter`](crate::SlidingWindowCounter) to smooth that edge, or
/// [`Gcra`](crate::Gcra) for a true rate. The window's index is found by a multiply with a
/// precomputed reciprocal (no division per check); a clock stepping back keeps the current
/// window and its count.
///
/// # Examples
///
/// Three per second, and a fresh count in the next second:
///
/// ```
/// use atomic_limiter::{FixedWindow, ManualClock, Quota};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let w = FixedWindow::with_clock(Quota::per_second(3), clock.clone())?;
/// assert_eq!((0..5).filter(|_| w.check().is_allowed()).count(), 3);
/// assert_eq!(w.check().retry_after(), Duration::from_secs(1));
/// clock.advance(Duration::from_secs(1));
/// assert!(w.check().is_allowed());
/// # Ok::<(), atomic_limiter::QuotaError>(())
/// ```
///
/// # Methods
///
/// `FixedWindow` is a [`Limiter`] running [`WindowAlgorithm<Fixed>`](WindowAlgorithm):
/// [`check`](Limiter::check), [`check_n`](Limiter::check_n), [`quota`](Limiter::quota) and
/// [`clock`](Limiter::clock) are the shell's; its constructors `new` and `with_clock` return a
/// `Result` (a limit can be too large for the packed counts), and `horizon` is the windows' own.
pub type FixedWindow<C = DefaultClockOrNone> = Limiter<WindowAlgorithm<Fixed>, C>;

/// The two-window approximation of a sliding window: the previous window's count, weighted by
/// how much of it still overlaps the last `W`, plus the current window's count, must stay
/// within the limit. Both counts and the window's index are packed in one `AtomicU64`.
///
/// It smooths the fixed window's edge at the price of an assumption: that the previous window's
/// admissions were spread evenly. When they all came at its very end, the true count in the
/// last `W` can exceed the limit: **at most `2 × limit - 1` admissions in any span of length
/// `W`** (the previous window's `limit`, plus what the falling weight lets in before the span
/// ends), against exactly `limit` for an exact log. `docs/design.md` has the derivation;
/// `tests/windows.rs` checks the bound on random and adversarial runs.
///
/// # Examples
///
/// Ten per second; right after a full window, the previous count still weighs in:
///
/// ```
/// use atomic_limiter::{ManualClock, Quota, SlidingWindowCounter};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let w = SlidingWindowCounter::with_clock(Quota::per_second(10), clock.clone())?;
/// assert_eq!((0..20).filter(|_| w.check().is_allowed()).count(), 10);
/// clock.advance(Duration::from_millis(1500)); // half of the previous window still overlaps
/// assert_eq!((0..20).filter(|_| w.check().is_allowed()).count(), 5);
/// # Ok::<(), atomic_limiter::QuotaError>(())
/// ```
///
/// # Methods
///
/// `SlidingWindowCounter` is a [`Limiter`] running [`WindowAlgorithm<Sliding>`](WindowAlgorithm):
/// [`check`](Limiter::check), [`check_n`](Limiter::check_n), [`quota`](Limiter::quota) and
/// [`clock`](Limiter::clock) are the shell's; its constructors `new` and `with_clock` return a
/// `Result` (a limit can be too large for the packed counts), and `horizon` is the windows' own.
pub type SlidingWindowCounter<C = DefaultClockOrNone> = Limiter<WindowAlgorithm<Sliding>, C>;

/// A window limiter's parameters: the limit, the window's length and its epoch, and the word's
/// layout for the kind `K` ([`Fixed`] or [`Sliding`]). The algorithm [`FixedWindow`] and
/// [`SlidingWindowCounter`] run.
#[derive(Debug, Clone, Copy)]
pub struct WindowAlgorithm<K> {
    params: WindowParams,
    kind: PhantomData<K>,
}

/// The fixed window's kind: one count per window.
#[derive(Debug, Clone, Copy)]
pub struct Fixed;

/// The sliding window counter's kind: the previous window's count and the current one.
#[derive(Debug, Clone, Copy)]
pub struct Sliding;

/// What tells one window kind from another: its counts and its step. Sealed.
pub trait WindowKind: kind::Kind + core::fmt::Debug + Send + Sync {}

impl WindowKind for Fixed {}
impl WindowKind for Sliding {}

pub(crate) mod kind {
    use super::*;

    /// A window kind's part of the algorithm, out of the public API.
    pub trait Kind {
        /// How many counts the word packs.
        const COUNTS: u32;
        /// The largest limit those counts hold.
        const MAX_LIMIT: u64;
        /// One step for `n <= limit` at `now` (ns).
        fn step(word: u64, now: u64, n: u32, p: &WindowParams) -> Step<WindowAnswer>;
        /// The figures of a step's answer, once the CAS loop is done.
        fn figures(answer: WindowAnswer, p: &WindowParams) -> Figures;
    }

    impl Kind for Fixed {
        const COUNTS: u32 = 1;
        const MAX_LIMIT: u64 = (1 << 31) - 1;

        #[inline(always)]
        fn step(word: u64, now: u64, n: u32, p: &WindowParams) -> Step<WindowAnswer> {
            math::fixed(word, now, n, p)
        }

        #[inline(always)]
        fn figures(answer: WindowAnswer, p: &WindowParams) -> Figures {
            math::fixed_figures(answer, p)
        }
    }

    impl Kind for Sliding {
        const COUNTS: u32 = 2;
        const MAX_LIMIT: u64 = WindowParams::MAX_SLIDING_LIMIT;

        #[inline(always)]
        fn step(word: u64, now: u64, n: u32, p: &WindowParams) -> Step<WindowAnswer> {
            math::sliding(word, now, n, p)
        }

        #[inline(always)]
        fn figures(answer: WindowAnswer, p: &WindowParams) -> Figures {
            math::sliding_figures(answer, p)
        }
    }
}

impl<K: WindowKind> Algorithm for WindowAlgorithm<K> {}
impl<K: WindowKind> Retunable for WindowAlgorithm<K> {}

impl<K: WindowKind> Carried for WindowAlgorithm<K> {
    fn follow(&mut self, from: &Self) {
        self.params.follow(&from.params);
    }

    /// The counts, as [`math::carry`] says: [`Carry::Debt`](crate::Carry::Debt) keeps them as
    /// they are, [`Carry::Proportional`](crate::Carry::Proportional) scales them to the new
    /// limit; both at most the new limit.
    fn carry(&self, word: u64, now: u64, to: &Self, _now_to: u64, how: Carry) -> u64 {
        let proportional = matches!(how, Carry::Proportional);
        math::carry(word, now, K::COUNTS, &self.params, &to.params, proportional)
    }
}

impl<K: WindowKind> Answer<WindowAlgorithm<K>> for WindowAnswer {
    #[inline(always)]
    fn decide(
        self,
        algorithm: &WindowAlgorithm<K>,
        _now: u64,
        resolution: u64,
    ) -> Option<Decision> {
        let p = &algorithm.params;
        Some(self.decision(K::figures(self, p), p, resolution))
    }

    #[inline(always)]
    fn is_allowed(&self) -> bool {
        WindowAnswer::is_allowed(self)
    }
}

impl<K: WindowKind> Engine for WindowAlgorithm<K> {
    type Answer = WindowAnswer;

    fn from_quota(quota: &Quota, now_ns: u64) -> Result<WindowAlgorithm<K>, QuotaError> {
        Ok(WindowAlgorithm {
            params: WindowParams::new(quota, now_ns, K::MAX_LIMIT)?,
            kind: PhantomData,
        })
    }

    #[inline]
    fn capacity(&self) -> u32 {
        // At most `MAX_LIMIT` < 2^31.
        self.params.limit as u32
    }

    /// Windows read nanoseconds.
    #[inline]
    fn units(&self, now_ns: u64) -> u64 {
        now_ns
    }

    /// The window of `now`, every count 0.
    fn full_word(&self, now: u64) -> u64 {
        self.params.empty_word(now, K::COUNTS)
    }

    /// A denial decided on a stale word stands: counts only grow within a window (see
    /// `docs/design.md`).
    #[inline(always)]
    fn step(&self, word: u64, now: u64, n: u32, _reading: Reading) -> Step<WindowAnswer> {
        K::step(word, now, n, &self.params)
    }
}

#[cfg(feature = "quanta")]
impl<K: WindowKind> Limiter<WindowAlgorithm<K>, DefaultClock> {
    /// At most `quota.rate()` admissions per window of `quota.per()`, windows counted from now on
    /// the default clock ([`QuantaClock`](crate::QuantaClock)).
    ///
    /// # Errors
    ///
    /// [`QuotaError::LimitTooLarge`] if the limit does not fit the packed counts.
    pub fn new(quota: Quota) -> Result<Self, QuotaError> {
        Self::with_clock(quota, DefaultClock::new())
    }
}

impl<K: WindowKind, C: Clock> Limiter<WindowAlgorithm<K>, C> {
    /// At most `quota.rate()` admissions per window of `quota.per()`, windows counted from now on
    /// `clock` (the quota's burst is not used).
    ///
    /// # Errors
    ///
    /// [`QuotaError::LimitTooLarge`] if the limit does not fit the packed counts (above
    /// 2^31 - 1 for a fixed window, 2^20 - 1 for a sliding window counter).
    pub fn with_clock(quota: Quota, clock: C) -> Result<Self, QuotaError> {
        Limiter::try_with_clock(quota, clock)
    }

    /// The longest idle (or clock step) read exactly: `2^(index bits - 1) - 1` windows, the index
    /// taking the bits the counts leave. Past it the window index is read modulo its width: old
    /// counts may be kept, so fewer admissions, never more.
    pub fn horizon(&self) -> core::time::Duration {
        core::time::Duration::from_nanos(self.algorithm().params.horizon_ns(K::COUNTS))
    }
}
