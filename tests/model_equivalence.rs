//! Random sequences of clock advances and checks through every limiter and the exact model.

mod common;

use atomic_limiter::baseline::{MutexGcra, MutexTokenBucket};
use atomic_limiter::{Gcra, ManualClock, Quota, RateLimiter, TokenBucket};
use common::{Model, bucket_may_refuse, bucket_wait_slack};
use proptest::prelude::*;
use std::time::Duration;

fn quota_strategy() -> impl Strategy<Value = Quota> {
    let sampled = proptest::sample::select(common::sample_quotas());
    // A period of p/q ns (q <= 128) written as (q·m) per (p·m) ns.
    let random = (1u64..=1_000_000_000, 1u64..=128, 1u64..=10, 1u32..=64)
        .prop_filter_map("quota rejected", |(p, q, m, burst)| {
            Quota::try_new(q * m, Duration::from_nanos(p * m), burst).ok()
        });
    prop_oneof![sampled, random]
}

#[derive(Debug, Clone)]
enum Op {
    Advance(u64),
    Check(u32),
}

/// Advances scaled to the quota (fractions of a period up to several fills), and checks of any
/// size up to one past the burst.
fn ops(q: Quota) -> impl Strategy<Value = Vec<Op>> {
    let period = (q.per().as_nanos() / q.rate() as u128).max(1) as u64;
    // Runs stay inside GCRA's idle horizon (2^63/scale ns): 120 advances of at most 2^56/scale.
    // ... and inside the token bucket's idle horizon.
    let bucket = TokenBucket::with_clock(q, ManualClock::new());
    let horizon =
        ((1u128 << 55) / q.period_fraction().1 as u128).min(bucket.idle_horizon().as_nanos() / 128);
    let fill = q.fill_time().as_nanos().min(horizon) as u64;
    let period = period.min(horizon as u64 / 2);
    let burst = q.burst();
    let op = prop_oneof![
        2 => (0u64..=3).prop_map(Op::Advance),
        3 => (0..=period.saturating_mul(2)).prop_map(Op::Advance),
        1 => (0..=fill.saturating_mul(2).max(1)).prop_map(Op::Advance),
        6 => prop_oneof![Just(1u32), 0..=burst, Just(burst), Just(burst + 1)].prop_map(Op::Check),
    ];
    proptest::collection::vec(op, 1..120)
}

fn quota_and_ops() -> impl Strategy<Value = (Quota, u64, Vec<Op>)> {
    quota_strategy().prop_flat_map(|q| {
        (
            Just(q),
            prop_oneof![Just(0u64), any::<u64>().prop_map(|t| t >> 2)],
            ops(q),
        )
    })
}

