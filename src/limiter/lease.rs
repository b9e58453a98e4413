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
    /// Taken; this many tokens are left, in a lease that expires at this tick (what a give-back
    /// is checked against).
    Spent { left: u32, expiry: u64 },
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
        Step::Keep(Spend::Spent {
            left: tokens,
            expiry,
        })
    } else {
        let left = tokens - n;
        Step::Store(Spend::Spent { left, expiry }, pack(expiry, left))
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

/// Puts back `n` tokens spent from a lease that expires at tick `spent_expiry`, while that
/// lease is still valid at `now_tick`. They merge as a refill does (`add`): the word's lease then
/// expires at the earlier of its expiry and theirs, so no token given back is spent past its own
/// TTL, and none is dropped while that TTL holds. Past it they are dropped: the node then admits
/// less, never more. Tokens past the cap are dropped too. Says whether they went back.
pub(crate) fn give_back(word: u64, now_tick: u64, spent_expiry: u64, n: u32) -> Step<bool> {
    if n == 0 || now_tick >= spent_expiry {
        return Step::Keep(false);
    }
    let Step::Store((), merged) = add(word, now_tick, spent_expiry, n) else {
        return Step::Keep(false);
    };
    Step::Store(true, merged)
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
        let one_left = Spend::Spent {
            left: 1,
            expiry: 10,
        };
        assert_eq!(run(&mut w, |w| spend(w, 9, 1)), one_left);
        assert_eq!(run(&mut w, |w| spend(w, 9, 0)), one_left);
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
    fn a_give_back_never_outlives_its_own_ttl() {
        let mut w = 0;
        run(&mut w, |w| add(w, 0, 10, 2));
        let Spend::Spent { expiry, .. } = run(&mut w, |w| spend(w, 1, 2)) else {
            panic!("spent");
        };
        assert!(run(&mut w, |w| give_back(w, 2, expiry, 1)));
        assert_eq!(valid_tokens(w, 2), 1);
        // A refill merged in keeps the earlier expiry: a give-back still fits.
        run(&mut w, |w| add(w, 3, 20, 4));
        assert!(run(&mut w, |w| give_back(w, 3, expiry, 1)));
        assert_eq!(valid_tokens(w, 3), 6);
        assert_eq!(valid_tokens(w, 10), 0);
        // Drained and replaced by a later lease: the tokens go back, and the lease now expires
        // when theirs does.
        let _ = run(&mut w, |w| spend(w, 4, 6));
        run(&mut w, |w| add(w, 4, 30, 1));
        assert!(run(&mut w, |w| give_back(w, 4, expiry, 1)));
        assert_eq!(valid_tokens(w, 9), 2);
        assert_eq!(valid_tokens(w, 10), 0);
        // Past their own TTL, or nothing at all: no change.
        assert!(!run(&mut w, |w| give_back(w, 10, expiry, 1)));
        assert!(!run(&mut w, |w| give_back(w, 4, 30, 0)));
        assert_eq!(valid_tokens(w, 9), 2);
        // Never past the cap.
        let mut full = 0;
        run(&mut full, |w| add(w, 0, 10, MAX_TOKENS));
        assert!(run(&mut full, |w| give_back(w, 0, 10, 5)));
        assert_eq!(tokens(full), MAX_TOKENS);
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
