//! The one limiter shell: a state word, an algorithm's parameters, the quota and a clock.
//!
//! Every lock-free limiter whose state is one word is a [`Limiter`] running an [`Algorithm`]. The
//! algorithm is pure arithmetic; the shell is written here once for all of them: construction,
//! the clock read, the one compare-and-swap through [`StateCell::update`], the second look at a
//! denial made on a coarse or possibly stale reading, and the traits.

pub(crate) mod algorithm;
pub(crate) mod charge;
/// The lease word a node spends from a store's grants (the `redis` wing's hot path), apart from
/// the wing so that its protocol is model-checked without the store.
#[cfg(any(feature = "redis", atomic_limiter_loom))]
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) mod lease;
pub(crate) mod retire;
/// The shared-state engine that `Keyed` and `Sharded` run many words on, one limiter's quota.
#[cfg(feature = "std")]
pub(crate) mod shared;

use self::algorithm::engine::Answer;
use self::algorithm::{Algorithm, Continuous};
use self::retire::settle;
#[cfg(feature = "quanta")]
use crate::clock::DefaultClock;
use crate::clock::{Clock, DefaultClockOrNone, Reading, is_coarse};
use crate::decision::Decision;
use crate::quota::InsufficientCapacity;
use crate::quota::{Quota, QuotaError};
use crate::rate_limiter::RateLimiter;
use crate::state_cell::{StateCell, Step};

/// A lock-free limiter: one `AtomicU64` of state, changed only by a compare-and-swap, running the
/// algorithm `A` on the clock `C`.
///
/// It is named through its algorithm's alias: [`Gcra`](crate::Gcra),
/// [`TokenBucket`](crate::TokenBucket), [`FixedWindow`](crate::FixedWindow),
/// [`SlidingWindowCounter`](crate::SlidingWindowCounter); their pages say what each algorithm
/// admits. A check is one clock read, one load and, when the request passes, one CAS; a denial
/// writes nothing.
///
/// # Size
///
/// The state is 8 bytes; the limiter also carries the algorithm's parameters, the quota and its
/// clock.
#[derive(Debug)]
pub struct Limiter<A, C = DefaultClockOrNone> {
    word: StateCell,
    algorithm: A,
    quota: Quota,
    clock: C,
}

#[cfg(feature = "quanta")]
impl<A: Continuous> Limiter<A, DefaultClock> {
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
    pub fn new(quota: Quota) -> Self {
        Self::with_clock(quota, DefaultClock::new())
    }
}

impl<A: Continuous, C: Clock> Limiter<A, C> {
    /// A full limiter on `clock`.
    pub fn with_clock(quota: Quota, clock: C) -> Self {
        Limiter::continuous(quota, clock)
    }

    /// [`Limiter::with_clock`], under a name no window limiter's constructor shares (generic
    /// code over every algorithm would find both).
    pub(crate) fn continuous(quota: Quota, clock: C) -> Self {
        let algorithm = A::continuous(&quota);
        Limiter::assemble(algorithm, quota, clock)
    }

    /// Gives back `n` tokens taken moments ago and never used (a gather across shards that failed
    /// half-way), never past full.
    #[cfg(feature = "std")]
    pub(crate) fn give_back(&self, n: u32) {
        let now = self.reading();
        self.word
            .update(|word| match self.algorithm.give_back(word, now, n) {
                Some(new) => Step::Store((), new),
                None => Step::Keep(()),
            });
    }
}

impl<A: Algorithm, C: Clock> Limiter<A, C> {
    /// A limiter for `quota` on `clock`, or why the algorithm cannot serve the quota (only a
    /// window's limit can be too large).
    pub(crate) fn try_with_clock(quota: Quota, clock: C) -> Result<Self, QuotaError> {
        let algorithm = A::from_quota(&quota, clock.now())?;
        Ok(Limiter::assemble(algorithm, quota, clock))
    }

    fn assemble(algorithm: A, quota: Quota, clock: C) -> Self {
        let word = StateCell::new(algorithm.full_word(algorithm.units(clock.now())));
        Limiter {
            word,
            algorithm,
            quota,
            clock,
        }
    }

    /// The clock the limiter reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The quota the limiter enforces.
    pub fn quota(&self) -> Quota {
        self.quota
    }

    /// The state word, for an algorithm's own steps beside the check (a GCRA charge's
    /// settlement).
    pub(crate) fn cell(&self) -> &StateCell {
        &self.word
    }

    /// The algorithm's parameters, for its own methods.
    pub(crate) fn algorithm(&self) -> &A {
        &self.algorithm
    }

