use crate::clock::DefaultClockOrNone;
use std::sync::Mutex;

use crate::baseline::BaselineLock;
use crate::clock::Clock;
#[cfg(feature = "quanta")]
use crate::clock::DefaultClock;
use crate::decision::Decision;
use crate::decision::Detail;
use crate::quota::Quota;
use crate::rate_limiter::{InsufficientCapacity, RateLimiter};

/// The textbook token bucket's state: `f64` tokens and the time of the last refill.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TextbookBucket {
    /// Tokens held at `last_refill`.
    pub tokens: f64,
    /// Clock reading (ns) of the last refill.
    pub last_refill: u64,
}

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
#[derive(Debug)]
pub struct MutexTokenBucket<C = DefaultClockOrNone, L = Mutex<TextbookBucket>> {
    state: L,
    capacity: f64,
    /// Tokens per nanosecond.
    rate: f64,
    quota: Quota,
    clock: C,
}

#[cfg(feature = "quanta")]
impl<L: BaselineLock<TextbookBucket>> MutexTokenBucket<DefaultClock, L> {
    /// A full bucket on the default clock.
    pub fn new(quota: Quota) -> MutexTokenBucket<DefaultClock, L> {
        MutexTokenBucket::with_clock(quota, DefaultClock::new())
    }
}

impl<C: Clock, L: BaselineLock<TextbookBucket>> MutexTokenBucket<C, L> {
    /// A full bucket on `clock`.
    pub fn with_clock(quota: Quota, clock: C) -> MutexTokenBucket<C, L> {
        let capacity = f64::from(quota.burst());
        MutexTokenBucket {
            state: L::new(TextbookBucket {
                tokens: capacity,
                last_refill: clock.now(),
            }),
            capacity,
            rate: quota.rate() as f64 / quota.per().as_nanos() as f64,
            quota,
            clock,
        }
    }

    fn run(&self, n: u32) -> Decision {
        let now = self.clock.now();
        let want = f64::from(n);
        let (allowed, tokens) = self.state.with(|s| {
            // Lazy refill, only when time moved forward.
            if now > s.last_refill {
                let elapsed = (now - s.last_refill) as f64;
                s.tokens = (s.tokens + elapsed * self.rate).min(self.capacity);
                s.last_refill = now;
            }
            if s.tokens >= want {
                s.tokens -= want;
                (true, s.tokens)
            } else {
                (false, s.tokens)
            }
        });
        let ns_for = |missing: f64| {
            if missing <= 0.0 {
                0
            } else {
                (missing / self.rate).ceil() as u64
            }
        };
        Decision::new(
            allowed,
            self.clock.resolution(),
            Detail::Eager {
                remaining: tokens as u64,
                retry_ns: if allowed { 0 } else { ns_for(want - tokens) },
                reset_ns: ns_for(self.capacity - tokens),
                limit: self.capacity as u64,
            },
        )
    }
}

impl<C: Clock, L: BaselineLock<TextbookBucket>> RateLimiter for MutexTokenBucket<C, L> {
    fn check(&self) -> Decision {
        self.run(1)
    }

    fn check_n(&self, n: u32) -> Result<Decision, InsufficientCapacity> {
        InsufficientCapacity::check(n, self.quota.burst())?;
        Ok(self.run(n))
    }

    fn quota(&self) -> &Quota {
        &self.quota
    }
}
