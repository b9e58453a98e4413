//! The window limiters: a fixed window and the sliding window counter, each a count (or two) and
//! the window's index packed in one word ([`math`]), and the exact sliding window log ([`log`]).

pub(crate) mod math;

#[cfg(feature = "std")]
pub(crate) mod log;

use self::math::{WindowParams, fixed, sliding, window_limiter};

window_limiter!(
    /// At most `limit` admissions per fixed window of time: a counter and the window's index in
    /// one `AtomicU64`, reset when a new window starts.
    ///
    /// The cheapest window, and the coarsest: the limit holds per window, not per any span of that
    /// length. A client can take the whole limit at the end of one window and the whole limit again
    /// at the start of the next, **twice the limit within a moment**; use
    /// [`SlidingWindowCounter`](crate::SlidingWindowCounter) to smooth that edge, or
    /// [`Gcra`](crate::Gcra) for a true rate. The window's index is found by a multiply with a
    /// precomputed reciprocal (no division per check); a clock stepping back keeps the current
    /// window and its count.
    ///
    /// # Examples
    ///
    /// Three per second, and a fresh count in the next second:
    ///
    /// ```
    /// use atomic_limiter::{FixedWindow, ManualClock, Quota};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let w = FixedWindow::with_clock(Quota::per_second(3), clock.clone()).unwrap();
    /// assert_eq!((0..5).filter(|_| w.check().is_allowed()).count(), 3);
    /// assert_eq!(w.check().retry_after(), Duration::from_secs(1));
    /// clock.advance(Duration::from_secs(1));
    /// assert!(w.check().is_allowed());
    /// ```
    FixedWindow,
    fixed,
    (1 << 31) - 1,
    1
);

window_limiter!(
    /// The two-window approximation of a sliding window: the previous window's count, weighted by
    /// how much of it still overlaps the last `W`, plus the current window's count, must stay
    /// within the limit. Both counts and the window's index are packed in one `AtomicU64`.
    ///
    /// It smooths the fixed window's edge at the price of an assumption: that the previous window's
    /// admissions were spread evenly. When they all came at its very end, the true count in the
    /// last `W` can exceed the limit: **at most `2 × limit - 1` admissions in any span of length
    /// `W`** (the previous window's `limit`, plus what the falling weight lets in before the span
    /// ends), against exactly `limit` for an exact log. `docs/design.md` has the derivation;
    /// `tests/windows.rs` checks the bound on random and adversarial runs.
    ///
    /// # Examples
    ///
    /// Ten per second; right after a full window, the previous count still weighs in:
    ///
    /// ```
    /// use atomic_limiter::{ManualClock, Quota, SlidingWindowCounter};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let w = SlidingWindowCounter::with_clock(Quota::per_second(10), clock.clone()).unwrap();
    /// assert_eq!((0..20).filter(|_| w.check().is_allowed()).count(), 10);
    /// clock.advance(Duration::from_millis(1500)); // half of the previous window still overlaps
    /// assert_eq!((0..20).filter(|_| w.check().is_allowed()).count(), 5);
    /// ```
    SlidingWindowCounter,
    sliding,
    WindowParams::MAX_SLIDING_LIMIT,
    2
);
