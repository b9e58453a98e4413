use crate::window_math::{fixed, window_limiter};

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
