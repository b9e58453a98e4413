//! GCRA as pure arithmetic: old state and a clock reading in, new state and a verdict out.
//!
//! # Implementation details
//!
//! The state is the *theoretical arrival time* (TAT): the instant at which the limiter would be
//! full again. Time is kept in units of `1 / scale` ns, where `token / scale` is the quota's period
//! in lowest terms, so one token is exactly `token` units and nothing is ever truncated. In these
//! units a clock reading of `t` ns is `t × scale`, taken modulo 2^64: the TAT is a wrapping value
//! and only its signed distance from *now* matters.
//!
//! | `ahead = tat - now` (as `i64`) | meaning | tokens now |
//! |---|---|---|
//! | `<= 0` | the TAT is in the past: the limiter is full | `burst` |
//! | `1 ..= window` | `ahead` units of debt | `(window - ahead) / token` |
//! | `> window` | the clock stepped back past the last admission | 0 |
//!
//! A request for `n` tokens costs `n × token` units and passes iff `ahead + cost <= window`; then
//! the TAT becomes `max(tat, now) + cost`. A denial computes `wait = ahead + cost - window`, the
//! units until it would pass, and changes nothing. `docs/design.md` has the range analysis.

use crate::quota::Quota;

/// A quota in GCRA units (`1 / scale` ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GcraParams {
    /// Units per token (the period).
    pub(crate) token: u64,
    /// `burst × token`: the debt a full burst leaves; at most `Quota::MAX_WINDOW` (2^62).
    pub(crate) window: u64,
    /// Units per nanosecond.
    pub(crate) scale: u64,
    /// The most tokens one request may take.
    pub(crate) burst: u32,
}

impl GcraParams {
    pub(crate) const fn new(quota: &Quota) -> GcraParams {
        let (token, scale) = quota.period_fraction();
        GcraParams {
            token,
            window: quota.window_units(),
            scale,
            burst: quota.burst(),
        }
    }

    /// A caller's maximum wait in GCRA units, capped at [`MAX_QUEUE_UNITS`].
    pub(crate) fn queue_limit(&self, max_wait: core::time::Duration) -> u64 {
        u64::try_from(max_wait.as_nanos())
            .unwrap_or(u64::MAX)
            .saturating_mul(self.scale)
            .min(MAX_QUEUE_UNITS)
    }

    /// GCRA units as a duration, rounded up to whole nanoseconds.
    pub(crate) fn duration(&self, units: u64) -> core::time::Duration {
        core::time::Duration::from_nanos(units.div_ceil(self.scale))
    }

    /// `n` within the burst, or the error a reservation gives.
    pub(crate) fn within_burst(&self, n: u32) -> Result<(), crate::gcra::throttle::ThrottleError> {
        crate::quota::InsufficientCapacity::check(n, self.burst)
            .map_err(crate::gcra::throttle::ThrottleError::InsufficientCapacity)
    }

    /// A decision with GCRA figures: `after` units of debt stand, the request passes in `wait`.
    #[inline]
    pub(crate) fn decision(
        &self,
        allowed: bool,
        after: u64,
        wait: u64,
        resolution: u64,
    ) -> crate::decision::Decision {
        crate::decision::Decision::new(
            allowed,
            resolution,
            crate::decision::Detail::Time(crate::decision::time::TimeFigures {
                after,
                wait,
                token: self.token,
                burst: self.burst,
                // At most 128 (`Quota`'s rounding).
                scale: self.scale as u8,
            }),
        )
    }

    /// A clock reading in GCRA units, modulo 2^64.
    #[inline]
    pub(crate) const fn units(&self, now_ns: u64) -> u64 {
        // Most periods are whole nanoseconds: skip the multiply's latency on the hot path.
        if self.scale == 1 {
            now_ns
        } else {
            now_ns.wrapping_mul(self.scale)
        }
    }
}

/// Where new debt starts and how much stands: a TAT behind `now` (as a signed distance) is a full
/// limiter, whose debt starts from now.
#[inline]
const fn debt(tat: u64, now: u64) -> (u64, u64) {
    let ahead = tat.wrapping_sub(now);
    if (ahead as i64) <= 0 {
        (now, 0)
    } else {
        (tat, ahead)
    }
}

