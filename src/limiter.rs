//! The one limiter shell: a state word, an algorithm's parameters, the quota and a clock.
//!
//! Every lock-free limiter whose state is one word is a [`Limiter`] running an [`Algorithm`]. The
//! algorithm is pure arithmetic; the shell is written here once for all of them: construction,
//! the clock read, the one compare-and-swap through [`StateCell::update`], the second look at a
//! denial made on a coarse or possibly stale reading, and the traits.

pub(crate) mod algorithm;
/// The shared-state engine that `Keyed` and `Sharded` run many words on, one limiter's quota.
#[cfg(feature = "std")]
pub(crate) mod shared;

use self::algorithm::engine::Answer;
use self::algorithm::{Algorithm, Continuous};
#[cfg(feature = "quanta")]
use crate::clock::DefaultClock;
use crate::clock::{Clock, DefaultClockOrNone, Reading, is_coarse};
use crate::decision::{Decision, Detail};
use crate::quota::InsufficientCapacity;
use crate::quota::{Quota, QuotaError};
use crate::rate_limiter::RateLimiter;
use crate::state_cell::{StateCell, Step};
#[cfg(feature = "std")]
use crate::sync::{AtomicBool, Ordering, fence};

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

    /// The check on a limiter that a reconfiguration may retire ([`Limiter::retire`]): `None`
    /// once `retired` is set (the caller moves to the limiter that replaced this one), else the
    /// decision, made on a word that no reconfiguration has taken yet.
    #[cfg(feature = "std")]
    #[inline(always)]
    pub(crate) fn check_live(&self, n: u32, retired: &AtomicBool) -> Option<Decision> {
        let now = self.reading();
        let answer = self
            .word
            .update_inlined(live(retired, self.step(now, n, false)))?;
        let coarse = is_coarse(&self.clock);
        if answer.is_final(coarse) {
            return Some(answer.into_final(&self.algorithm, now, self.clock.resolution()));
        }
        let (answer, now) = self.fresh_live(n, retired, now, coarse.then_some(answer))?;
        Some(settle(answer.decide(
            &self.algorithm,
            now,
            self.clock.resolution(),
        )))
    }

    /// [`Limiter::check_live`] decided again on a fresh reading, as [`Limiter::fresh_on`].
    #[cfg(feature = "std")]
    #[cold]
    #[inline(never)]
    fn fresh_live(
        &self,
        n: u32,
        retired: &AtomicBool,
        made: u64,
        denial: Option<A::Answer>,
    ) -> Option<(A::Answer, u64)> {
        let now = self.fresh_reading();
        // A denial takes nothing: one made before a retirement may still be answered.
        if let Some(answer) = denial.and_then(|a| self.algorithm.answer_at(&a, made, now)) {
            return Some((answer, now));
        }
        Some((
            self.word.update(live(retired, self.step(now, n, true)))?,
            now,
        ))
    }

    /// Takes the word out of use, for a reconfiguration: `retired` is set, then the word is
    /// changed, so that a check that loaded it before fails its CAS and, like every check after,
    /// finds `retired` set. Returns the last word, with every admission made on it.
    #[cfg(feature = "std")]
    pub(crate) fn retire(&self, retired: &AtomicBool) -> u64 {
        retire_word(&self.word, retired)
    }

    /// [`Limiter::retire`], or where `retire` is false (the loom models' twin, as swapping
    /// limiters behind a lock does) a plain read of the word that leaves it in use.
    #[cfg(feature = "std")]
    pub(crate) fn retire_or_read(&self, retired: &AtomicBool, retire: bool) -> u64 {
        #[cfg(atomic_limiter_loom)]
        if !retire {
            return self.word.load();
        }
        debug_assert!(retire);
        self.retire(retired)
    }

    /// `word`, this limiter's state at the instant `at_ns`, carried over to the limiter `to`
    /// (another quota) as `how` says: the algorithm's carry, each side in its own units.
    #[cfg(feature = "std")]
    pub(crate) fn carried_word(
        &self,
        word: u64,
        to: &Self,
        at_ns: u64,
        how: crate::limiter::algorithm::Carry,
    ) -> u64
    where
        A: algorithm::engine::Carried,
    {
        let (from, into) = (&self.algorithm, &to.algorithm);
        from.carry(word, from.units(at_ns), into, into.units(at_ns), how)
    }

    /// How long until `word` is full, as a peek at `at_ns` would answer: a pure step, nothing
    /// stored.
    #[cfg(feature = "std")]
    pub(crate) fn reset_of(&self, word: u64, at_ns: u64) -> core::time::Duration {
        let now = self.algorithm.units(at_ns);
        let answer = match self.step(now, 0, true)(word) {
            Step::Store(answer, _) | Step::Keep(answer) => answer,
        };
        settle(answer.decide(&self.algorithm, now, self.clock.resolution())).reset_after()
    }

    /// Replaces the word of a limiter no other thread can see yet.
    #[cfg(feature = "std")]
    pub(crate) fn set_word(&mut self, word: u64) {
        self.word = StateCell::new(word);
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

    /// A fresh state word, full at the clock's current reading.
    #[cfg(feature = "std")]
    pub(crate) fn full_word(&self) -> u64 {
        self.algorithm.full_word(self.reading())
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
    #[doc(hidden)]
    pub fn loom_broken_check_n(&self, n: u32) -> Decision {
        let now = self.reading();
        let answer = self.word.update_racy(self.step(now, n, false));
        settle(answer.decide(&self.algorithm, now, self.clock.resolution()))
    }

    /// For the loom models: the raw state word.
    #[cfg(atomic_limiter_loom)]
    #[doc(hidden)]
    pub fn loom_state(&self) -> u64 {
        self.word.load()
    }
}

/// Takes `word` out of use, for a reconfiguration: `retired` is set, then the word is changed (its
/// low bit flipped), so that a step that loaded it before fails its CAS and, like every step after,
/// finds `retired` set ([`live`]). Returns the last word, with every admission made on it.
#[cfg(feature = "std")]
pub(crate) fn retire_word(word: &StateCell, retired: &AtomicBool) -> u64 {
    // Relaxed: published by the fence and the CAS below.
    retired.store(true, Ordering::Relaxed);
    // Release: with the Acquire fence in `live`, a step that reads the word the CAS below writes
    // (or any later one) sees `retired` set.
    fence(Ordering::Release);
    word.update(|word| Step::Store(word, word ^ 1))
}

/// Whether `retired` is set, read inside a step: a step that reads the word [`retire_word`]'s
/// CAS wrote (or any later one) sees it set.
#[cfg(feature = "std")]
#[inline(always)]
pub(crate) fn is_retired(retired: &AtomicBool) -> bool {
    // Acquire: pairs with the Release fence in `retire_word`; a word its CAS wrote is seen here
    // with `retired` set.
    fence(Ordering::Acquire);
    // Relaxed: ordered by the fence above.
    retired.load(Ordering::Relaxed)
}

/// `step`, unless `retired` is set: then the word is left alone and the answer is `None`.
#[cfg(feature = "std")]
#[inline(always)]
pub(crate) fn live<T>(
    retired: &AtomicBool,
    step: impl Fn(u64) -> Step<T>,
) -> impl Fn(u64) -> Step<Option<T>> {
    // Always inlined, as `Limiter::step`.
    #[inline(always)]
    move |word| {
        if is_retired(retired) {
            return Step::Keep(None);
        }
        match step(word) {
            Step::Store(answer, new) => Step::Store(Some(answer), new),
            Step::Keep(answer) => Step::Keep(Some(answer)),
        }
    }
}

/// A step's answer on a reading that needs no other: only a possibly stale reading asks for a
/// fresh one, so this never sees `None`; were it to, it refuses (never over-admits).
#[inline]
pub(crate) fn settle(answer: Option<Decision>) -> Decision {
    match answer {
        Some(d) => d,
        None => unsettled(),
    }
}

/// The refusal [`settle`] gives for an answer that never comes. Built in place: returned from a
/// call, it is a decision in memory that every other path's decision joins there, and each check
/// then writes out figures its caller may never read (a bucket's admission took 1.2x GCRA's time
/// instead of 1.1x).
#[inline(always)]
fn unsettled() -> Decision {
    Decision::new(
        false,
        1,
        Detail::Eager {
            retry_ns: 1,
            reset_ns: 1,
            remaining: 0,
            limit: 0,
        },
    )
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
