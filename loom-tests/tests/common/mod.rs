//! What the loom models share: the quota, and the two lock-free limiters with their broken twins.
#![allow(dead_code)]

use atomic_limiter::{Decision, Gcra, ManualClock, Quota, RateLimiter, TokenBucket, loom_api};
use std::time::Duration;

/// 10 per second: one token every 100 ms.
pub const PERIOD: Duration = Duration::from_millis(100);

pub fn quota(burst: u32) -> Quota {
    Quota::per_second(10).with_burst(burst)
}

/// The two lock-free limiters, each with its real and its broken check.
pub trait Subject: RateLimiter + Send + Sync + 'static {
    fn make(quota: Quota, clock: ManualClock) -> Self;
    fn broken_check_n(&self, n: u32) -> Decision;
    fn state(&self) -> u64;
}

impl Subject for Gcra<ManualClock> {
    fn make(quota: Quota, clock: ManualClock) -> Self {
        Gcra::with_clock(quota, clock)
    }
    fn broken_check_n(&self, n: u32) -> Decision {
        loom_api::broken_check_n(self, n)
    }
    fn state(&self) -> u64 {
        loom_api::state(self)
    }
}

impl Subject for TokenBucket<ManualClock> {
    fn make(quota: Quota, clock: ManualClock) -> Self {
        TokenBucket::with_clock(quota, clock)
    }
    fn broken_check_n(&self, n: u32) -> Decision {
        loom_api::broken_check_n(self, n)
    }
    fn state(&self) -> u64 {
        loom_api::state(self)
    }
}

pub type Check<L> = fn(&L, u32) -> Decision;

pub fn real<L: Subject>(l: &L, n: u32) -> Decision {
    l.check_n(n).unwrap()
}

pub fn broken<L: Subject>(l: &L, n: u32) -> Decision {
    l.broken_check_n(n)
}
