//! Fixed and sliding windows as pure arithmetic over one packed word.
//!
//! # Window index without a division
//!
//! A reading `t` ns after the limiter's epoch falls in window `k = floor(t / W)`. The hot path
//! finds `k` with a multiply by the precomputed reciprocal `floor(2^64 / W)`, which gives `k` or
//! `k - 1`, and one comparison that corrects it: exact, and no division instruction.
//!
//! # Layouts
//!
//! Counts are as wide as the limit needs (`count_bits` = bit length of the limit); the window index
//! takes the rest, wrapping.
//!
//! | limiter | bits, low to high |
//! |---|---|
//! | fixed window | `count` (`count_bits`), `index` (`64 - count_bits`) |
//! | sliding window counter | `current` (`count_bits`), `previous` (`count_bits`), `index` (`64 - 2·count_bits`) |
//!
//! # Clock steps and wrap-around
//!
//! The distance `d = (k - index) mod 2^index_bits` is read as: 0, the same window; 1 (sliding
//! only), the next window; in the upper half, a clock that stepped back; otherwise a window
//! further on, whose counts all start at 0. A window index that wrapped all the way round can only
//! be misread as "same" or "next", which keeps old counts: fewer admissions, never more.
//!
//! The first check in a new window writes the new index (and the counts it rolls), a peek or a
//! denial included: once per window, so that the stored window is always the latest any reading
//! has reached. A reading behind it (a step back, or a stale reading from another thread) is then
//! decided as a stalled clock would decide it: at the start of the stored window, the stalled
//! clock's earliest possible position, where the counts are as they are and the previous window's
//! weight is whole; so it never admits more than a clock that had stalled. Its waits are measured
//! from the reading itself: the distance back to that window's start is added, so waiting them is
//! enough and a denial never advertises zero. A reading before the epoch is the same case.

use core::num::NonZeroU64;

use crate::decision::{Decision, Detail, count32};
use crate::quota::{Quota, QuotaError};
use crate::state_cell::Step;

/// A window quota: at most `limit` admissions per window of `window` ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowParams {
    pub(crate) limit: u64,
    pub(crate) window: u64,
    /// floor(2^64 / window), for the division-free window index (window >= 2).
    recip: u128,
    pub(crate) count_bits: u32,
    pub(crate) epoch: u64,
}

impl WindowParams {
    /// The largest limit of a sliding window counter: two counts and at least 24 bits of index.
    pub(crate) const MAX_SLIDING_LIMIT: u64 = (1 << 20) - 1;

    /// `quota.rate()` admissions per `quota.per()`, counted from `epoch`.
    pub(crate) fn new(
        quota: &Quota,
        epoch: u64,
        max_limit: u64,
    ) -> Result<WindowParams, QuotaError> {
        let limit = quota.rate();
        if limit > max_limit {
            return Err(QuotaError::LimitTooLarge { limit });
        }
        let window = quota.per().as_nanos() as u64;
        Ok(WindowParams {
            limit,
            window,
            recip: (1u128 << 64) / u128::from(window),
            count_bits: u64::BITS - limit.leading_zeros(),
            epoch,
        })
    }

    /// The window index of `now`, and the ns elapsed in it. A reading before the epoch counts as
    /// the epoch.
    #[inline]
    pub(crate) fn locate(&self, now: u64) -> (u64, u64) {
        let t = now.saturating_sub(self.epoch);
        let mut k = ((u128::from(t) * self.recip) >> 64) as u64;
        // The reciprocal is rounded down, so k is exact or one short.
        if (u128::from(k) + 1) * u128::from(self.window) <= u128::from(t) {
            k += 1;
        }
        (k, t - k * self.window)
    }

    /// The word of `now`'s window with every count 0 (`counts` counts in the word).
    pub(crate) fn empty_word(&self, now: u64, counts: u32) -> u64 {
        let (k, _) = self.locate(now);
        // The index's high bits fall off the word, as they do when a step stores it.
        k.checked_shl(counts * self.count_bits).unwrap_or(0)
    }

    /// ns from a reading `elapsed` ns into its window to that window's end.
    #[inline]
    pub(crate) fn left_in_window(&self, elapsed: u64) -> u64 {
        self.window - elapsed
    }

    fn index_bits(&self, counts: u32) -> u32 {
        64 - counts * self.count_bits
    }