/// The TAT that carries `tat` over to a new quota `to` at the same instant: `now` is that instant
/// in `from`'s units, `now_to` in `to`'s. The debt (how far the TAT is ahead of now) is kept as
/// time, or as the share of the window it fills; either is rounded up in the new units, so the
/// new limiter is never fuller than the old one was. No debt stays no debt: a full limiter stays
/// full. As time, a debt past the new window is kept (below the range's bound); as a share, it is
/// at most the whole window (an empty limiter), so that changes back and forth cannot compound a
/// debt carried as time into a smaller window.
pub(crate) fn carry(
    tat: u64,
    now: u64,
    from: &GcraParams,
    now_to: u64,
    to: &GcraParams,
    proportional: bool,
) -> u64 {
    let (_, ahead) = debt(tat, now);
    if ahead == 0 {
        return now_to;
    }
    let (ahead, num, den) = if proportional {
        (ahead.min(from.window), to.window, from.window)
    } else {
        (ahead, to.scale, from.scale)
    };
    // ahead < 2^63 and num <= 2^62: the product fits in 128 bits.
    let carried = (u128::from(ahead) * u128::from(num)).div_ceil(u128::from(den));
    // Below 2^63 with room for the window and a reservation's queue, as every TAT is.
    let bound = u128::from(MAX_QUEUE_UNITS + to.window);
    now_to.wrapping_add(carried.min(bound) as u64)
}

/// [`carry`] for a throttle, whose TAT may stand past the window by the queue of reservations it
/// has granted: the queue is kept as time whichever the carry (those reservations go ahead at
/// their slots, and new ones must queue behind them), and only the part within the window is
/// carried as a share when `proportional`.
#[cfg(feature = "std")]
pub(crate) fn carry_queue(
    tat: u64,
    now: u64,
    from: &GcraParams,
    now_to: u64,
    to: &GcraParams,
    proportional: bool,
) -> u64 {
    let (_, ahead) = debt(tat, now);
    if !proportional || ahead <= from.window {
        return carry(tat, now, from, now_to, to, proportional);
    }
    let within = carry(now.wrapping_add(from.window), now, from, now_to, to, true);
    let queue =
        (u128::from(ahead - from.window) * u128::from(to.scale)).div_ceil(u128::from(from.scale));
    // Within the bound every TAT respects, as in `carry`.
    let room = u128::from(MAX_QUEUE_UNITS + to.window) - u128::from(within.wrapping_sub(now_to));
    within.wrapping_add(queue.min(room) as u64)
}

/// What one step decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Store `tat`; `after` units of debt remain.
    Allow { tat: u64, after: u64 },
    /// Store nothing; `after` units of debt stand and the request passes in `wait` units.
    Deny { after: u64, wait: u64 },
}

/// One GCRA step for `n <= burst` tokens at `now` (GCRA units).
#[inline]
pub(crate) const fn decide(tat: u64, now: u64, n: u32, p: &GcraParams) -> Outcome {
    // Is the TAT behind us? Then the limiter is full and debt starts from now.
    let (_, ahead) = debt(tat, now);
    // n <= burst, so cost <= window <= 2^62; ahead < 2^63: the sum cannot overflow.
    let cost = n as u64 * p.token;
    let after = ahead + cost;
    // A peek (n = 0) always passes, even while the clock is behind the TAT.
    #[cfg(not(atomic_limiter_seeded_bug = "gcra"))]
    let passes = after <= p.window;
    // The fuzzers' teeth check: an off-by-one at the exact boundary, on purpose.
    #[cfg(atomic_limiter_seeded_bug = "gcra")]
    let passes = after <= p.window + 1;
    if passes || n == 0 {
        Outcome::Allow {
            // `max(tat, now) + cost`, as `now + after` (`after` counts from now): one add to a
            // sum already made, not a second conditional move before the CAS (on `CoarseClock`
            // an admission takes 4.2 ns this way, 5.2 the other).
            tat: now.wrapping_add(after),
            after,
        }
    } else {
        Outcome::Deny {
            after: ahead,
            wait: after - p.window,
        }
    }
}

/// What the meter (GCRA's check) carries out of the CAS loop: two words, in registers; the decision
/// is built from them and the parameters once the loop is done ([`Metered::decision`]).
#[derive(Debug, Clone, Copy)]
pub struct Metered {
    /// Units of debt after the decision.
    pub(crate) after: u64,
    /// Units until the request would pass: 0 when allowed (a refusal always waits at least 1).
    pub(crate) wait: u64,
}

impl Metered {
    /// Whether the request passed.
    #[inline(always)]
    pub(crate) const fn is_allowed(&self) -> bool {
        self.wait == 0
    }

    /// The decision, with waits rounded up to `resolution`.
    #[inline(always)]
    pub(crate) fn decision(self, p: &GcraParams, resolution: u64) -> crate::decision::Decision {
        p.decision(self.is_allowed(), self.after, self.wait, resolution)
    }
}

/// The meter (GCRA's check) as a `StateCell` step: a denial or a peek keeps the word, an admission
/// stores the new TAT.
#[inline]
pub(crate) fn meter(
    tat: u64,
    now: u64,
    n: u32,
    p: &GcraParams,
) -> crate::state_cell::Step<Metered> {
    use crate::state_cell::Step;
    match decide(tat, now, n, p) {
        Outcome::Deny { after, wait } => Step::Keep(Metered { after, wait }),
        Outcome::Allow { after, .. } if n == 0 => Step::Keep(Metered { after, wait: 0 }),
        Outcome::Allow { tat, after } => Step::Store(Metered { after, wait: 0 }, tat),
    }
}

