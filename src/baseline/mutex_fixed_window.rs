use crate::baseline::mutex_window::mutex_window;

mutex_window!(
    /// [`FixedWindow`](crate::FixedWindow)'s maths behind a lock, for benchmarks and differential
    /// tests.
    MutexFixedWindow,
    crate::window::math::fixed,
    (1 << 31) - 1
);
