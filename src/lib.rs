//! Lock-free rate limiters for hot paths: a check is one clock read and one compare-and-swap on
//! one `AtomicU64`, with no lock, no allocation and no syscall, and every decision answers what a
//! `429` response needs.
//!
//! # Contents
//!
//! | item | what it is |
//! |---|---|
//! | [`Quota`] | rate, interval and burst, validated once ([`QuotaError`]) |
//! | [`Limiter`] | the one lock-free shell: a state word, an [`algorithm`], the quota and a clock |
//! | [`Gcra`] | exact GCRA in one `AtomicU64` (theoretical arrival time) |
//! | [`TokenBucket`] | fixed-point tokens and a tick stamp packed in one `AtomicU64` |
//! | [`RateLimiter`] | the trait every limiter implements |
//! | [`FixedWindow`] | a counter and its window's index in one `AtomicU64` |
//! | [`SlidingWindowCounter`] | two weighted window counts and the index in one `AtomicU64` |
//! | [`SlidingWindowLog`] | exact: a ring of admission times behind a mutex (and why) |
//! | [`CalendarWindow`], [`Calendar`] | a fixed window on UTC's boundaries: minutes to months and years (a plan of 10 000 a month) |
//! | [`Throttle`] | the leaky bucket as a queue: reserve the next slot, learn the wait |
//! | [`Sharded`] | one quota split over per-core, cache-padded shards, with stealing and gathering |
//! | [`Keyed`] | one limiter per key, with bounded memory (a full table is told apart), on a map whose lookups take no lock (or dashmap) |
//! | [`Reconfigurable`], [`ReconfigurableSharded`], [`ReconfigurableLog`], [`ReconfigurableThrottle`], [`Carry`] | a limiter (a sharded one, the exact log, a throttle) whose quota changes at run time, its state carried over |
//! | [`Shadow`] | any limiter in shadow mode: decides and counts, lets everything through ([`Decision::shadow`]) |
//! | [`Decision`] | allowed? remaining, limit, retry-after (also in whole seconds), reset-after |
//! | [`Wait`], [`WaitError`] | waiting instead of rejecting: [`RateLimiter::wait_n`], [`RateLimiter::until_n_ready_with`] |
//! | [`Clock`] | [`QuantaClock`] (default), [`CoarseClock`], [`StdClock`], [`ManualClock`], [`UtcClock`] (wall time, for calendar windows) |
//! | `baseline` (feature) | the textbook mutex limiters, for benchmarks and differential tests |
//! | `redis` (feature) | one quota across nodes, in Redis: `RedisGcra`, `Leased` |
//! | `http` (feature `tower`) | a tower layer: `429` with `Retry-After` and the `RateLimit` fields |
//! | `LimiterMetrics`, `Instrumented` (feature `metrics`) | counters of every decision, on the `metrics` facade |
//!
//! Long-form documents live in the repository's `docs/` folder and in [`docs`]: [`docs::design`]
//! (the maths, the packed layouts, the range analysis and the memory-ordering argument),
//! [`docs::testing`] and [`docs::benchmarks`]. [`prelude`] brings the traits in one import.
//!
//! # Examples
//!
//! A limiter of 100 requests per second with bursts of 10, on a clock the example moves by hand:
//!
//! ```
//! use atomic_limiter::{Gcra, ManualClock, Quota, RateLimiter};
//! use std::time::Duration;
//!
//! let clock = ManualClock::new();
//! let limiter = Gcra::with_clock(Quota::per_second(100).with_burst(10), clock.clone());
//!
//! let admitted = (0..20).filter(|_| limiter.check().is_allowed()).count();
//! assert_eq!(admitted, 10);
//!
//! let denied = limiter.check();
//! assert_eq!(denied.retry_after(), Duration::from_millis(10));
//! clock.advance(Duration::from_millis(10));
//! assert!(limiter.check().is_allowed());
//! ```
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `std` | yes | [`StdClock`], [`SlidingWindowLog`], [`Sharded`], [`Keyed`], [`Reconfigurable`], [`ReconfigurableSharded`], [`ReconfigurableLog`], [`ReconfigurableThrottle`] |
//! | `baseline` | no | the `baseline` module: the textbook mutex limiters, for comparisons |
//! | `quanta` | yes | [`QuantaClock`] (the default clock) and [`CoarseClock`] |
//! | `portable-atomic` | no | 64-bit atomics on targets without them |
//! | `redis` | no | the `redis` module: one quota across nodes, in Redis (Rust 1.88) |
//! | `tower` | no | the `http` module: a tower layer answering `429` with the `RateLimit` fields |
//! | `axum` | no | with `tower`: the peer address read from axum's `ConnectInfo` |
//! | `metrics` | no | `LimiterMetrics` and `Instrumented`: counters on the `metrics` facade |
//! | `papaya` | no | `keyed::LockFreeStore`, a store for [`Keyed`] whose lookups take no lock, and `keyed::Pinned`, a batch of checks through one entry into its epoch ([`Keyed`] keeps its keys in dashmap unless given another store: `keyed::DefaultStore`) |
//!
//! Without `std` the crate is `no_std` (it needs `alloc` for [`ManualClock`]'s shared time):
//! [`Quota`], [`Gcra`], [`TokenBucket`], [`FixedWindow`], [`SlidingWindowCounter`], [`Throttle`]
//! (with its reservations), [`Decision`], [`Wait`], [`ManualClock`] and the traits. The clocks
//! backed by the OS, [`SlidingWindowLog`] (a mutex), [`Sharded`] and [`Keyed`] need `std`.
#![cfg_attr(not(feature = "std"), no_std)]

