//! Refill and decide: the fast refusals, the refill on the tick grid and the decision.

use super::layout::*;
use crate::clock::Reading;
use crate::decision::bucket::BucketFigures;
use crate::decision::bucket::{RATE_FRAC, UNIT};

/// What one step decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Store `word`.
    Allow { word: u64, figures: BucketFigures },
    /// Store nothing.
    Deny { figures: BucketFigures },
    /// Nothing decided: read the clock again and decide on [`Reading::Fresh`].
    Recheck,
}

/// The bucket refilled to `now_ns`: `(base, held, stamp)`, the absolute tick refills count from,
/// the units held, and the stamp to store with them; `None` when the reading must be taken again.
///
/// The two common cases are decided here, inlined into the check: a reading less than half a
/// cycle past the stamp that leaves the bucket clearly below its cap, or full on the grid. The
/// rest (a clock behind the stamp, a long idle, a bucket within the grid's lag of its cap) is
/// [`refilled_rare`], which decides every case the same way.
#[inline(always)]
pub(super) const fn refilled(
    word: u64,
    now_ns: u64,
    p: &BucketParams,
    reading: Reading,
) -> Option<(u128, u64, u64)> {
    let (stamp, tokens) = p.unpack(word);
    let (now_tick, elapsed) = p.elapsed(stamp, now_ns);
    if elapsed < p.recheck_from() {
        let room = p.cap - tokens;
        // Full for sure, told without the products (a stream below its quota finds its bucket
        // full on most checks): the same answer as the test on the refill below.
        if elapsed <= now_tick && p.surely_refills(elapsed, room) {
            return Some(full_at(now_ns, p));
        }
        // As in `refilled_rare`: the same units, the same tests, in the same order.
        let refill = grid_refill(now_tick, elapsed, p);
        if refill + p.grid_lag < room {
            return Some((now_tick as u128, tokens + refill, now_tick));
        }
        if refill >= room {
            return Some(full_at(now_ns, p));
        }
    } else if elapsed >= p.stall_from() && tokens < p.cap {
        // A stamp a little ahead (re-phased, or another core's): behind for every reading,
        // nothing refilled, the stamp kept; a bucket below its cap never re-anchors.
        let ahead = p.stamp_mask() - elapsed + 1;
        return Some((now_tick as u128 + ahead as u128, tokens, stamp));
    }
    refilled_rare(word, now_ns, p, reading)
}

/// [`refilled`] in full, every case: out of line, so that the check's common path stays short.
#[cold]
#[inline(never)]
pub(super) const fn refilled_rare(
    word: u64,
    now_ns: u64,
    p: &BucketParams,
    reading: Reading,
) -> Option<(u128, u64, u64)> {
    let (stamp, tokens) = p.unpack(word);
    let (now_tick, elapsed) = p.elapsed(stamp, now_ns);
    // The common case, a reading less than half a cycle past the stamp, is one comparison; the
    // thresholds that depend on how far the reading is trusted are worked out only past it.
    let behind = elapsed >= p.recheck_from() && {
        let behind_from = match reading {
            Reading::Any => p.backward_from(),
            Reading::Monotonic | Reading::Fresh => p.stall_from(),
        };
        // Stale, or an idle past half the cycle? Only a reading taken after the word can tell.
        if matches!(reading, Reading::Monotonic) && elapsed < behind_from {
            return None;
        }
        elapsed >= behind_from
    };
    // Did the clock step back behind the stamp? Then refill nothing and keep the stamp.
    Some(if behind {
        let behind = p.stamp_mask() - elapsed + 1;
        let stamp_abs = now_tick as u128 + behind as u128;
        // Refills count from a stamp still ahead (set when the bucket was last full, or before the
        // clock stepped back). Still full? Then a take re-anchors at the exact position of now, if
        // that is later than the stamp, as the exact bucket restarts its refill at the take.
        let from = p.rephase(now_ns);
        if tokens == p.cap && from > stamp_abs {
            (from, tokens, from as u64)
        } else {
            (stamp_abs, tokens, stamp)
        }
    } else {
        // elapsed <= now_tick for any stamp this clock could have written; a clock stepped back
        // further than the backward tolerance can break that (a stamp far ahead read as a long
        // idle, as documented): count from tick 0 then, rather than underflow.
        let stamp_abs = now_tick.saturating_sub(elapsed);
        // At most elapsed × UNIT + 1 < 2^63: fits.
        let at_now = now_tick as u128 * p.rate as u128;
        let from_units = p.units(stamp_abs);
        let refill = ((at_now >> RATE_FRAC) - from_units) as u64;
        // Far from the cap (further below than the grid can trail the exact refill)? Then the
        // whole-unit refill is all there is to it.
        if refill + p.grid_lag < p.cap - tokens {
            (now_tick as u128, tokens + refill, now_tick)
        } else {
            // Near the cap: is the *exact* bucket full? (Surely, if the grid already is.)
            let full = refill >= p.cap - tokens
                || ((tokens as i128) << RATE_FRAC) + p.position_past(now_ns, stamp_abs as u128)
                    >= (p.cap as i128) << RATE_FRAC;
            if full {
                full_at(now_ns, p)
            } else {
                (now_tick as u128, tokens + refill, now_tick)
            }
        }
    })
}

