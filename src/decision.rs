use core::time::Duration;

use crate::token_bucket::math::BucketFigures;

/// The answer to one check: allowed or not, and everything a `429` response needs.
///
/// A decision is a small value computed from the one clock reading and the one state word the
/// check used. The figures are derived lazily: [`Decision::is_allowed`] is a field read, while
/// [`remaining`](Decision::remaining), [`retry_after`](Decision::retry_after) and
/// [`reset_after`](Decision::reset_after) each do the one division they need only when called.
///
/// # Examples
///
/// Filling the headers of a denied HTTP request:
///
/// ```
/// use atomic_limiter::{Gcra, ManualClock, Quota, RateLimiter};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let limiter = Gcra::with_clock(Quota::per_second(2), clock.clone());
/// assert!(limiter.check().is_allowed());
/// assert!(limiter.check().is_allowed());
/// let d = limiter.check();
/// assert!(!d.is_allowed());
/// assert_eq!(d.remaining(), 0);
/// assert_eq!(d.retry_after(), Duration::from_millis(500)); // Retry-After
/// assert_eq!(d.reset_after(), Duration::from_secs(1));     // RateLimit-Reset
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
#[must_use = "a decision says whether the request may go ahead and what to tell its caller"]
pub struct Decision {
    allowed: bool,
    /// Clock resolution in ns; waits are rounded up to it.
    resolution: u64,
    detail: Detail,
}

/// The raw figures each algorithm leaves behind; turned into durations on demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Detail {
    /// GCRA-style figures, in units of `1 / scale` ns.
    Time {
        /// Time until the limiter is full again, after this decision.
        after: u64,
        /// Time until this request would pass (0 when allowed).
        wait: u64,
        /// Time one token takes to return.
        token: u64,
        /// Time a drained limiter takes to fill (`burst × token`).
        window: u64,
        /// Units per nanosecond.
        scale: u64,
    },
    /// The packed token bucket's figures.
    Bucket(BucketFigures),
    /// Figures already computed, in whole tokens and nanoseconds (mutex baselines).
    Eager {
        remaining: u64,
        retry_ns: u64,
        reset_ns: u64,
        /// The most tokens the limiter holds (its burst, or a window's limit).
        limit: u64,
    },
    /// A keyed limiter's table is full: a new key is refused until a held key's bucket is full
    /// again, `retry_ns` from now.
    #[cfg_attr(not(feature = "std"), allow(dead_code))]
    TableFull { retry_ns: u64, limit: u64 },
}

impl Decision {
    #[inline]
    pub(crate) const fn new(allowed: bool, resolution: u64, detail: Detail) -> Decision {
        Decision {
            allowed,
            resolution,
            detail,
        }
    }

    /// Whether the request may proceed (its tokens were taken).
    #[inline]
    pub const fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// Whether the request was refused (nothing was taken).
    #[inline]
    pub const fn is_denied(&self) -> bool {
        !self.allowed
    }

    /// Whether a [`Keyed`](crate::Keyed) limiter refused a new key because its table holds
    /// `max_keys` keys and none of their buckets is full yet: not the key's rate, but the
    /// service's capacity (answer `503`, not `429`, and count it apart). `retry_after` is when the
    /// first held key can make room.
    #[inline]
    pub const fn is_table_full(&self) -> bool {
        matches!(self.detail, Detail::TableFull { .. })
    }

    /// Whole tokens left after this decision.
    pub fn remaining(&self) -> u64 {
        match self.detail {
            Detail::Time {
                after,
                token,
                window,
                ..
            } => window.saturating_sub(after) / token,
            Detail::Bucket(b) => b.remaining(),
            Detail::Eager { remaining, .. } => remaining,
            Detail::TableFull { .. } => 0,
        }
    }

    /// `Duration::ZERO` when allowed; otherwise the shortest wait after which the same request
    /// passes if nobody else takes tokens in between, rounded up to the clock's resolution. Waiting
    /// exactly this long never earns a second denial.
    pub fn retry_after(&self) -> Duration {
        if self.allowed {
            return Duration::ZERO;
        }
        let ns = match self.detail {
            Detail::Time { wait, scale, .. } => units_to_ns(wait, scale),
            Detail::Bucket(b) => b.wait_ns(),
            Detail::Eager { retry_ns, .. } | Detail::TableFull { retry_ns, .. } => retry_ns,
        };
        Duration::from_nanos(round_up(ns, self.resolution))
    }

