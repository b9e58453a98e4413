use crate::baseline::mutex_window::mutex_window;

mutex_window!(
    /// [`SlidingWindowCounter`](crate::SlidingWindowCounter)'s maths behind a lock, for benchmarks
    /// and differential tests.
    MutexSlidingWindowCounter,
    crate::window_math::sliding,
    crate::window_math::WindowParams::MAX_SLIDING_LIMIT
);