/// The most a reservation may wait, in GCRA units: keeps `ahead` below 2^63 (`window <= 2^62`).
pub(crate) const MAX_QUEUE_UNITS: u64 = 1 << 61;

/// One reservation step (the leaky bucket as a queue): `n` tokens are taken now or later, never
/// refused, unless the wait would exceed `max_wait` units. `Ok((new_tat, wait))` stores `new_tat`;
/// `Err(wait)` stores nothing.
#[inline]
pub(crate) const fn reserve(
    tat: u64,
    now: u64,
    n: u32,
    p: &GcraParams,
    max_wait: u64,
) -> Result<(u64, u64), u64> {
    let (base, ahead) = debt(tat, now);
    let cost = n as u64 * p.token;
    // ahead <= window + MAX_QUEUE_UNITS < 2^63, cost <= window: no overflow.
    let after = ahead + cost;
    let wait = after.saturating_sub(p.window);
    if wait > max_wait {
        Err(wait)
    } else {
        Ok((base.wrapping_add(cost), wait))
    }
}

/// Gives back the latest reservation, which left the TAT at `end`: only while the TAT is still
/// there (no reservation came after it, whose slot a move back would double-book), and as
/// [`refund`] never behind `now`. `None` when nothing is given back.
#[inline]
pub(crate) const fn refund_latest(tat: u64, now: u64, end: u64, cost: u64) -> Option<u64> {
    if tat != end {
        return None;
    }
    refund(tat, now, cost)
}

/// Gives back `cost` units of a reservation that was never used: the TAT moves back by `cost`, but
/// never behind `now` (a full limiter cannot be fuller). `None` when there is nothing to give back.
#[inline]
pub(crate) const fn refund(tat: u64, now: u64, cost: u64) -> Option<u64> {
    let ahead = tat.wrapping_sub(now);
    if (ahead as i64) <= 0 {
        None
    } else if ahead <= cost {
        Some(now)
    } else {
        Some(tat - cost)
    }
}

/// How far ahead of now a settlement, a penalty or a block may leave the TAT: the window and a
/// queue's worth past it, the bound every TAT respects (below 2^63, so the signed reading holds).
#[inline]
pub(crate) const fn debt_limit(p: &GcraParams) -> u64 {
    p.window + MAX_QUEUE_UNITS
}

/// Adds `units` of debt to the TAT at `now` (a penalty, or a settlement above its estimate), from
/// now if the limiter is full, up to [`debt_limit`]. `None` when nothing changes.
#[inline]
pub(crate) const fn owe(tat: u64, now: u64, units: u64, p: &GcraParams) -> Option<u64> {
    let (base, ahead) = debt(tat, now);
    let limit = debt_limit(p);
    if units == 0 || ahead >= limit {
        return None;
    }
    let room = limit - ahead;
    let add = if units < room { units } else { room };
    Some(base.wrapping_add(add))
}

/// Settles a charge that took `taken` units and left the TAT at `end`, once its actual cost is
/// known to be `owed` units, at `now`. More than taken is owed as debt ([`owe`]). Less gives the
/// difference back only while the TAT is still `end`: nothing was admitted, owed or given back
/// since (the charge is the latest, as a throttle's refundable reservation is). A refund moves
/// every later request's span, and one word cannot record how far, so a surplus settled after
/// another change is kept (`docs/design.md`, section 16.1, has the interleavings). The TAT never
/// goes behind now, so a span time has already paid down gives nothing back. `None` when nothing
/// changes.
#[inline]
pub(crate) const fn settle(
    tat: u64,
    now: u64,
    end: u64,
    taken: u64,
    owed: u64,
    p: &GcraParams,
) -> Option<u64> {
    if owed > taken {
        return owe(tat, now, owed - taken, p);
    }
    if tat != end {
        return None;
    }
    refund(tat, now, taken - owed)
}

/// Blocks until `units` from now: the TAT at which one token waits exactly that long, unless the
/// limiter already owes more. `None` when nothing changes.
#[inline]
pub(crate) const fn block(tat: u64, now: u64, units: u64, p: &GcraParams) -> Option<u64> {
    let (_, ahead) = debt(tat, now);
    let limit = debt_limit(p);
    let want = units.saturating_add(p.window - p.token);
    let want = if want < limit { want } else { limit };
    if want <= ahead || units == 0 {
        None
    } else {
        Some(now.wrapping_add(want))
    }
}

/// Full again: the TAT moved to now, unless it is behind already.
#[inline]
pub(crate) const fn reset(tat: u64, now: u64) -> Option<u64> {
    let (_, ahead) = debt(tat, now);
    if ahead == 0 { None } else { Some(now) }
}
