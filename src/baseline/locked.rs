//! The one locked shell: an algorithm's state behind a lock, for every mutex twin that checks.

#[cfg(feature = "quanta")]
use crate::clock::DefaultClock;
use crate::clock::{Clock, Reading};
use crate::decision::Decision;
use crate::limiter::algorithm::engine::{Answer, Engine};
use crate::limiter::algorithm::{Algorithm, Continuous};
use crate::limiter::retire::settle;
use crate::quota::InsufficientCapacity;
use crate::quota::{Quota, QuotaError};
use crate::rate_limiter::RateLimiter;
use crate::state_cell::Step;
use crate::window::{WindowAlgorithm, WindowKind};

use super::lock::BaselineLock;

/// An algorithm a [`Locked`] runs under its lock: the lock-free limiters' algorithms on a `u64`
/// (the same pure step, with a mutex where the CAS was), and the textbook `f64` bucket. Sealed.
pub trait Textbook: engine::Textbook {}

/// A [`Textbook`] algorithm that accepts every quota, so its limiter is built without a
/// `Result`.
pub trait TotalTextbook: Textbook + engine::TotalTextbook {}

pub(crate) mod engine {
    use super::*;

    /// The locked side of an algorithm, out of the public API.
    pub trait Textbook: Sized {
        /// What the lock holds.
        type State;

        /// The parameters and a full state for `quota` at `now_ns`, or why the quota cannot be
        /// served.
        fn from_quota(quota: &Quota, now_ns: u64) -> Result<(Self, Self::State), QuotaError>;

        /// The most tokens one request may take.
        fn capacity(&self) -> u32;

        /// What the step under the lock leaves for the decision to be worked out from after it.
        type Taken;

        /// The step for `n <= capacity` tokens at `now_ns`, on the state the lock holds: as little
        /// as the decision needs, so that the lock is held for the state change alone.
        fn take(
            &self,
            state: &mut Self::State,
            now_ns: u64,
            n: u32,
            clock: &impl Clock,
        ) -> Self::Taken;

        /// The decision, once the lock is released.
        fn decision(&self, taken: Self::Taken, clock: &impl Clock) -> Decision;
    }

    /// A textbook algorithm's parameters, which every quota has.
    pub trait TotalTextbook: Textbook {
        /// The parameters and a full state for `quota` at `now_ns`.
        fn total(quota: &Quota, now_ns: u64) -> (Self, Self::State);
    }

    impl<A: Algorithm> Textbook for A {
        type State = u64;

        fn from_quota(quota: &Quota, now_ns: u64) -> Result<(A, u64), QuotaError> {
            let algorithm = A::from_quota(quota, now_ns)?;
            let word = algorithm.full_word(algorithm.units(now_ns));
            Ok((algorithm, word))
        }

        fn capacity(&self) -> u32 {
            Engine::capacity(self)
        }

        /// The reading the step was made at, and its answer.
        type Taken = (u64, A::Answer);

        #[inline]
        fn take(
            &self,
            word: &mut u64,
            now_ns: u64,
            n: u32,
            clock: &impl Clock,
        ) -> (u64, A::Answer) {
            let step = |now, fresh| self.step(*word, now, n, Reading::of(clock, fresh));
            let mut now = self.units(now_ns);
            let mut answer = step(now, false);
            if matches!(&answer, Step::Keep(d) if d.is_recheck()) {
                // A reading that may be stale: taken again while the lock is held.
                now = self.units(clock.now_fresh());
                answer = step(now, true);
            }
            match answer {
                Step::Store(d, new) => {
                    *word = new;
                    (now, d)
                }
                Step::Keep(d) => (now, d),
            }
        }

        #[inline]
        fn decision(&self, (now, answer): (u64, A::Answer), clock: &impl Clock) -> Decision {
            settle(answer.decide(self, now, clock.resolution()))
        }
    }

    impl<A: Continuous> TotalTextbook for A {
        fn total(quota: &Quota, now_ns: u64) -> (A, u64) {
            let algorithm = A::continuous(quota);
            let word = algorithm.full_word(algorithm.units(now_ns));
            (algorithm, word)
        }
    }
}

impl<A: Algorithm> Textbook for A {}
impl<A: Continuous> TotalTextbook for A {}

/// A textbook limiter: the state of the algorithm `A` behind the lock `L` (a
/// `std::sync::Mutex` unless another [`BaselineLock`] is named), on the clock `C`. Named through
/// its aliases: [`MutexGcra`](super::MutexGcra), [`MutexTokenBucket`](super::MutexTokenBucket),
/// [`MutexFixedWindow`](super::MutexFixedWindow),
/// [`MutexSlidingWindowCounter`](super::MutexSlidingWindowCounter).
#[derive(Debug)]
pub struct Locked<A: Textbook, C, L> {
    state: L,
    algorithm: A,
    quota: Quota,
    clock: C,
}

#[cfg(feature = "quanta")]
impl<A: TotalTextbook, L: BaselineLock<A::State>> Locked<A, DefaultClock, L> {
    /// A full limiter on the default clock.
    pub fn new(quota: Quota) -> Self {
        Self::with_clock(quota, DefaultClock::new())
    }
}

impl<A: TotalTextbook, C: Clock, L: BaselineLock<A::State>> Locked<A, C, L> {
    /// A full limiter on `clock`.
    pub fn with_clock(quota: Quota, clock: C) -> Self {
        let (algorithm, state) = A::total(&quota, clock.now());
        Locked::assemble(algorithm, state, quota, clock)
    }
}

impl<K: WindowKind, C: Clock, L: BaselineLock<u64>> Locked<WindowAlgorithm<K>, C, L> {
    /// As the lock-free window's `with_clock`.
    ///
    /// # Errors
    ///
    /// As the lock-free window's `with_clock`.
    pub fn with_clock(quota: Quota, clock: C) -> Result<Self, QuotaError> {
        let (algorithm, state) = engine::Textbook::from_quota(&quota, clock.now())?;
        Ok(Locked::assemble(algorithm, state, quota, clock))
    }
}

impl<A: Textbook, C: Clock, L: BaselineLock<A::State>> Locked<A, C, L> {
    fn assemble(algorithm: A, state: A::State, quota: Quota, clock: C) -> Self {
        Locked {
            state: L::new(state),
            algorithm,
            quota,
            clock,
        }
    }

    /// One clock read, the step under the lock, the decision after it.
    #[inline]
    fn run(&self, n: u32) -> Decision {
        let now = self.clock.now();
        let taken = self
            .state
            .with(|state| self.algorithm.take(state, now, n, &self.clock));
        self.algorithm.decision(taken, &self.clock)
    }
}

impl<A: Textbook, C: Clock, L: BaselineLock<A::State>> RateLimiter for Locked<A, C, L> {
    fn check(&self) -> Decision {
        self.run(1)
    }

    fn check_n(&self, n: u32) -> Result<Decision, InsufficientCapacity> {
        InsufficientCapacity::check(n, engine::Textbook::capacity(&self.algorithm))?;
        Ok(self.run(n))
    }

    fn quota(&self) -> Quota {
        self.quota
    }
}