/// The bucket full at `now_ns`, for both paths of [`refilled`]. The exact bucket drops the excess
/// and everything accrued before this nanosecond; so must the grid, or it would run ahead of exact
/// time: the next refill counts from the first tick at or past the exact position (a stamp in the
/// future reads as "no refill yet").
#[inline(always)]
pub(super) const fn full_at(now_ns: u64, p: &BucketParams) -> (u128, u64, u64) {
    #[cfg(not(atomic_limiter_seeded_bug = "bucket"))]
    let from = p.rephase(now_ns);
    // The fuzzers' teeth check: no re-phase, so the part of a unit accrued on the grid is kept at
    // the cap (the lead the property tests first found).
    #[cfg(atomic_limiter_seeded_bug = "bucket")]
    let from = (now_ns >> p.shift) as u128;
    (from, p.cap, from as u64)
}

/// Whether a denial that left `held` units, decided at `made_ns`, is the step's answer on the same
/// word at `later_ns` too (each read as `Reading::of` has it: a denial is never a recheck, and
/// where the two kinds of reading differ a monotonic one asks for a recheck). Every case of
/// [`refilled`] that can deny depends on the reading only through its tick, but the one near the
/// cap, which also asks where the exact bucket stands within the tick: a denial that left the
/// bucket further below its cap than the grid can trail never came from it.
#[inline(always)]
pub(crate) const fn denial_stands(
    held: u64,
    made_ns: u64,
    later_ns: u64,
    p: &BucketParams,
) -> bool {
    made_ns >> p.shift == later_ns >> p.shift && held + p.grid_lag < p.cap
}

/// The step's answer on the same word at `later_ns`, a later tick than the denial at `made_ns`
/// that left `held` units and lacked `need` (its base `ahead` ticks past its reading's), when it
/// is a denial again: `None` where only the step can tell.
///
/// The later tick refills from the base as the step would (nothing while the base is still
/// ahead), and the step reads it the same way while the bucket stays further below its cap
/// than the grid can trail ([`denial_stands`]) and the request still lacks something: a denial
/// never comes from an idle near a threshold of the stamp's cycle (an idle of a sixteenth of the
/// cycle fills the bucket), and a stamp ahead stays ahead until the reading reaches it. Up to
/// 2^20 ticks later (a coarse clock lags by milliseconds), which keeps the refill within a word.
#[inline(always)]
pub(crate) const fn denial_carried(
    (ahead, held, need): (u64, u64, u64),
    made_ns: u64,
    later_ns: u64,
    p: &BucketParams,
) -> Option<(u64, u64, u64)> {
    let made = made_ns >> p.shift;
    let later = later_ns >> p.shift;
    if later <= made || later - made >= 1 << 20 || held + p.grid_lag >= p.cap {
        return None;
    }
    let Some(base) = made.checked_add(ahead) else {
        return None;
    };
    if later < base {
        return Some((base - later, held, need));
    }
    // `units(later) - units(base)` from one full product where `BucketParams::units` takes two
    // (the second cost a coarse denial at 100/s about 0.07x of GCRA's time): the base's own
    // position enters only through the part of a unit it holds, the low bits of a wrapping
    // product.
    let accrued = base.wrapping_mul(p.rate) & ((1 << RATE_FRAC) - 1);
    let refill = (((later - base) as u128 * p.rate as u128 + accrued as u128) >> RATE_FRAC) as u64;
    if refill >= need || held + refill + p.grid_lag >= p.cap {
        return None;
    }
    Some((0, held + refill, need - refill))
}

