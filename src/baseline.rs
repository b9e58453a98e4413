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
//! Each checking twin is a [`Locked`]: the algorithm's state behind a lock, written once. Each is
//! generic over the lock through [`BaselineLock`], `std::sync::Mutex` by default, so a benchmark
//! can put `parking_lot`'s mutex in its place.

mod lock;
mod locked;
mod mutex_throttle;
mod textbook_bucket;

use std::sync::Mutex;

use crate::clock::DefaultClockOrNone;
use crate::gcra::GcraAlgorithm;
use crate::window::{Fixed, Sliding, WindowAlgorithm};

pub use self::lock::BaselineLock;
pub use self::locked::{Locked, Textbook, TotalTextbook};
pub use self::mutex_throttle::MutexThrottle;
pub use self::textbook_bucket::{TextbookBucket, TextbookBucketAlgorithm};

/// [`Gcra`](crate::Gcra)'s exact maths behind a lock: the same decisions, with a mutex where the
/// CAS was. For benchmarks and differential tests.
///
/// # Examples
///
/// It agrees with the lock-free limiter:
///
/// ```
/// use atomic_limiter::baseline::MutexGcra;
/// use atomic_limiter::{Gcra, ManualClock, Quota, RateLimiter};
///
/// let clock = ManualClock::new();
/// let locked: MutexGcra<_> = MutexGcra::with_clock(Quota::per_second(5), clock.clone());
/// let free = Gcra::with_clock(Quota::per_second(5), clock.clone());
/// for _ in 0..7 {
///     assert_eq!(locked.check(), free.check());
/// }
/// ```
pub type MutexGcra<C = DefaultClockOrNone, L = Mutex<u64>> = Locked<GcraAlgorithm, C, L>;

/// The token bucket as the textbooks write it: a mutex around `f64` tokens and the time of the
/// last refill, refilled lazily under the lock on every check.
///
/// This is the baseline the benchmarks measure the lock-free limiters against, and it keeps the
/// textbook's properties on purpose, floating-point rounding included: it is *not* exact (an `f64`
/// refill of `elapsed × rate` rounds), so the differential tests compare it to the exact model only
/// approximately.
///
/// # Examples
///
/// ```
/// use atomic_limiter::baseline::MutexTokenBucket;
/// use atomic_limiter::{ManualClock, Quota, RateLimiter};
///
/// let clock = ManualClock::new();
/// let bucket: MutexTokenBucket<_> = MutexTokenBucket::with_clock(Quota::per_second(2), clock);
/// assert!(bucket.check().is_allowed());
/// assert!(bucket.check().is_allowed());
/// assert!(bucket.check().is_denied());
/// ```
pub type MutexTokenBucket<C = DefaultClockOrNone, L = Mutex<TextbookBucket>> =
    Locked<TextbookBucketAlgorithm, C, L>;

/// [`FixedWindow`](crate::FixedWindow)'s maths behind a lock, for benchmarks and differential
/// tests.
pub type MutexFixedWindow<C = DefaultClockOrNone, L = Mutex<u64>> =
    Locked<WindowAlgorithm<Fixed>, C, L>;

/// [`SlidingWindowCounter`](crate::SlidingWindowCounter)'s maths behind a lock, for benchmarks
/// and differential tests.
pub type MutexSlidingWindowCounter<C = DefaultClockOrNone, L = Mutex<u64>> =
    Locked<WindowAlgorithm<Sliding>, C, L>;
