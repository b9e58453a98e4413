use crate::clock::{Clock, is_coarse};
use crate::decision::Decision;
use crate::limiter::Limiter;
use crate::limiter::algorithm::engine::Answer;
use crate::limiter::algorithm::{Carry, Continuous};
use crate::limiter::retire::is_retired;
use crate::rate_limiter::RateLimiter;
use crate::state_cell::{StateCell, Step};
use crate::sync::AtomicBool;

/// A limiter whose parameters and clock serve many keys, each with its own state word: every
/// [`Limiter`] on a [`Continuous`] algorithm ([`Gcra`](crate::Gcra),
/// [`TokenBucket`](crate::TokenBucket)). [`Keyed`](crate::Keyed) and
/// [`Sharded`](crate::Sharded) take these. Sealed: what it asks of a limiter is this crate's.
pub trait KeyedLimiter: RateLimiter + Send + Sync + engine::KeyedEngine {}

impl<A: Continuous, C: Clock + Send + Sync> KeyedLimiter for Limiter<A, C> {}

pub(crate) mod engine {
    use super::*;

    /// One key's state: the limiter's 8-byte state word, and nothing else (the parameters and
    /// the clock are shared by every key with that quota).
    #[derive(Debug)]
    pub struct KeyState(pub(crate) StateCell);

    /// What a check's transition answered: the step's own answer on the word it was final on,
    /// and the clock reading it was made at. The decision is built from these two after the
    /// map's lock is released, without running the step again.
    #[derive(Debug, Clone, Copy)]
    pub struct Seen<D> {
        now: u64,
        answer: D,
    }

    /// The keyed side of a limiter, out of the public API (the trait cannot be named outside the
    /// crate).
    pub trait KeyedEngine {
        /// What [`KeyedEngine::take_state`] answers: a [`Seen`] of the algorithm's answer.
        type Seen: Copy;

        /// A state that is full now, as a fresh limiter is.
        fn fresh_state(&self) -> KeyState;

        /// This limiter's check, for `n <= burst` tokens, on `state` instead of its own word.
        fn check_state(&self, state: &KeyState, n: u32) -> Decision;

        /// The transition of [`KeyedEngine::check_state`] alone: takes the tokens if the limiter
        /// allows, and returns what the decision was made on, without building the decision.
        /// Kept small so that little is written while a map's shard lock is held (every store
        /// pending when the lock's release RMW runs must drain first). On an entry that a change
        /// may retire (`retired` given), `None` once it is set (the caller looks the key up
        /// again), and the decision is made on a word no change has taken yet; with no flag,
        /// always `Some`.
        fn take_state(
            &self,
            state: &KeyState,
            n: u32,
            retired: Option<&AtomicBool>,
        ) -> Option<Self::Seen> {
            self.take_state_read(state, n, retired, self.read_clock())
        }

        /// The clock's reading, in the units [`KeyedEngine::take_state_read`] takes.
        fn read_clock(&self) -> u64;

        /// [`KeyedEngine::take_state`] on a reading taken before the word is loaded (by the
        /// caller, before it looks the key up, so that the clock read overlaps the lookup).
        fn take_state_read(
            &self,
            state: &KeyState,
            n: u32,
            retired: Option<&AtomicBool>,
            reading: u64,
        ) -> Option<Self::Seen>;

        /// The decision [`KeyedEngine::check_state`] would have returned where
        /// [`KeyedEngine::take_state`] answered `seen`.
        fn decision_of(&self, seen: Self::Seen) -> Decision;

        /// Whether [`KeyedEngine::decision_of`] would admit, without building the decision.
        fn admitted(&self, seen: Self::Seen) -> bool;

        /// Gives back to the limiter's own state `n` tokens it admitted moments ago that were
        /// never used, never past full ([`Sharded`](crate::Sharded)'s gather, undone half-way).
        fn give_back(&self, n: u32);

        /// [`KeyedEngine::give_back`] on `state` instead of the limiter's own word: `n` tokens
        /// of a key's admission that another policy of the same request refused, never past
        /// full. On an entry a change has retired (`retired` set) nothing is given back: the
        /// change carried the word with the tokens taken, which can only under-admit.
        fn give_back_state(&self, state: &KeyState, n: u32, retired: Option<&AtomicBool>);

        /// The limiter's clock, read now, in nanoseconds.
        fn now_ns(&self) -> u64;

        /// A state word taken out of use ([`crate::limiter::retire::retire_word`], or read while the
        /// key is held exclusively) carried over to the limiter `to` (another quota) as `how`
        /// says.
        fn carried_state(&self, word: u64, to: &Self, how: Carry) -> KeyState;
    }

    impl<A: Continuous, C: Clock> KeyedEngine for Limiter<A, C> {
        type Seen = Seen<A::Answer>;

