//! A bucket's state carried to another quota, and tokens given back.

use super::layout::*;
use super::refill::*;
use crate::clock::Reading;
use crate::decision::bucket::RATE_FRAC;

/// One unit in the fixed point of the carry: `2^RATE_FRAC`.
const ONE: i128 = 1 << RATE_FRAC;

/// The word that carries `word`, read at `now_ns`, over to the bucket `to` at the same instant.
///
/// A word stands for an exact bucket: its tokens plus how far the instant's exact position lies
/// past the whole units counted at its stamp, the part of a unit the grid has not counted yet.
/// Neither that bucket nor the grid is ever ahead of the exact one, so the larger of the two (the
/// tokens alone, for a stamp still ahead) is what the old bucket holds. What it lacks of full (its
/// debt) is kept as time, or as its share of the cap (`proportional`), in the new units and rounded
/// up, at most the whole new cap: a bucket holds no less than nothing. A full bucket stays full.
///
/// The new word is stamped at the instant's tick and holds that less the part of a unit its grid
/// has not counted yet, rounded down: its exact bucket trails the carry by under a unit, and
/// nothing of the old grid's rounding is carried (a unit of a slow quota is most of a token of a
/// fast one). A bucket holding less than that part is stamped where a full one would be, at the
/// first tick whose whole units reach the instant's position, so that it counts nothing before.
pub(crate) fn carry(
    word: u64,
    now_ns: u64,
    from: &BucketParams,
    to: &BucketParams,
    proportional: bool,
) -> u64 {
    // A fresh reading: the change read the clock after it took the word.
    let exact = match refilled(word, now_ns, from, Reading::Fresh) {
        Some((base, held, _)) => {
            let uncounted = from.position_past(now_ns, base).max(0);
            let debt = (i128::from(from.cap - held) << RATE_FRAC) - uncounted;
            // Full on the grid (`held` is at most the cap) or by the exact count: full.
            if debt <= 0 {
                return to.full(now_ns);
            }
            let carried = if proportional {
                (debt as u128 * u128::from(to.cap)).div_ceil(u128::from(from.cap))
            } else {
                carried_as_time(debt as u128, from, to)
            };
            // A debt above zero carries at least one step, so this is below the cap: the word
            // below is never a full one.
            let cap = i128::from(to.cap) << RATE_FRAC;
            cap - i128::try_from(carried).unwrap_or(i128::MAX).min(cap)
        }
        None => 0,
    };
    let tick = now_ns >> to.shift;
    let uncounted = to.position_past(now_ns, u128::from(tick));
    if exact >= uncounted {
        to.pack(tick, ((exact - uncounted) / ONE) as u64)
    } else {
        to.pack(to.rephase(now_ns) as u64, (exact / ONE) as u64)
    }
}

/// A debt of `debt` (in `2^-RATE_FRAC` of a unit of `from`) as time, then in units of `to`, each
/// rounded up. The old rate is rounded down, so the time is never less than the exact bucket's.
/// The new rate is rounded down too, which takes under 2^-21 of a unit off any debt within the cap
/// (under 2^32 ticks at under 2^-53 of a unit each): 2^-20 of a unit more makes up for it. The
/// quotient is split from the remainder so that a tick of `2^shift` ns saturates only for debts of
/// centuries.
fn carried_as_time(debt: u128, from: &BucketParams, to: &BucketParams) -> u128 {
    let rate = u128::from(from.rate.max(1));
    let (whole, rest) = (debt / rate, debt % rate);
    // `rest < rate < 2^64` and `shift < 64`, so the shift stays inside 128 bits.
    let part = (rest << from.shift).div_ceil(rate);
    let ns = whole
        .checked_shl(from.shift)
        .filter(|w| w >> from.shift == whole)
        .map_or(u128::MAX, |w| w.saturating_add(part));
    ns.saturating_mul(u128::from(to.rate))
        .div_ceil(1 << to.shift)
        .saturating_add(1 << (RATE_FRAC - 20))
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
