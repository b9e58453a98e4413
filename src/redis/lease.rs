//! A lease as one word, and the pure steps that spend and refill it.
//!
//! | bits     | field |
//! |----------|-------|
//! | `0..24`  | tokens left |
//! | `24..64` | the tick at which the lease expires: it may be spent while `now < expiry` |
//!
//! A tick is 2^20 ns (about 1 ms); 40 bits of them last 36 years of the clock. An expiry is
//! rounded *down* to a tick, so a lease is never spent later than its TTL allows.

use crate::state_cell::Step;

const TOKENS: u64 = (1 << 24) - 1;
const EXPIRY_SHIFT: u32 = 24;
const TICK_SHIFT: u32 = 20;
const MAX_EXPIRY: u64 = (1 << 40) - 1;

/// The most tokens a lease holds.
pub(crate) const MAX_TOKENS: u32 = TOKENS as u32;

/// A clock reading as a tick (rounded down: a reading that is already late stays late).
#[inline]
pub(crate) const fn tick(now_ns: u64) -> u64 {
    now_ns >> TICK_SHIFT
}

/// The tick at which a lease asked for at `sent_ns` expires, `ttl_ns` later, rounded down.
pub(crate) const fn expiry(sent_ns: u64, ttl_ns: u64) -> u64 {
    let t = sent_ns.saturating_add(ttl_ns) >> TICK_SHIFT;
    if t > MAX_EXPIRY { MAX_EXPIRY } else { t }
}

#[inline]
const fn unpack(word: u64) -> (u64, u32) {
    (word >> EXPIRY_SHIFT, (word & TOKENS) as u32)
}

const fn pack(expiry: u64, tokens: u32) -> u64 {
    (expiry << EXPIRY_SHIFT) | tokens as u64
}

/// What spending found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Spend {
    /// Taken; this many tokens are left.
    Spent { left: u32 },
    /// Not enough valid tokens (`tokens` left, expired or not); nothing taken.
    Short { tokens: u32, expired: bool },
}

/// Takes `n` tokens if the lease is valid at `now_tick` and holds them; `n = 0` peeks.
#[inline]
pub(crate) fn spend(word: u64, now_tick: u64, n: u32) -> Step<Spend> {
    let (expiry, tokens) = unpack(word);
    let expired = now_tick >= expiry;
    if expired || tokens < n {
        Step::Keep(Spend::Short { tokens, expired })
    } else if n == 0 {
        Step::Keep(Spend::Spent { left: tokens })
    } else {
        let left = tokens - n;
        Step::Store(Spend::Spent { left }, pack(expiry, left))
    }
}

/// Adds `granted` tokens that expire at `new_expiry`. Tokens still valid are kept, but the merged
/// lease expires at the *earlier* expiry: no token is ever spent past its own TTL (the bound
/// rests on it). Tokens past the cap are dropped, never over-counted.
pub(crate) fn add(word: u64, now_tick: u64, new_expiry: u64, granted: u32) -> Step<()> {
    let (expiry, tokens) = unpack(word);
    let merged = if now_tick >= expiry || tokens == 0 {
        pack(new_expiry, granted.min(MAX_TOKENS))
    } else {
        pack(
            expiry.min(new_expiry),
            tokens.saturating_add(granted).min(MAX_TOKENS),
        )
    };
    Step::Store((), merged)
}

/// The tokens field, valid or not (the refill measures demand from it).
pub(crate) const fn tokens(word: u64) -> u32 {
    unpack(word).1
}

/// The valid tokens at `now_tick`.
pub(crate) const fn valid_tokens(word: u64, now_tick: u64) -> u32 {
    let (expiry, tokens) = unpack(word);
    if now_tick >= expiry { 0 } else { tokens }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<T>(word: &mut u64, step: impl FnOnce(u64) -> Step<T>) -> T {
        match step(*word) {
            Step::Store(t, w) => {
                *word = w;
                t
            }
            Step::Keep(t) => t,
        }
    }

    #[test]
    fn a_lease_is_spent_until_it_runs_out_or_expires() {
        let mut w = 0;
        assert_eq!(
            run(&mut w, |w| spend(w, 0, 1)),
            Spend::Short {
                tokens: 0,
                expired: true
            }
        );
        run(&mut w, |w| add(w, 0, 10, 2));
        assert_eq!(run(&mut w, |w| spend(w, 9, 1)), Spend::Spent { left: 1 });
        assert_eq!(run(&mut w, |w| spend(w, 9, 0)), Spend::Spent { left: 1 });
        assert_eq!(
            run(&mut w, |w| spend(w, 9, 2)),
            Spend::Short {
                tokens: 1,
                expired: false
            }
        );
        // At the expiry tick the last token is gone.
        assert_eq!(
            run(&mut w, |w| spend(w, 10, 1)),
            Spend::Short {
                tokens: 1,
                expired: true
            }
        );
    }

    #[test]
    fn a_refill_never_extends_older_tokens() {
        let mut w = 0;
        run(&mut w, |w| add(w, 0, 10, 5));
        run(&mut w, |w| add(w, 5, 20, 5));
        assert_eq!(valid_tokens(w, 9), 10);
        assert_eq!(valid_tokens(w, 10), 0);
        // Over an expired lease, the new one stands alone.
        run(&mut w, |w| add(w, 10, 30, 3));
        assert_eq!(valid_tokens(w, 29), 3);
    }

    #[test]
    fn expiry_rounds_down_and_saturates() {
        assert_eq!(expiry(0, (1 << TICK_SHIFT) - 1), 0);
        assert_eq!(expiry(1 << TICK_SHIFT, 1 << TICK_SHIFT), 2);
        assert_eq!(expiry(u64::MAX, u64::MAX), MAX_EXPIRY);
        let mut w = 0;
        run(&mut w, |w| add(w, 0, MAX_EXPIRY, u32::MAX));
        assert_eq!(valid_tokens(w, MAX_EXPIRY - 1), MAX_TOKENS);
        assert_eq!(tokens(w), MAX_TOKENS);
    }
}