        fn fresh_state(&self) -> KeyState {
            KeyState(StateCell::new(self.full_word()))
        }

        #[inline]
        fn check_state(&self, state: &KeyState, n: u32) -> Decision {
            self.run_on(&state.0, n)
        }

        #[inline(always)]
        fn read_clock(&self) -> u64 {
            self.reading()
        }

        #[inline(always)]
        fn take_state_read(
            &self,
            state: &KeyState,
            n: u32,
            retired: Option<&AtomicBool>,
            reading: u64,
        ) -> Option<Self::Seen> {
            let coarse = is_coarse(self.clock());
            let (seen, finished) = take_at(self, state, reading, n, false, coarse, retired)?;
            if finished {
                return Some(seen);
            }
            // A denial on a coarse reading: decided again on a fresh one, as `check_state`.
            take_at(self, state, self.fresh_reading(), n, true, false, retired)
                .map(|(seen, _)| seen)
        }

        /// The answer the CAS loop kept, built into a decision: the step is not run again.
        #[inline]
        fn decision_of(&self, seen: Self::Seen) -> Decision {
            let resolution = self.clock().resolution();
            seen.answer
                .into_final(self.algorithm(), seen.now, resolution)
        }

        #[inline]
        fn admitted(&self, seen: Self::Seen) -> bool {
            seen.answer.is_allowed()
        }

        fn give_back(&self, n: u32) {
            Limiter::give_back(self, n)
        }

        fn give_back_state(&self, state: &KeyState, n: u32, retired: Option<&AtomicBool>) {
            let now = self.reading();
            state.0.update(|word| {
                if retired.is_some_and(is_retired) {
                    return Step::Keep(());
                }
                match self.algorithm().give_back(word, now, n) {
                    Some(new) => Step::Store((), new),
                    None => Step::Keep(()),
                }
            });
        }

        fn now_ns(&self) -> u64 {
            self.clock().now()
        }

        fn carried_state(&self, word: u64, to: &Self, how: Carry) -> KeyState {
            KeyState(StateCell::new(self.carried_word(
                word,
                to,
                self.clock().now(),
                how,
            )))
        }
    }

    /// [`KeyedEngine::take_state`] at a given reading: the step's CAS loop and outcome are exactly
    /// `check_state`'s, answering with the step's answer instead of the decision, and whether
    /// that answer is final (not a denial on a `coarse` clock, which is decided again).
    /// With a `retired` flag, `None` once it is set.
    #[inline(always)]
    fn take_at<A: Continuous, C: Clock>(
        limiter: &Limiter<A, C>,
        state: &KeyState,
        now: u64,
        n: u32,
        fresh: bool,
        coarse: bool,
        retired: Option<&AtomicBool>,
    ) -> Option<(Seen<A::Answer>, bool)> {
        let step = limiter.step(now, n, fresh);
        let answer = state.0.update(|w| {
            if retired.is_some_and(is_retired) {
                return Step::Keep(None);
            }
            match step(w) {
                Step::Store(d, new) => Step::Store(Some(Ok((d, true))), new),
                Step::Keep(d) if d.is_recheck() => Step::Keep(Some(Err(d))),
                Step::Keep(d) => {
                    let finished = d.is_final(coarse);
                    Step::Keep(Some(Ok((d, finished))))
                }
            }
        })?;
        Some(match answer {
            Ok((answer, finished)) => (Seen { now, answer }, finished),
            // Only an answer that may ask for a fresh reading gets here.
            Err(_) if <A::Answer as Answer<A>>::MAY_RECHECK => {
                (take_fresh(limiter, state, n, retired)?, true)
            }
            Err(answer) => (Seen { now, answer }, true),
        })
    }

    /// [`take_at`] on a reading taken after the word, for a reading that may have been stale. Out
    /// of line and not recursive, so that `take_at` inlines into every keyed check.
    #[cold]
    #[inline(never)]
    fn take_fresh<A: Continuous, C: Clock>(
        limiter: &Limiter<A, C>,
        state: &KeyState,
        n: u32,
        retired: Option<&AtomicBool>,
    ) -> Option<Seen<A::Answer>> {
        let now = limiter.fresh_reading();
        let step = limiter.step(now, n, true);
        let answer = state.0.update(|w| {
            if retired.is_some_and(is_retired) {
                return Step::Keep(None);
            }
            match step(w) {
                Step::Store(d, new) => Step::Store(Some(d), new),
                Step::Keep(d) => Step::Keep(Some(d)),
            }
        })?;
        // A fresh reading is always decided on; were it not, the decision built from this
        // answer refuses (`Answer::into_final` settles it), and nothing was taken.
        Some(Seen { now, answer })
    }
}
