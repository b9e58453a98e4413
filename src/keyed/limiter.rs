use crate::clock::Clock;
use crate::decision::Decision;
use crate::gcra::Gcra;
use crate::rate_limiter::RateLimiter;
use crate::state_cell::{StateCell, Step};
use crate::token_bucket::TokenBucket;
use crate::token_bucket::settle;

/// One key's state in a [`Keyed`](crate::Keyed) limiter: the limiter's 8-byte state word, and
/// nothing else (the quota and the clock are shared by every key with that quota).
#[derive(Debug)]
pub struct KeyState(pub(crate) StateCell);

/// What a check saw: the clock reading it decided at and the state word its final decision was
/// made on. The decision is a pure function of these two (and `n` and the quota), so it can be
/// worked out again after the map's lock is released.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct Seen {
    now: u64,
    word: u64,
    /// Whether `now` was read after the word was loaded (see `token_bucket::math::Reading`).
    fresh: bool,
}

mod sealed {
    pub trait Sealed {}
}

/// A limiter whose quota and clock can serve many keys, each with its own [`KeyState`]: the
/// crate's lock-free limiters ([`Gcra`], [`TokenBucket`]). Sealed: implemented here only.
pub trait KeyedLimiter: RateLimiter + Send + Sync + sealed::Sealed {
    /// A state that is full now, as a fresh limiter is.
    #[doc(hidden)]
    fn fresh_state(&self) -> KeyState;

    /// This limiter's check, for `n <= burst` tokens, on `state` instead of its own word.
    #[doc(hidden)]
    fn check_state(&self, state: &KeyState, n: u32) -> Decision;

    /// The transition of [`KeyedLimiter::check_state`] alone: takes the tokens if the limiter
    /// allows, and returns what the decision was made on, without building the decision. Kept
    /// small so that little is written while a map's shard lock is held (every store pending
    /// when the lock's release RMW runs must drain first).
    #[doc(hidden)]
    fn take_state(&self, state: &KeyState, n: u32) -> Seen;

    /// The decision [`KeyedLimiter::check_state`] would have returned for what
    /// [`KeyedLimiter::take_state`] saw, with the same `n`.
    #[doc(hidden)]
    fn decision_of(&self, seen: Seen, n: u32) -> Decision;

    /// Gives back to the limiter's own state `n` tokens it admitted moments ago that were never
    /// used, never past full ([`Sharded`](crate::Sharded)'s gather, undone half-way).
    #[doc(hidden)]
    fn give_back(&self, n: u32);

    /// The limiter's clock, read now, in nanoseconds.
    #[doc(hidden)]
    fn now_ns(&self) -> u64;
}

/// Both lock-free limiters keep their state in one `StateCell` and run their step on any cell.
macro_rules! keyed_limiter {
    ($limiter:ident) => {
        impl<C: Clock> sealed::Sealed for $limiter<C> {}

        impl<C: Clock + Send + Sync> KeyedLimiter for $limiter<C> {
            fn fresh_state(&self) -> KeyState {
                KeyState(StateCell::new(self.fresh_word()))
            }

            #[inline]
            fn check_state(&self, state: &KeyState, n: u32) -> Decision {
                self.run_on(&state.0, n)
            }

            #[inline]
            fn take_state(&self, state: &KeyState, n: u32) -> Seen {
                let seen = self.take_at(state, self.reading(), n, false);
                if !crate::clock::is_coarse(self.clock()) || self.decide_seen(seen, n).is_allowed()
                {
                    return seen;
                }
                // A denial on a coarse reading: decided again on a fresh one, as `check_state`.
                self.take_at(state, self.fresh_reading(), n, true)
            }

            #[inline]
            fn decision_of(&self, seen: Seen, n: u32) -> Decision {
                self.decide_seen(seen, n)
            }

            fn give_back(&self, n: u32) {
                $limiter::give_back(self, n)
            }

            fn now_ns(&self) -> u64 {
                self.clock().now()
            }
        }
    };
}

keyed_limiter!(Gcra);
keyed_limiter!(TokenBucket);

/// [`KeyedLimiter::take_state`] at a given reading, and the decision it made, for each limiter.
/// The transition answers with the word it decided on instead of the decision; its CAS loop and
/// outcome are exactly `check_state`'s. The step is a pure function of the word and the reading:
/// run again on the word the final decision was made on, it gives that decision again.
trait TakeAt {
    fn take_at(&self, state: &KeyState, now: u64, n: u32, fresh: bool) -> Seen;
    fn decide_seen(&self, seen: Seen, n: u32) -> Decision;
}

impl<C: Clock> TakeAt for Gcra<C> {
    #[inline]
    fn take_at(&self, state: &KeyState, now: u64, n: u32, fresh: bool) -> Seen {
        let step = self.step(now, n);
        let word = state.0.update(|w| match step(w) {
            Step::Store(new, _) => Step::Store(new, w),
            Step::Keep(_) => Step::Keep(w),
        });
        Seen { now, word, fresh }
    }

    #[inline]
    fn decide_seen(&self, seen: Seen, n: u32) -> Decision {
        match self.step(seen.now, n)(seen.word) {
            Step::Store(_, d) | Step::Keep(d) => d,
        }
    }
}

impl<C: Clock> TakeAt for TokenBucket<C> {
    #[inline]
    fn take_at(&self, state: &KeyState, now: u64, n: u32, fresh: bool) -> Seen {
        let reading = if fresh {
            self.fresh_mode()
        } else {
            self.mode()
        };
        let step = self.step_in(now, n, reading);
        let word = state.0.update(|w| match step(w) {
            Step::Store(new, _) => Step::Store(new, Some(w)),
            Step::Keep(Some(_)) => Step::Keep(Some(w)),
            // A reading that may be stale: settled by one taken after the word.
            Step::Keep(None) => Step::Keep(None),
        });
        match word {
            Some(word) => Seen { now, word, fresh },
            None => self.take_at(state, self.fresh_reading(), n, true),
        }
    }

    #[inline]
    fn decide_seen(&self, seen: Seen, n: u32) -> Decision {
        let reading = if seen.fresh {
            self.fresh_mode()
        } else {
            self.mode()
        };
        match self.step_in(seen.now, n, reading)(seen.word) {
            Step::Store(_, d) | Step::Keep(d) => settle(d),
        }
    }
}
