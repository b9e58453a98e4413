//! The textbook limiters behind a mutex: the yardsticks the lock-free ones are measured against.
//!
//! These exist for the benchmarks (what does a lock cost next to one CAS?) and for the
//! differential tests (does the lock-free limiter decide what the locked one decides?). They are
//! correct, but they lock on every check; do not put them on a hot path.
//!
//! | type | what it is |
//! |---|---|
//! | [`MutexTokenBucket`] | the textbook bucket: `f64` tokens, last-refill time, refill under a lock |
//! | [`MutexGcra`] | the same exact GCRA maths as [`Gcra`](crate::Gcra), behind a lock |
//! | [`MutexFixedWindow`], [`MutexSlidingWindowCounter`] | the window limiters' maths behind a lock |
//! | [`MutexThrottle`] | the throttle's slot reservation behind a lock |
//!
//! [`SlidingWindowLog`](crate::SlidingWindowLog) is itself a mutex around a ring (see its docs).
//!
//! Each is generic over the lock through [`BaselineLock`], `std::sync::Mutex` by default, so a
//! benchmark can put `parking_lot`'s mutex in its place.

mod baseline_lock;
mod mutex_fixed_window;
mod mutex_gcra;
mod mutex_sliding_window_counter;
mod mutex_throttle;
mod mutex_token_bucket;
mod mutex_window;

pub use baseline_lock::BaselineLock;
pub use mutex_fixed_window::MutexFixedWindow;
pub use mutex_gcra::MutexGcra;
pub use mutex_sliding_window_counter::MutexSlidingWindowCounter;
pub use mutex_throttle::MutexThrottle;
pub use mutex_token_bucket::{MutexTokenBucket, TextbookBucket};
