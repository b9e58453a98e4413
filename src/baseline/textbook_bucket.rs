use crate::clock::Clock;
use crate::decision::{Decision, Detail};
use crate::quota::Quota;

use super::locked::engine;
use super::locked::{Textbook, TotalTextbook};

/// The textbook token bucket's state: `f64` tokens and the time of the last refill.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TextbookBucket {
    /// Tokens held at `last_refill`.
    pub tokens: f64,
    /// Clock reading (ns) of the last refill.
    pub last_refill: u64,
}

/// The textbook bucket's parameters: its capacity and its rate in tokens per nanosecond, both
/// `f64`. The algorithm [`MutexTokenBucket`](super::MutexTokenBucket) runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TextbookBucketAlgorithm {
    capacity: f64,
    /// Tokens per nanosecond.
    rate: f64,
    burst: u32,
}

impl Textbook for TextbookBucketAlgorithm {}
impl TotalTextbook for TextbookBucketAlgorithm {}

impl engine::TotalTextbook for TextbookBucketAlgorithm {
    fn total(quota: &Quota, now_ns: u64) -> (TextbookBucketAlgorithm, TextbookBucket) {
        let capacity = f64::from(quota.burst());
        let algorithm = TextbookBucketAlgorithm {
            capacity,
            rate: quota.rate() as f64 / quota.per().as_nanos() as f64,
            burst: quota.burst(),
        };
        let full = TextbookBucket {
            tokens: capacity,
            last_refill: now_ns,
        };
        (algorithm, full)
    }
}

impl engine::Textbook for TextbookBucketAlgorithm {
    type State = TextbookBucket;

    fn from_quota(
        quota: &Quota,
        now_ns: u64,
    ) -> Result<(TextbookBucketAlgorithm, TextbookBucket), crate::quota::QuotaError> {
        Ok(<Self as engine::TotalTextbook>::total(quota, now_ns))
    }

    fn capacity(&self) -> u32 {
        self.burst
    }

    /// Whether the request passed, the tokens left and the tokens it wanted.
    type Taken = (bool, f64, f64);

    #[inline]
    fn take(&self, s: &mut TextbookBucket, now: u64, n: u32, _: &impl Clock) -> (bool, f64, f64) {
        let want = f64::from(n);
        // Lazy refill, only when time moved forward.
        if now > s.last_refill {
            let elapsed = (now - s.last_refill) as f64;
            s.tokens = (s.tokens + elapsed * self.rate).min(self.capacity);
            s.last_refill = now;
        }
        let allowed = s.tokens >= want;
        if allowed {
            s.tokens -= want;
        }
        (allowed, s.tokens, want)
    }

    #[inline]
    fn decision(&self, (allowed, tokens, want): (bool, f64, f64), clock: &impl Clock) -> Decision {
        let ns_for = |missing: f64| {
            if missing <= 0.0 {
                0
            } else {
                (missing / self.rate).ceil() as u64
            }
        };
        Decision::new(
            allowed,
            clock.resolution(),
            Detail::Eager {
                remaining: tokens as u32,
                retry_ns: if allowed { 0 } else { ns_for(want - tokens) },
                reset_ns: ns_for(self.capacity - tokens),
                limit: self.burst,
            },
        )
    }
}
