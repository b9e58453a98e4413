//! A bucket's state carried to another quota, and tokens given back.

use super::layout::*;
use super::refill::*;
use crate::clock::Reading;
use crate::decision::bucket::RATE_FRAC;

/// The units the grid may run ahead of the exact refill, just after a carry puts the stamp at
/// the tick that holds the change's instant: up to a tick's refill (one unit, the tick being at
/// most a unit) counted before that instant, up to one unit already accrued on the grid at that
/// tick, and one unit for the rate rounded down on the way in.
pub(super) const CARRY_MARGIN: u64 = 3;

/// The word that carries `word`, read at `now_ns`, over to the bucket `to` at the same instant.
/// What the bucket lacks of full (its debt) is kept as time, or as its share of the cap
/// (`proportional`); either way the new bucket holds [`CARRY_MARGIN`] less than that, so that its
/// grid, counted from the change's tick, is never ahead of the exact bucket carried the same way.
/// A full bucket stays full, re-phased as at creation.
pub(crate) fn carry(
    word: u64,
    now_ns: u64,
    from: &BucketParams,
    to: &BucketParams,
    proportional: bool,
) -> u64 {
    // A fresh reading: the change read the clock after it took the word.
    let Some((base, held, _)) = refilled(word, now_ns, from, Reading::Fresh) else {
        return to.pack(now_ns >> to.shift, 0);
    };
    if held >= from.cap {
        return to.full(now_ns);
    }
    let missing = u128::from(from.cap - held);
    let carried = if proportional {
        (missing * u128::from(to.cap)).div_ceil(u128::from(from.cap))
    } else {
        // The debt as time: until refills start (a stamp still ahead), then the missing units at
        // the old rate; in new units at the new rate, rounded up.
        let start = (base << from.shift).saturating_sub(u128::from(now_ns));
        // Whole ticks (rounded up), then ns: `missing << RATE_FRAC` < 2^84, and a tick of 2^shift
        // ns may take the product past 128 bits only for quotas whose debt is centuries.
        let ticks = (missing << RATE_FRAC).div_ceil(u128::from(from.rate.max(1)));
        let refill_ns = ticks.saturating_mul(1 << from.shift);
        let debt_ns = start.saturating_add(refill_ns);
        debt_ns
            .saturating_mul(u128::from(to.rate))
            .div_ceil(1u128 << (RATE_FRAC + to.shift))
    };
    let held = u128::from(to.cap).saturating_sub(carried + u128::from(CARRY_MARGIN));
    // Below the cap, so within the token field.
    to.pack(now_ns >> to.shift, held as u64)
}

/// Gives back `cost` units taken moments ago and never used: added to the units held as of the
/// stamp (so never past the cap), then refilled to `now_ns` with the same cap test as a check, so a
/// bucket made full by the return re-phases like any other. `None` when nothing changes.
#[inline]
pub(crate) const fn give_back(word: u64, now_ns: u64, cost: u64, p: &BucketParams) -> Option<u64> {
    let (stamp, tokens) = p.unpack(word);
    let sum = tokens + cost;
    let topped = p.pack(stamp, if sum > p.cap { p.cap } else { sum });
    // A step back is read as one (the conservative reading): a give-back never needs another.
    let Some((_, held, stamp)) = refilled(topped, now_ns, p, Reading::Any) else {
        return None;
    };
    let new = p.pack(stamp, held);
    if new == word { None } else { Some(new) }
}

/// Settles a charge of `taken` tokens that stored `stored`, at `actual` tokens, at `now_ns`. An
/// excess is taken from what is held now, down to empty (a bucket holds no less than nothing). A
/// surplus comes back only while the word is still `stored` (the charge is the latest change, as
/// GCRA's), through the give-back: never past the cap. `None` when nothing changes.
pub(crate) fn settle(
    word: u64,
    now_ns: u64,
    stored: u64,
    taken: u32,
    actual: u32,
    p: &BucketParams,
) -> Option<u64> {
    use crate::decision::bucket::UNIT;
    if actual > taken {
        let more = u64::from(actual - taken).saturating_mul(UNIT);
        let (_, held, stamp) = refilled(word, now_ns, p, Reading::Any)?;
        let new = p.pack(stamp, held.saturating_sub(more));
        return (new != word).then_some(new);
    }
    if word != stored {
        return None;
    }
    give_back(word, now_ns, u64::from(taken - actual) * UNIT, p)
}