    /// The stored index's mask (`counts` counts in the word).
    fn index_mask(&self, counts: u32) -> u64 {
        let bits = self.index_bits(counts);
        if bits == 64 {
            u64::MAX
        } else {
            (1 << bits) - 1
        }
    }

    /// Keeps `from`'s grid when the window's length is the same (only the limit changes), so that
    /// counts carried over expire when they would have.
    pub(crate) fn follow(&mut self, from: &WindowParams) {
        if self.window == from.window {
            self.epoch = from.epoch;
        }
    }

    /// The longest idle read exactly, in ns (saturating): `2^(index_bits - 1) - 1` windows. Past it
    /// the window index is read modulo its width and old counts may be kept (fewer admissions,
    /// never more).
    pub(crate) fn horizon_ns(&self, counts: u32) -> u64 {
        let windows = (1u128 << (self.index_bits(counts) - 1)) - 1;
        u64::try_from(windows * u128::from(self.window)).unwrap_or(u64::MAX)
    }

    /// ns from a reading `elapsed` ns into window `k` (and `before_epoch` ns before the epoch)
    /// to the start of the stored window ahead of it, where it is decided as a stalled clock
    /// would decide it. Rare (a clock step back, a stale reading): kept out of the hot path.
    #[cold]
    #[inline(never)]
    fn behind(&self, stored: u64, k: u64, elapsed: u64, before_epoch: u64, mask: u64) -> u64 {
        let back = u128::from(stored.wrapping_sub(k) & mask);
        let behind =
            back * u128::from(self.window) - u128::from(elapsed) + u128::from(before_epoch);
        u64::try_from(behind).unwrap_or(u64::MAX)
    }