/// Whether the step at `now_ns` refuses `n` tokens on `word`, told from an upper bound on the
/// refill (one product) where the step's refill takes two: a request that lacks more than that
/// bound and the grid's lag is refused on [`refilled`]'s common path, which [`refused`] then
/// retraces for the figures, only when they are read. Over `elapsed` ticks the whole-unit refill
/// is a difference of floors, at most `floor(elapsed × rate / 2^RATE_FRAC) + 1`.
///
/// Asked first: a bucket that holds the cost answers at its first comparison, so an admission
/// pays two instructions for it.
#[inline(always)]
pub(crate) const fn surely_refused(word: u64, now_ns: u64, n: u32, p: &BucketParams) -> bool {
    let (stamp, tokens) = p.unpack(word);
    let cost = n as u64 * UNIT;
    if tokens >= cost {
        return false;
    }
    let (_, elapsed) = p.elapsed(stamp, now_ns);
    // A stamp a little ahead: nothing refilled, on every reading.
    if elapsed >= p.stall_from() {
        return true;
    }
    // Below the cycle (2^53 ticks), so the bound is a word even for a saturated rate; the sum is
    // asked only below half of it, where it is below 2^63. A stamp read as lying before tick 0
    // refills from tick 0, less than the bound.
    let most = ((elapsed as u128 * p.rate as u128) >> RATE_FRAC) as u64 + 1;
    elapsed < p.recheck_from() && tokens + most + p.grid_lag < cost
}

/// The figures of the refusal [`surely_refused`] told, as [`refilled`] works them out in the
/// two cases that function tells: a stamp ahead (nothing refilled, refills counting from the
/// stamp), and the common path (the refill, below the room less the grid's lag, neither surely
/// fills the bucket nor brings it near its cap).
#[inline(always)]
pub(crate) const fn refused(word: u64, now_ns: u64, n: u32, p: &BucketParams) -> BucketFigures {
    let (stamp, tokens) = p.unpack(word);
    let (now_tick, elapsed) = p.elapsed(stamp, now_ns);
    let (base, held) = if elapsed >= p.stall_from() {
        let ahead = p.stamp_mask() - elapsed + 1;
        (now_tick as u128 + ahead as u128, tokens)
    } else {
        (now_tick as u128, tokens + grid_refill(now_tick, elapsed, p))
    };
    // Below the cost where `surely_refused` holds; within the cap and at least one unit lacking
    // all the same, so that no figure can come out of range.
    let held = if held < p.cap { held } else { p.cap };
    let need = (n as u64 * UNIT).saturating_sub(held);
    let need = if need == 0 { 1 } else { need };
    BucketFigures::new(now_ns, base, held, need, p)
}

/// The whole units refilled over the `elapsed` ticks up to `now_tick`, counted from tick 0 if
/// they reach back past it.
#[inline(always)]
pub(super) const fn grid_refill(now_tick: u64, elapsed: u64, p: &BucketParams) -> u64 {
    let stamp_abs = now_tick.saturating_sub(elapsed);
    // At most elapsed × UNIT + 1 < 2^63: fits.
    let at_now = now_tick as u128 * p.rate as u128;
    ((at_now >> RATE_FRAC) - p.units(stamp_abs)) as u64
}

/// One token-bucket step for `n <= burst` tokens at `now_ns`.
#[inline(always)]
pub(crate) const fn decide(
    word: u64,
    now_ns: u64,
    n: u32,
    p: &BucketParams,
    reading: Reading,
) -> Outcome {
    let Some((base, held, stamp)) = refilled(word, now_ns, p, reading) else {
        return Outcome::Recheck;
    };
    let cost = n as u64 * UNIT;
    if held >= cost {
        Outcome::Allow {
            word: p.pack_held(stamp, held - cost),
            figures: BucketFigures::new(now_ns, base, held - cost, 0, p),
        }
    } else {
        Outcome::Deny {
            figures: BucketFigures::new(now_ns, base, held, cost - held, p),
        }
    }
}

/// How the bucket builds a decision's figures from its parameters.
impl BucketFigures {
    /// The figures of a decision at `now_ns` made on a base tick, the units held after it and the
    /// units the request lacked.
    #[inline(always)]
    const fn new(
        now_ns: u64,
        base: u128,
        tokens: u64,
        need: u64,
        p: &BucketParams,
    ) -> BucketFigures {
        // `refilled` never puts the base behind now's tick, nor more than a cycle (2^53 ticks)
        // ahead; saturating all the same.
        let ahead = base.saturating_sub((now_ns >> p.shift) as u128);
        BucketFigures {
            now_ns,
            rate: p.rate,
            ahead: if ahead > u64::MAX as u128 {
                u64::MAX
            } else {
                ahead as u64
            },
            // Both at most the cap, `burst × UNIT` < 2^31 (`MAX_TOKEN_BITS`).
            tokens: tokens as u32,
            need: need as u32,
            burst: p.burst,
            shift: p.shift as u8,
        }
    }
}
