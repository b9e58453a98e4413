use crate::baseline::mutex_window::mutex_window;

mutex_window!(
    /// [`SlidingWindowCounter`](crate::SlidingWindowCounter)'s maths behind a lock, for benchmarks
    /// and differential tests.
    MutexSlidingWindowCounter,
    crate::window::math::sliding,
    crate::window::math::WindowParams::MAX_SLIDING_LIMIT
);