    /// The most tokens the limiter holds: its burst, or a window limiter's limit per window
    /// (for a `RateLimit-Limit`-style header).
    pub fn limit(&self) -> u64 {
        match self.detail {
            Detail::Time { window, token, .. } => window / token,
            Detail::Bucket(b) => b.limit(),
            Detail::Eager { limit, .. } | Detail::TableFull { limit, .. } => limit,
        }
    }

    /// [`Decision::retry_after`] in whole seconds, rounded **up**, for an HTTP `Retry-After`
    /// header (which takes integer seconds): 0 when allowed, at least 1 when refused, so that a
    /// client waiting it is never early. (`retry_after().as_secs()` would round 400 ms down to 0.)
    ///
    /// ```
    /// use atomic_limiter::{Gcra, ManualClock, Quota};
    ///
    /// let limiter = Gcra::with_clock(Quota::per_second(2).with_burst(1), ManualClock::new());
    /// assert_eq!(limiter.check().retry_after_secs(), 0);
    /// let denied = limiter.check();
    /// assert_eq!(denied.retry_after().as_millis(), 500);
    /// assert_eq!(denied.retry_after_secs(), 1);
    /// ```
    pub fn retry_after_secs(&self) -> u64 {
        let wait = self.retry_after();
        if self.allowed {
            0
        } else {
            (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
        }
    }

    /// The time until the limiter is full again (every token back), rounded up to the clock's
    /// resolution.
    pub fn reset_after(&self) -> Duration {
        let ns = match self.detail {
            Detail::Time { after, scale, .. } => units_to_ns(after, scale),
            Detail::Bucket(b) => b.reset_ns(),
            Detail::Eager { reset_ns, .. } => reset_ns,
            Detail::TableFull { retry_ns, .. } => retry_ns,
        };
        Duration::from_nanos(round_up(ns, self.resolution))
    }
}

/// In user terms: the figures, not the units they are kept in.
impl core::fmt::Debug for Decision {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let mut s = f.debug_struct("Decision");
        s.field("allowed", &self.allowed);
        if self.is_table_full() {
            s.field("table_full", &true);
        }
        s.field("remaining", &self.remaining())
            .field("limit", &self.limit())
            .field("retry_after", &self.retry_after())
            .field("reset_after", &self.reset_after())
            .finish()
    }
}

/// One line for a log: `allowed: 9 of 10 left, full in 100ms`, or
/// `denied: 0 of 10 left, retry after 100ms, full in 1s`, or `denied: table full, retry after 3s`.
impl core::fmt::Display for Decision {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.is_table_full() {
            return write!(
                f,
                "denied: table full, retry after {:?}",
                self.retry_after()
            );
        }
        let verdict = if self.allowed { "allowed" } else { "denied" };
        write!(
            f,
            "{verdict}: {} of {} left",
            self.remaining(),
            self.limit()
        )?;
        if !self.allowed {
            write!(f, ", retry after {:?}", self.retry_after())?;
        }
        write!(f, ", full in {:?}", self.reset_after())
    }
}

/// GCRA units to whole nanoseconds, rounded up; no division for whole-nanosecond periods.
#[inline]
fn units_to_ns(units: u64, scale: u64) -> u64 {
    if scale == 1 {
        units
    } else {
        units.div_ceil(scale)
    }
}

/// Rounds a wait up so that a clock of this resolution has surely moved that far: to the next
/// multiple of the resolution, plus one step because a coarse reading trails real time by up to
/// one step. Exact (unchanged) for nanosecond clocks.
fn round_up(ns: u64, resolution: u64) -> u64 {
    if ns == 0 || resolution <= 1 {
        ns
    } else {
        ns.div_ceil(resolution)
            .saturating_mul(resolution)
            .saturating_add(resolution)
    }
}
