use crate::state_cell::StateCell;
use crate::{Clock, Decision, Gcra, RateLimiter, TokenBucket};

/// One key's state in a [`Keyed`](crate::Keyed) limiter: the limiter's 8-byte state word, and
/// nothing else (the quota and the clock are shared by every key with that quota).
#[derive(Debug)]
pub struct KeyState(pub(crate) StateCell);

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
        }
    };
}

keyed_limiter!(Gcra);
keyed_limiter!(TokenBucket);
