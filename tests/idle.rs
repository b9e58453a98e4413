//! What a limiter holds after long idles: the full burst, within the documented horizons.

mod common;

use atomic_limiter::{Gcra, ManualClock, Quota, RateLimiter, TokenBucket};
use common::bucket_wait_slack;
use std::time::Duration;

const SECOND: u64 = 1_000_000_000;
const IDLES: [(&str, u64); 5] = [
    ("1 s", SECOND),
    ("1 h", 3600 * SECOND),
    ("1 day", 86_400 * SECOND),
    ("1 year", 365 * 86_400 * SECOND),
    ("100 years", 100 * 365 * 86_400 * SECOND),
];

fn drained_then_idle(limiter: &impl RateLimiter, clock: &ManualClock, idle: u64) -> u64 {
    let burst = limiter.quota().burst();
    while limiter.check_n(0).unwrap().remaining() > 0 {
        let _ = limiter.check();
    }
    assert!(limiter.check().is_denied());
    clock.advance_nanos(idle);
    let full = limiter.check_n(burst).unwrap();
    if full.is_allowed() {
        u64::from(burst)
    } else {
        full.remaining()
    }
}

#[test]
fn full_burst_after_every_idle_for_common_quotas() {
    for quota in [
        Quota::per_second(100).with_burst(10),
        Quota::per_second(1),
        Quota::per_minute(600).with_burst(50),
        Quota::per_second(1000).with_burst(1 << 10),
    ] {
        for (label, idle) in IDLES {
            // Full once the fill time has passed; before that, exactly what has refilled.
            let refilled = (u128::from(idle) * u128::from(quota.rate()) / quota.per().as_nanos())
                .min(u128::from(quota.burst())) as u64;
            let clock = ManualClock::new();
            let gcra = Gcra::with_clock(quota, clock.clone());
            assert_eq!(
                drained_then_idle(&gcra, &clock, idle),
                refilled,
                "gcra {quota:?} after {label}"
            );
            let clock = ManualClock::new();
            let bucket = TokenBucket::with_clock(quota, clock.clone());
            if bucket.idle_horizon() <= Duration::from_nanos(idle) {
                // Past the horizon: the documented bound (never more than full), checked below.
                assert!(drained_then_idle(&bucket, &clock, idle) <= u64::from(quota.burst()));
                println!(
                    "{quota:?}: bucket horizon {:?} < {label}",
                    bucket.idle_horizon()
                );
                continue;
            }
            // The bucket trails exact time by its resolution (a few 1/1024ths of a period): at an
            // idle of exactly one fill time it is that much short of full.
            let lag = bucket_wait_slack(&quota, bucket.tick().as_nanos() as u64);
            assert_eq!(
                drained_then_idle(&bucket, &clock, idle + lag),
                refilled,
                "bucket {quota:?} after {label}"
            );
        }
    }
}

/// Past its idle horizon a token bucket reads the idle modulo its stamp cycle: it may hold fewer
/// tokens than a full burst (never more), and is full again within one cycle quarter plus a fill.
#[test]
fn beyond_the_bucket_horizon_is_never_more_than_full() {
    let quota = Quota::per_second(1_000_000_000).with_burst(1000);
    for (label, idle) in IDLES {
        let clock = ManualClock::new();
        let bucket = TokenBucket::with_clock(quota, clock.clone());
        let got = drained_then_idle(&bucket, &clock, idle);
        assert!(got <= 1000, "{label}: {got}");
        if Duration::from_nanos(idle) <= bucket.idle_horizon() {
            assert_eq!(got, 1000, "{label}: inside the horizon");
        } else {
            // Documented bound: after at most a backward tolerance plus one fill time it is full.
            let wait = bucket.backward_tolerance() + quota.fill_time();
            clock.advance(wait);
            assert!(
                bucket.check_n(1000).unwrap().is_allowed(),
                "{label}: not full after {wait:?}"
            );
        }
    }
}

#[test]
fn gcra_horizon_is_at_least_a_year_for_every_quota() {
    let clock = ManualClock::new();
    // The largest denominator with the largest window the quota allows.
    let worst = Quota::try_new(128, Duration::from_nanos(1_000_001), 1)
        .unwrap()
        .with_burst(((1u64 << 62) / 1_000_001) as u32 % Quota::MAX_BURST);
    assert_eq!(worst.period_fraction().1, 128);
    let g = Gcra::with_clock(worst, clock);
    assert!(g.horizon() > Duration::from_secs(365 * 86_400));
}
