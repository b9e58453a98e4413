//! [`CalendarWindow`]: a fixed window on calendar boundaries (a UTC minute, hour, day, ISO week,
//! month or year), its count and the period's index in one `AtomicU64`.

use super::civil::Calendar;
use crate::clock::Clock;
use crate::decision::{Decision, Detail};
use crate::quota::InsufficientCapacity;
use crate::state_cell::{StateCell, Step};

/// The word's layout, low to high:
///
/// | bits | what |
/// |---|---|
/// | 0 to 31 | tokens taken in the period |
/// | 32 to 63 | the period's index plus one (0: nothing taken yet) |
const COUNT_BITS: u32 = 32;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

/// At most `limit` admissions per calendar period in UTC: a plan of 10 000 calls a month, reset
/// at midnight UTC on the first of each month (or each minute, hour, day, ISO week or year).
///
/// A fixed window whose windows are the calendar's, so that a bill and the quota agree: a month
/// is 28 to 31 days, February's length in a leap year included. The limit holds per period, not
/// per any span of that length: a client may spend its month on the 31st and again on the 1st.
/// `reset_after` and a refusal's `retry_after` are the time to the next boundary. Time zones are
/// out of scope: every boundary is UTC's.
///
/// The clock must read nanoseconds since the Unix epoch, as [`UtcClock`](crate::UtcClock) (the
/// default) does, or a [`ManualClock`](crate::ManualClock) set so in tests; a monotonic clock
/// from an arbitrary origin would put the boundaries anywhere. A clock stepping back keeps the
/// current period and its count (a period already over is never reopened), and one stepping
/// forward into a later period starts it afresh.
///
/// # Examples
///
/// 10 000 a month, and a fresh count on the first of the next:
///
/// ```
/// use atomic_limiter::{Calendar, CalendarWindow, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// // 2024-02-29T12:00:00Z, in a leap year's February.
/// clock.set(1_709_208_000_000_000_000);
/// let plan = CalendarWindow::with_clock(10_000, Calendar::Month, clock.clone());
/// assert!(plan.check_n(10_000).unwrap().is_allowed());
/// let refused = plan.check();
/// assert!(refused.is_denied());
/// // Twelve hours to the 1st of March.
/// assert_eq!(refused.retry_after(), Duration::from_secs(12 * 3600));
/// clock.advance(refused.retry_after());
/// assert!(plan.check().is_allowed());
/// ```
#[derive(Debug)]
pub struct CalendarWindow<C> {
    word: StateCell,
    limit: u32,
    period: Calendar,
    clock: C,
}

#[cfg(feature = "std")]
impl CalendarWindow<crate::clock::UtcClock> {
    /// `limit` per `period`, on the system's UTC clock.
    pub fn new(limit: u32, period: Calendar) -> Self {
        CalendarWindow::with_clock(limit, period, crate::clock::UtcClock::new())
    }
}

impl<C: Clock> CalendarWindow<C> {
    /// `limit` per `period`, on `clock` (nanoseconds since the Unix epoch).
    pub fn with_clock(limit: u32, period: Calendar, clock: C) -> Self {
        CalendarWindow {
            word: StateCell::new(0),
            limit,
            period,
            clock,
        }
    }

    /// The most tokens a period admits.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The period each window spans.
    pub fn period(&self) -> Calendar {
        self.period
    }

    /// The clock the limiter reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Asks for one token.
    pub fn check(&self) -> Decision {
        // A limit of 0 refuses every request, as a window does.
        self.check_n(1)
            .unwrap_or_else(|_| Decision::never(self.limit))
    }

    /// Asks for `n` tokens, all or nothing; `n = 0` peeks.
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] if `n` exceeds the limit.
    pub fn check_n(&self, n: u32) -> Result<Decision, InsufficientCapacity> {
        InsufficientCapacity::check(n, self.limit)?;
        let now = self.clock.now();
        let (index, end) = self.period.window(now);
        let (allowed, count) = self.word.update(|word| step(word, index, n, self.limit));
        let to_end = end.saturating_sub(now).max(1);
        Ok(Decision::new(
            allowed,
            1,
            Detail::Eager {
                remaining: self.limit - count,
                retry_ns: if allowed { 0 } else { to_end },
                reset_ns: if count == 0 { 0 } else { to_end },
                limit: self.limit,
            },
        ))
    }
}

#[cfg(atomic_limiter_loom)]
impl<C: Clock> CalendarWindow<C> {
    /// For the loom models' teeth: one token, the CAS replaced by a load and a store.
    pub(crate) fn loom_broken_check(&self) -> bool {
        let (index, _) = self.period.window(self.clock.now());
        self.word
            .update_racy(|word| step(word, index, 1, self.limit))
            .0
    }
}

/// One check of `n <= limit` tokens in the period `index`: whether it passes, and the count after
/// it. A word of an earlier period counts as empty; one of a later period (the clock stepped
/// back) is kept, and decided in.
fn step(word: u64, index: u64, n: u32, limit: u32) -> Step<(bool, u32)> {
    let stored = word >> COUNT_BITS;
    // Periods past 2^32 - 2 (minutes after the year 10136) share the last index: never reached
    // by a clock of nanoseconds in a u64.
    let current = (index + 1).min(u64::from(u32::MAX));
    let (period, count) = if stored >= current {
        (stored, (word & COUNT_MASK) as u32)
    } else {
        (current, 0)
    };
    if n == 0 || count + n > limit {
        // A peek, or a refusal: nothing written (a new period needs no write to begin).
        return Step::Keep((n == 0, count));
    }
    let count = count + n;
    Step::Store((true, count), (period << COUNT_BITS) | u64::from(count))
}