proptest! {
    // 512 cases by default; PROPTEST_CASES=N for a longer campaign.
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(512)
    ))]

    /// GCRA and its mutex twin agree with the exact model on every decision and every figure.
    #[test]
    fn gcra_matches_the_model((quota, start, ops) in quota_and_ops()) {
        let clock = ManualClock::starting_at(start);
        let gcra = Gcra::with_clock(quota, clock.clone());
        let locked: MutexGcra<_> = MutexGcra::with_clock(quota, clock.clone());
        let mut model = Model::new(&quota, start);
        for op in ops {
            match op {
                Op::Advance(ns) => clock.advance_nanos(ns),
                Op::Check(n) => {
                    let now = atomic_limiter::Clock::now(&clock);
                    let a = gcra.check_n(n);
                    let b = locked.check_n(n);
                    if n > quota.burst() {
                        prop_assert!(a.is_err() && b.is_err());
                        continue;
                    }
                    let (a, b) = (a.unwrap(), b.unwrap());
                    let m = model.check(now, n);
                    prop_assert_eq!(a, b);
                    prop_assert_eq!(a.is_allowed(), m.allowed, "decision at {} for {}", now, n);
                    prop_assert_eq!(a.remaining(), m.remaining);
                    prop_assert_eq!(a.retry_after().as_nanos(), m.retry_ns as u128);
                    prop_assert_eq!(a.reset_after().as_nanos(), m.reset_ns as u128);
                }
            }
        }
    }

    /// The packed token bucket never admits what the exact model refuses, refuses only within its
    /// resolution, and its waits are never shorter than exact.
    #[test]
    fn token_bucket_matches_the_model_within_resolution((quota, start, ops) in quota_and_ops()) {
        let clock = ManualClock::starting_at(start);
        let bucket = TokenBucket::with_clock(quota, clock.clone());
        let tick = bucket.tick().as_nanos() as u64;
        let mut model = Model::new(&quota, start);
        let slack = bucket_wait_slack(&quota, tick);
        for op in ops {
            match op {
                Op::Advance(ns) => clock.advance_nanos(ns),
                Op::Check(n) => {
                    let now = atomic_limiter::Clock::now(&clock);
                    let d = bucket.check_n(n);
                    if n > quota.burst() {
                        prop_assert!(d.is_err());
                        continue;
                    }
                    let d = d.unwrap();
                    let (num, den) = model.tokens_at(now);
                    let exact_allows = num >= n as i128 * den;
                    // Never ahead of the exact model: an admission is always an exact admission.
                    prop_assert!(!d.is_allowed() || exact_allows,
                        "bucket admitted {} with only {}/{} tokens", n, num, den);
                    if d.is_denied() && exact_allows {
                        prop_assert!(bucket_may_refuse(num, den, n, &quota, bucket.tick().as_nanos() as u64),
                            "bucket refused {} with {}/{} tokens", n, num, den);
                    }
                    let m = model.apply(now, n, d.is_allowed());
                    let r = d.remaining();
                    prop_assert!(r <= m.remaining && r + 1 >= m.remaining);
                    // Waits: never shorter than exact, and at most the slack longer.
                    let within = |got: u128, exact: u64| {
                        got >= exact as u128 && got <= exact as u128 + slack as u128
                    };
                    if d.is_denied() {
                        prop_assert!(within(d.retry_after().as_nanos(), m.retry_ns),
                            "retry {:?} vs {}", d.retry_after(), m.retry_ns);
                    }
                    prop_assert!(within(d.reset_after().as_nanos(), m.reset_ns),
                        "reset {:?} vs {}", d.reset_after(), m.reset_ns);
                }
            }
        }
    }

    /// The textbook f64 bucket agrees with the model wherever floating point is not at its edge.
    #[test]
    fn textbook_bucket_tracks_the_model((quota, start, ops) in quota_and_ops()) {
        let clock = ManualClock::starting_at(start);
        let bucket: MutexTokenBucket<_> = MutexTokenBucket::with_clock(quota, clock.clone());
        let mut model = Model::new(&quota, start);
        for op in ops {
            match op {
                Op::Advance(ns) => clock.advance_nanos(ns),
                Op::Check(n) if n <= quota.burst() => {
                    let now = atomic_limiter::Clock::now(&clock);
                    let d = bucket.check_n(n).unwrap();
                    let (num, den) = model.tokens_at(now);
                    let exact = num as f64 / den as f64;
                    if (exact - n as f64).abs() > 1e-6 * (1.0 + exact) {
                        prop_assert_eq!(d.is_allowed(), num >= n as i128 * den);
                    }
                    model.apply(now, n, d.is_allowed());
                }
                Op::Check(_) => {}
            }
        }
    }

    /// Waiting exactly the advertised retry-after is always enough, and one nanosecond less is not
    /// (for the limiters with nanosecond-exact figures).
    #[test]
    fn retry_after_is_the_shortest_sufficient_wait((quota, start, ops) in quota_and_ops()) {
        let clock = ManualClock::starting_at(start);
        let gcra = Gcra::with_clock(quota, clock.clone());
        let budget = gcra.horizon().as_nanos() as u64 / 4;
        retry_after_holds(&gcra, &clock, &ops, start.saturating_add(budget))?;
        let clock = ManualClock::starting_at(start);
        let bucket = TokenBucket::with_clock(quota, clock.clone());
        let budget = bucket.idle_horizon().as_nanos() as u64 / 4;
        retry_after_holds(&bucket, &clock, &ops, start.saturating_add(budget))?;
    }
}

fn retry_after_holds(
    limiter: &impl RateLimiter,
    clock: &ManualClock,
    ops: &[Op],
    until: u64,
) -> Result<(), TestCaseError> {
    use atomic_limiter::Clock;
    for op in ops {
        match *op {
            Op::Advance(ns) => clock.advance_nanos(ns),
            Op::Check(n) if n <= limiter.quota().burst() => {
                let d = limiter.check_n(n).unwrap();
                let wait = d.retry_after().as_nanos() as u64;
                // Probe only while the run stays well inside the limiter's horizon.
                if d.is_denied() && clock.now().saturating_add(wait) < until {
                    prop_assert!(wait > 0);
                    // One ns short: still denied (a denial changes nothing) ...
                    clock.advance_nanos(wait - 1);
                    prop_assert!(limiter.check_n(n).unwrap().is_denied(), "passed 1 ns early");
                    // ... and at the advertised instant: allowed.
                    clock.advance_nanos(1);
                    prop_assert!(
                        limiter.check_n(n).unwrap().is_allowed(),
                        "denied again after retry_after"
                    );
                }
            }
            Op::Check(_) => {}
        }
    }
    Ok(())
}