    /// Where `now` falls against the stored window index.
    #[inline]
    fn position(&self, stored: u64, now: u64, counts: u32) -> Position {
        let (k, elapsed) = self.locate(now);
        // A reading before the epoch is read as the epoch; its waits count the difference.
        let before_epoch = self.epoch.saturating_sub(now);
        let mask = self.index_mask(counts);
        let d = k.wrapping_sub(stored) & mask;
        let (step, elapsed, behind) = if d == 0 {
            (Move::Same, elapsed, before_epoch)
        } else if d > mask >> 1 {
            (
                Move::Same,
                0,
                self.behind(stored, k, elapsed, before_epoch, mask),
            )
        } else if d == 1 {
            (Move::Next, elapsed, 0)
        } else {
            (Move::Later, elapsed, 0)
        };
        Position {
            step,
            index: if step == Move::Same { stored } else { k },
            elapsed,
            behind,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Move {
    Same,
    Next,
    Later,
}

/// A reading placed against the stored window.
#[derive(Debug, Clone, Copy)]
struct Position {
    step: Move,
    /// The window the decision is made in.
    index: u64,
    /// ns into that window the decision is made at.
    elapsed: u64,
    /// ns from the reading to the instant the decision is made at (a reading behind the stored
    /// window, or before the epoch), added to every wait; 0 otherwise.
    behind: u64,
}

/// What a window step carries out of the CAS loop, in two words (so in registers, `Option`
/// included): where the reading fell in the decision's window, the counts the request was decided
/// on and the verdict. The figures (what remains, the waits) are worked out from them once the
/// loop is done ([`WindowAnswer::decision`]), so the loop and its retries do not.
///
/// `at` is the ns elapsed in the window, or with [`WindowAnswer::BEHIND`] set the ns the reading
/// is behind the instant decided at (a reading behind the stored window, or before the epoch):
/// one of the two is always 0, since such a reading is decided at its window's start.
///
/// `meta`, low to high:
///
/// | bits | what |
/// |---|---|
/// | 0 to 60 | the counts: a fixed window's count after the request; a sliding window's current count (after the request) in bits 0 to 19, previous count in bits 20 to 39, and the request's size in bits 40 to 59 |
/// | 61 | [`WindowAnswer::BEHIND`]: `at` is the distance behind, elapsed is 0 |
/// | 62 | [`WindowAnswer::ALLOWED`]: the request passed |
/// | 63 | always set, so that `meta` is never 0 (a niche for `Option`) |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowAnswer {
    at: u64,
    meta: NonZeroU64,
}

impl WindowAnswer {
    const COUNTS: u64 = (1 << 61) - 1;
    const BEHIND: u64 = 1 << 61;
    const ALLOWED: u64 = 1 << 62;
    const SET: u64 = 1 << 63;
    /// A sliding window's counts: each below 2^20 ([`WindowParams::MAX_SLIDING_LIMIT`]).
    const SLIDING_BITS: u32 = 20;

    #[inline(always)]
    fn new(allowed: bool, at: &Position, counts: u64) -> WindowAnswer {
        // A reading behind the instant decided at is decided at its window's start.
        debug_assert!(at.behind == 0 || at.elapsed == 0);
        let (at, behind) = if at.behind == 0 {
            (at.elapsed, 0)
        } else {
            (at.behind, Self::BEHIND)
        };
        let allowed = if allowed { Self::ALLOWED } else { 0 };
        WindowAnswer {
            at,
            // `SET` is in it.
            meta: NonZeroU64::new(Self::SET | allowed | behind | (counts & Self::COUNTS))
                .unwrap_or(NonZeroU64::MAX),
        }
    }

    /// Whether the request passed.
    #[inline(always)]
    pub(crate) fn is_allowed(&self) -> bool {
        self.meta.get() & Self::ALLOWED != 0
    }

    /// The ns elapsed in the window, and the ns the reading is behind the instant decided at.
    #[inline(always)]
    fn elapsed_behind(&self) -> (u64, u64) {
        if self.meta.get() & Self::BEHIND == 0 {
            (self.at, 0)
        } else {
            (0, self.at)
        }
    }

    #[inline(always)]
    fn counts(&self) -> u64 {
        self.meta.get() & Self::COUNTS
    }

    /// The decision, with the figures the window's kind worked out from this answer, waits
    /// rounded up to `resolution`.
    #[inline(always)]
    pub(crate) fn decision(self, figures: Figures, p: &WindowParams, resolution: u64) -> Decision {
        Decision::new(
            self.is_allowed(),
            resolution,
            Detail::Eager {
                remaining: count32(figures.remaining),
                retry_ns: figures.retry_ns,
                reset_ns: figures.reset_ns,
                limit: count32(p.limit),
            },
        )
    }
}

/// A decision's figures.
pub struct Figures {
    remaining: u64,
    retry_ns: u64,
    reset_ns: u64,
}

/// The verdict as a `StateCell` step: `word` stored when `store`, else kept.
#[inline(always)]
fn verdict(answer: WindowAnswer, word: u64, store: bool) -> Step<WindowAnswer> {
    if store {
        Step::Store(answer, word)
    } else {
        Step::Keep(answer)
    }
}

/// One fixed-window step for `n <= limit` at `now`.
#[inline(always)]
pub(crate) fn fixed(word: u64, now: u64, n: u32, p: &WindowParams) -> Step<WindowAnswer> {
    let cb = p.count_bits;
    let count_mask = (1u64 << cb) - 1;
    let (stored, count) = (word >> cb, word & count_mask);
    let at = p.position(stored, now, 1);
    let (index, count) = match at.step {
        // A step back keeps the stored window and its count.
        Move::Same => (at.index, count),
        Move::Next | Move::Later => (at.index, 0),
    };
    let n = u64::from(n);
    // A new window is written even by a peek or a denial, so that a later reading from behind it
    // cannot decide in the window before.
    let rolled = index != stored;
    if count + n <= p.limit {
        let after = count + n;
        let answer = WindowAnswer::new(true, &at, after);
        verdict(answer, (index << cb) | after, n > 0 || rolled)
    } else {
        let answer = WindowAnswer::new(false, &at, count);
        verdict(answer, (index << cb) | count, rolled)
    }
}

/// The figures of a fixed-window answer.
#[inline(always)]
pub(crate) fn fixed_figures(answer: WindowAnswer, p: &WindowParams) -> Figures {
    let count = answer.counts();
    let (elapsed, behind) = answer.elapsed_behind();
    let to_end = p.left_in_window(elapsed).saturating_add(behind);
    let remaining = p.limit.saturating_sub(count);
    if answer.is_allowed() {
        Figures {
            remaining,
            retry_ns: 0,
            reset_ns: if count == 0 { 0 } else { to_end },
        }
    } else {
        Figures {
            remaining,
            retry_ns: to_end,
            reset_ns: to_end,
        }
    }
}

/// One sliding-window-counter step for `n <= limit` at `now`: the previous window's count weighted
/// by how much of it still overlaps the last `W` ns, plus the current count, must stay within the
/// limit: `previous × (W - elapsed) + (current + n) × W <= limit × W`.
#[inline(always)]
pub(crate) fn sliding(word: u64, now: u64, n: u32, p: &WindowParams) -> Step<WindowAnswer> {
    let cb = p.count_bits;
    let count_mask = (1u64 << cb) - 1;
    let (stored, previous, current) = (
        word >> (2 * cb),
        (word >> cb) & count_mask,
        word & count_mask,
    );
    let at = p.position(stored, now, 2);
    let (index, previous, current) = match at.step {
        Move::Same => (at.index, previous, current),
        Move::Next => (at.index, current, 0),
        Move::Later => (at.index, 0, 0),
    };
    let w = u128::from(p.window);
    let weighted = u128::from(previous) * (w - u128::from(at.elapsed));
    let n = u64::from(n);
    // A peek always passes.
    let passes = n == 0 || weighted + u128::from(current + n) * w <= u128::from(p.limit) * w;
    // As in `fixed`: a new window is written even by a peek or a denial.
    let rolled = index != stored;
    let pack = |current: u64| (index << (2 * cb)) | (previous << cb) | current;
    let counts = |current: u64| {
        let b = WindowAnswer::SLIDING_BITS;
        (n << (2 * b)) | (previous << b) | current
    };
    if passes {
        let answer = WindowAnswer::new(true, &at, counts(current + n));
        verdict(answer, pack(current + n), n > 0 || rolled)
    } else {
        let answer = WindowAnswer::new(false, &at, counts(current));
        verdict(answer, pack(current), rolled)
    }
}

/// The figures of a sliding-window-counter answer.
#[inline(always)]
pub(crate) fn sliding_figures(answer: WindowAnswer, p: &WindowParams) -> Figures {
    let b = WindowAnswer::SLIDING_BITS;
    let mask = (1u64 << b) - 1;
    let counts = answer.counts();
    let (current, previous, n) = (
        counts & mask,
        (counts >> b) & mask,
        (counts >> (2 * b)) & mask,
    );
    let (elapsed, behind) = answer.elapsed_behind();
    let w = u128::from(p.window);
    // Whole admissions left now: limit - current - ceil(weighted / W).
    let weighted = u128::from(previous) * (w - u128::from(elapsed));
    let used = u128::from(current) + weighted.div_ceil(w);
    let remaining = u128::from(p.limit).saturating_sub(used) as u64;
    // When the request passes if nobody else comes: the weight falls as the window moves on; past
    // this window's end the current count becomes the previous one.
    let to_end = p.left_in_window(elapsed);
    let reset_ns = reset_after(previous, current, to_end, p).saturating_add(behind);
    let retry_ns = if answer.is_allowed() {
        0
    } else {
        wait_sliding(previous, current, n, elapsed, p).saturating_add(behind)
    };
    Figures {
        remaining,
        retry_ns,
        reset_ns,
    }
}

/// ns until both counts have slid out: the previous one at the end of this window if the current
/// one is empty, otherwise one more window.
fn reset_after(previous: u64, current: u64, to_end: u64, p: &WindowParams) -> u64 {
    match (previous, current) {
        (0, 0) => 0,
        (_, 0) => to_end,
        _ => to_end.saturating_add(p.window),
    }
}

/// The shortest wait after which `n` more pass, if nobody else comes: within this window, when
/// `previous × (W - e) <= (limit - current - n) × W`; else in the next window, where the current
/// count becomes the previous one and the weight starts again from full.
fn wait_sliding(previous: u64, current: u64, n: u64, elapsed: u64, p: &WindowParams) -> u64 {
    let w = u128::from(p.window);
    let limit = u128::from(p.limit);
    let (previous, current, n) = (u128::from(previous), u128::from(current), u128::from(n));
    if current + n <= limit && previous > 0 {
        // Smallest e' >= elapsed with previous × (W - e') <= (limit - current - n) × W.
        let room = (limit - current - n) * w;
        let need = (previous * w).saturating_sub(room); // previous × e' >= need
        let e = need.div_ceil(previous);
        if e < w {
            return (e as u64).saturating_sub(elapsed).max(1);
        }
    }
    // Next window: current becomes previous; need current × (W - e') + n × W <= limit × W.
    let to_end = u128::from(p.left_in_window(elapsed));
    if n > limit {
        return u64::MAX;
    }
    let room = (limit - n) * w;
    let need = (current * w).saturating_sub(room);
    let e = if current == 0 {
        0
    } else {
        need.div_ceil(current)
    };
    (to_end + e).min(u128::from(u64::MAX)) as u64
}

/// The counts of `word` (`counts` of them, 1 or 2) as of a reading `now`: the full index of the
/// window they stand in, the ns elapsed in it, and (previous, current), rolled as a check would
/// roll them. A reading behind the stored window keeps its counts, at that window's start.
fn counts_at(word: u64, now: u64, counts: u32, p: &WindowParams) -> (u64, u64, u64, u64) {
    let cb = p.count_bits;
    let count_mask = (1u64 << cb) - 1;
    let stored = word >> (counts * cb);
    let current = word & count_mask;
    let previous = if counts == 2 {
        (word >> cb) & count_mask
    } else {
        0
    };
    let (k, elapsed) = p.locate(now);
    let mask = p.index_mask(counts);
    let d = k.wrapping_sub(stored) & mask;
    if d == 0 {
        (k, elapsed, previous, current)
    } else if d > mask >> 1 {
        // Behind the stored window by `back` windows: its counts, at its start.
        let back = stored.wrapping_sub(k) & mask;
        (k.wrapping_add(back), 0, previous, current)
    } else if d == 1 && counts == 2 {
        (k, elapsed, current, 0)
    } else {
        (k, elapsed, 0, 0)
    }
}

/// The word that carries a window limiter's `word`, read at `now`, over to the parameters `to`
/// (`counts` counts per word): the admissions counted stay counted, each count rounded up to the
/// new limit's scale if `proportional`, and at most the new limit.
///
/// A window of the same length keeps the old grid ([`WindowParams::follow`]), so counts expire
/// when they would have. A window of another length starts a new grid at the change: the current
/// count is counted in the new window that holds the change, and the previous count's weight at
/// the change (the part of the previous window still inside the last `W`) becomes a previous
/// count that weighs at least as much there. Either way the new state is never emptier than the
/// old one was at the change.
pub(crate) fn carry(
    word: u64,
    now: u64,
    counts: u32,
    from: &WindowParams,
    to: &WindowParams,
    proportional: bool,
) -> u64 {
    let (index, elapsed, previous, current) = counts_at(word, now, counts, from);
    let scale = |count: u64| -> u64 {
        let count = if proportional {
            (u128::from(count) * u128::from(to.limit)).div_ceil(u128::from(from.limit))
        } else {
            u128::from(count)
        };
        count.min(u128::from(to.limit)) as u64
    };
    let (index, previous) = if to.window == from.window && to.epoch == from.epoch {
        (index, previous)
    } else {
        // previous × (W - e) / W, the old weight at the change, as a count weighing at least as
        // much in the new window at its own elapsed e': × W' / (W' - e'), rounded up.
        let (k, e) = to.locate(now);
        let weight = u128::from(previous) * u128::from(from.window - elapsed);
        let left = u128::from(to.window - e);
        let carried = (weight * u128::from(to.window)).div_ceil(u128::from(from.window) * left);
        (k, carried.min(u128::from(u64::MAX)) as u64)
    };
    let cb = to.count_bits;
    let packed = if counts == 2 {
        (scale(previous) << cb) | scale(current)
    } else {
        scale(current)
    };
    // The index's high bits fall off the word, as they do when a step stores it (the counts take
    // at most 62 bits).
    (index << (counts * cb)) | packed
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::time::Duration;

    #[test]
    fn locate_is_exact() {
        for w in [2u64, 3, 7, 1_000, 999_999_937, 1 << 40] {
            let q = Quota::try_new(1, Duration::from_nanos(w), 1).unwrap();
            let p = WindowParams::new(&q, 5, u64::MAX).unwrap();
            for t in [
                0u64,
                1,
                w - 1,
                w,
                w + 1,
                7 * w - 1,
                7 * w,
                u64::MAX / 3,
                u64::MAX - 5,
            ] {
                let (k, e) = p.locate(t.saturating_add(5));
                let t = t.min(u64::MAX - 5);
                assert_eq!((k, e), (t / w, t % w), "w {w} t {t}");
            }
        }
    }
}