    /// The algorithm's parameters, changed only before the limiter is shared (a reconfigurable
    /// limiter's new cell).
    #[cfg(feature = "std")]
    pub(crate) fn algorithm_mut(&mut self) -> &mut A {
        &mut self.algorithm
    }

    /// Asks for one token.
    #[inline(always)]
    pub fn check(&self) -> Decision {
        self.run_on(&self.word, 1)
    }

    /// Asks for `n` tokens, all or nothing; `n = 0` peeks.
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] if `n` exceeds the burst (a window's limit).
    #[inline(always)]
    pub fn check_n(&self, n: u32) -> Result<Decision, InsufficientCapacity> {
        InsufficientCapacity::check(n, self.algorithm.capacity())?;
        Ok(self.run_on(&self.word, n))
    }

    /// The check on `cell`, for `n <= capacity`, with this limiter's parameters and clock (keyed
    /// limiters keep one word per key and share the rest): one clock read, one load and, when the
    /// request passes, one CAS.
    #[inline(always)]
    pub(crate) fn run_on(&self, cell: &StateCell, n: u32) -> Decision {
        let now = self.reading();
        let answer = cell.update_inlined(self.step(now, n, false));
        // A denial on a nanosecond clock is final; the test compiles away for those.
        let coarse = is_coarse(&self.clock);
        if answer.is_final(coarse) {
            return answer.into_final(&self.algorithm, now, self.clock.resolution());
        }
        // Only a coarse clock's denial is handed on: elsewhere the answer's figures are not
        // worked out on the way.
        let (answer, now) = self.fresh_on(cell, n, now, coarse.then_some(answer));
        // Built here, once both paths have joined, and not returned by the call: a decision
        // returned through memory is one the first path's decision joins there, with every
        // figure written out even for a caller that reads only the verdict.
        settle(answer.decide(&self.algorithm, now, self.clock.resolution()))
    }

    /// The check decided again on a fresh reading: a denial made at the coarse reading `made`
    /// (`denial`), or a reading that may be stale. The answer, final, and the reading it was made
    /// on.
    #[cold]
    #[inline(never)]
    fn fresh_on(
        &self,
        cell: &StateCell,
        n: u32,
        made: u64,
        denial: Option<A::Answer>,
    ) -> (A::Answer, u64) {
        let now = self.fresh_reading();
        if let Some(answer) = denial.and_then(|a| self.algorithm.answer_at(&a, made, now)) {
            return (answer, now);
        }
        (cell.update_inlined(self.step(now, n, true)), now)
    }

    /// The clock read now, in the step's units.
    #[inline(always)]
    pub(crate) fn reading(&self) -> u64 {
        self.algorithm.units(self.clock.now())
    }

    /// [`Limiter::reading`] from [`Clock::now_fresh`].
    pub(crate) fn fresh_reading(&self) -> u64 {
        self.algorithm.units(self.clock.now_fresh())
    }
    /// The algorithm's step at `now` (step units) for `n` tokens, as `StateCell` runs it; `fresh`
    /// when `now` was read after the word was loaded.
    #[inline(always)]
    pub(crate) fn step(
        &self,
        now: u64,
        n: u32,
        fresh: bool,
    ) -> impl Fn(u64) -> Step<A::Answer> + '_ {
        // Worked out inside: an algorithm that ignores it leaves nothing to capture. Always
        // inlined: called, a step's answer would come back through memory.
        #[inline(always)]
        move |word| {
            let reading = Reading::of(&self.clock, fresh);
            self.algorithm.step(word, now, n, reading)
        }
    }

    /// For the loom models' teeth: `check_n` with the CAS replaced by a load and a store.
    #[cfg(atomic_limiter_loom)]
    pub(crate) fn loom_broken_check_n(&self, n: u32) -> Decision {
        let now = self.reading();
        let answer = self.word.update_racy(self.step(now, n, false));
        settle(answer.decide(&self.algorithm, now, self.clock.resolution()))
    }

    /// For the loom models: the raw state word.
    #[cfg(atomic_limiter_loom)]
    pub(crate) fn loom_state(&self) -> u64 {
        self.word.load()
    }
}

impl<A: Algorithm, C: Clock> RateLimiter for Limiter<A, C> {
    #[inline(always)]
    fn check(&self) -> Decision {
        Limiter::check(self)
    }

    #[inline(always)]
    fn check_n(&self, n: u32) -> Result<Decision, InsufficientCapacity> {
        Limiter::check_n(self, n)
    }

    fn quota(&self) -> Quota {
        self.quota
    }
}