extern crate alloc;

#[cfg(feature = "baseline")]
pub mod baseline;
mod clock;
mod decision;
mod gcra;
#[cfg(feature = "tower")]
pub mod http;
#[cfg(feature = "metrics")]
mod instrument;
#[cfg(feature = "std")]
pub mod keyed;
mod limiter;
#[cfg(atomic_limiter_loom)]
#[doc(hidden)]
pub mod loom_api;
mod quota;
mod rate_limiter;
#[cfg(feature = "std")]
mod reclaim;
#[cfg(feature = "std")]
mod reconfigure;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "rls")]
pub mod rls;
mod shadow;
#[cfg(feature = "std")]
mod sharded;
mod state_cell;
mod sync;
mod token_bucket;
mod wait;
mod window;

pub use clock::{Clock, ManualClock};
#[cfg(feature = "quanta")]
pub use clock::{CoarseClock, DefaultClock, QuantaClock};
#[cfg(feature = "std")]
pub use clock::{StdClock, UtcClock};
pub use decision::{DecidedBy, Decision};
pub use gcra::Gcra;
pub use gcra::reservation::{Reservation, ReservationGuard};
pub use gcra::throttle::{Throttle, ThrottleError};
#[cfg(feature = "metrics")]
pub use instrument::{Instrumented, LimiterMetrics};
#[cfg(feature = "std")]
pub use keyed::KeyCharge;
#[cfg(feature = "std")]
pub use keyed::quotas::KeyQuotas;
#[cfg(feature = "std")]
pub use keyed::table::Keyed;
pub use limiter::Limiter;
pub use limiter::algorithm::Carry;
pub use limiter::charge::Charge;
#[cfg(feature = "std")]
pub use limiter::shared::KeyedLimiter;
pub use quota::{InsufficientCapacity, Quota, QuotaError};
pub use rate_limiter::RateLimiter;
#[cfg(feature = "std")]
pub use reconfigure::{
    Reconfigurable, ReconfigurableLog, ReconfigurableSharded, ReconfigurableThrottle,
};
pub use shadow::Shadow;
#[cfg(feature = "std")]
pub use sharded::Sharded;
pub use token_bucket::TokenBucket;
pub use wait::{Wait, WaitError};
pub use window::calendar::CalendarWindow;
pub use window::civil::Calendar;
#[cfg(feature = "std")]
pub use window::log::SlidingWindowLog;
pub use window::{FixedWindow, SlidingWindowCounter};

/// Internals the fuzz targets check directly (built only under cargo-fuzz's `--cfg fuzzing`).
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzz_api {
    use crate::Quota;
    use crate::token_bucket::layout::BucketParams;

    /// The token bucket's word layout for `quota`: (token bits, stamp bits, cap in units).
    pub fn bucket_layout(quota: &Quota) -> (u32, u32, u64) {
        let p = BucketParams::new(quota);
        (p.token_bits, 64 - p.token_bits, p.cap)
    }

    /// Packs (stamp, tokens) the way the token bucket does.
    pub fn bucket_pack(quota: &Quota, stamp: u64, tokens: u64) -> u64 {
        BucketParams::new(quota).pack(stamp, tokens)
    }

    /// Unpacks a token bucket word into (stamp, tokens).
    pub fn bucket_unpack(quota: &Quota, word: u64) -> (u64, u64) {
        BucketParams::new(quota).unpack(word)
    }
}

/// The algorithms a [`Limiter`] runs, for code generic over them: each public alias
/// ([`Gcra`], [`TokenBucket`], [`FixedWindow`], [`SlidingWindowCounter`]) is a [`Limiter`] on one
/// of these. The traits are sealed.
pub mod algorithm {
    pub use crate::gcra::GcraAlgorithm;
    pub use crate::limiter::algorithm::{Algorithm, Continuous, Retunable};
    pub use crate::token_bucket::TokenBucketAlgorithm;
    pub use crate::window::{Fixed, Sliding, WindowAlgorithm, WindowKind};
}

/// The traits a limiter's methods come from, to import in one line: `use atomic_limiter::prelude::*;`
/// (so that `limiter.wait_n(..)` or `limiter.until_ready_with(..)` finds its trait).
pub mod prelude {
    pub use crate::clock::Clock;
    pub use crate::rate_limiter::RateLimiter;
}

/// The long-form documents of the repository's `docs/` folder, built by rustdoc like the rest of
/// the crate, so that their links and examples are checked.
pub mod docs {
    #[doc = include_str!("../docs/design.md")]
    pub mod design {}
    #[doc = include_str!("../docs/testing.md")]
    pub mod testing {}
    #[doc = include_str!("../docs/benchmarks.md")]
    pub mod benchmarks {}
}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
