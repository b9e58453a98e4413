use crate::window_math::{WindowParams, sliding, window_limiter};

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
