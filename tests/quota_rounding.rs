//! Every rate a configuration can hold constructs, and a rounded quota admits never more than the
//! exact one and at most the documented share less.

use atomic_limiter::{Clock, Gcra, ManualClock, Quota, RateLimiter, Sharded, TokenBucket};
use std::time::Duration;

const SECOND: u64 = 1_000_000_000;

#[test]
fn every_rate_per_second_minute_and_hour_constructs() {
    let mut inexact = 0;
    for n in 1..=100_000u64 {
        for (per, q) in [
            (SECOND, Quota::per_second(n)),
            (60 * SECOND, Quota::per_minute(n)),
            (3600 * SECOND, Quota::per_hour(n)),
        ] {
            assert_eq!(q.rate(), n);
            let (t, d) = q.period_fraction();
            assert!(d <= Quota::MAX_DENOMINATOR);
            // Never shorter than asked: t / d >= per / n.
            assert!(u128::from(t) * u128::from(n) >= u128::from(per) * u128::from(d));
            if q.is_exact() {
                assert_eq!(
                    u128::from(t) * u128::from(n),
                    u128::from(per) * u128::from(d)
                );
            } else {
                inexact += 1;
                // Rounded up by less than 1/MAX_DENOMINATOR ns.
                assert!(u128::from(t - 1) * u128::from(n) < u128::from(per) * u128::from(d));
            }
        }
    }
    // 9014 of the rates per second alone were rejected before rounding existed.
    assert!(inexact > 9000, "{inexact}");
    assert!(Quota::per_second(3).is_exact() && Quota::per_second(7_000_000).is_exact());
    assert!(Quota::per_second(1_000_000_000).is_exact());
}

/// A greedy client for `span`: checks, and when refused waits exactly the advertised retry-after.
fn greedy(limiter: &impl RateLimiter, clock: &ManualClock, span: u64) -> u64 {
    let end = clock.now() + span;
    let mut admitted = 0;
    while clock.now() <= end {
        let d = limiter.check();
        if d.is_allowed() {
            admitted += 1;
        } else {
            assert!(d.retry_after() > Duration::ZERO);
            clock.advance(d.retry_after());
        }
    }
    admitted
}

#[test]
fn rounded_quotas_admit_at_most_the_exact_count_and_within_the_documented_bound() {
    for rate in [
        999u64,
        7_919,
        65_537,
        999_983,
        12_345_679,
        999_999_937,
        999_999_999,
    ] {
        let q = Quota::per_second(rate).with_burst(10);
        assert!(!q.is_exact(), "{rate}");
        // About 200 000 admissions each, over whole seconds where the rate allows.
        let span = (200_000 * SECOND / rate).max(1);
        let exact = 10 + u128::from(span) * u128::from(rate) / u128::from(SECOND);
        // The documented worst shortfall: 1 / (128 × period in ns).
        let bound = rate as f64 / (128.0 * SECOND as f64);
        let lowest = exact as f64 * (1.0 - bound);

        let clock = ManualClock::new();
        let got = u128::from(greedy(&Gcra::with_clock(q, clock.clone()), &clock, span));
        assert!(got <= exact, "gcra {rate}/s: {got} > exact {exact}");
        assert!(got as f64 >= lowest, "gcra {rate}/s: {got} < {lowest}");

        let clock = ManualClock::new();
        let bucket = TokenBucket::with_clock(q, clock.clone());
        let got = u128::from(greedy(&bucket, &clock, span));
        assert!(got <= exact, "bucket {rate}/s: {got} > exact {exact}");
        // The bucket also trails by its own resolution (under two units and a tick per fill).
        assert!(
            got as f64 >= lowest - 2.0,
            "bucket {rate}/s: {got} < {lowest}"
        );

        let clock = ManualClock::new();
        let sharded = Sharded::gcra_with_clock(q, 4, clock.clone());
        let got = u128::from(greedy(&sharded, &clock, span));
        assert!(got <= exact, "sharded {rate}/s: {got} > exact {exact}");
    }
}
