//! Every constructor with arbitrary numbers: the fallible ones never panic, the panicking ones
//! agree with them wherever they accept, every rate up to 10^9 per interval constructs, the period
//! kept is `per / rate` or that rounded up by less than 1/128 ns, and every accepted quota behaves:
//! the first check passes, a denial reports a finite retry-after, and waiting it passes.
#![no_main]

use arbitrary::Arbitrary;
use atomic_limiter::baseline::{MutexGcra, MutexTokenBucket};
use atomic_limiter::{Gcra, TokenBucket};
use atomic_limiter::{ManualClock, Quota, RateLimiter};
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

#[derive(Arbitrary, Debug)]
struct Input {
    rate: u64,
    per_ns: u64,
    per_secs: u64,
    per_subsec: u32,
    burst: u32,
    start: u64,
}

fn behaves(quota: Quota, start: u64) {
    let clock = ManualClock::starting_at(start);
    let gcra = Gcra::with_clock(quota, clock.clone());
    let bucket = TokenBucket::with_clock(quota, clock.clone());
    let locked: MutexGcra<_> = MutexGcra::with_clock(quota, clock.clone());
    let textbook: MutexTokenBucket<_> = MutexTokenBucket::with_clock(quota, clock.clone());
    let all: [&dyn RateLimiter; 4] = [&gcra, &bucket, &locked, &textbook];
    for l in all {
        assert!(l.check().is_allowed(), "first check refused for {quota:?}");
        assert!(l.check_n(quota.burst() + 1).is_err());
    }
    // One token is gone, so the whole burst is not there: denied, with a finite wait.
    assert!(locked.check_n(quota.burst()).unwrap().is_denied());
    let exact: [(&dyn RateLimiter, Duration); 2] =
        [(&gcra, gcra.horizon()), (&bucket, bucket.idle_horizon())];
    for (l, horizon) in exact {
        let d = l.check_n(quota.burst()).unwrap();
        assert!(d.is_denied());
        let wait = d.retry_after();
        assert!(
            wait > Duration::ZERO && wait < Duration::from_nanos(u64::MAX),
            "{wait:?}"
        );
        assert!(d.reset_after() >= wait);
        // Waiting exactly that long passes (inside the horizon, before time runs out).
        let t0 = atomic_limiter::Clock::now(&clock);
        if wait < horizon / 4 && t0.checked_add(wait.as_nanos() as u64).is_some() {
            clock.advance(wait);
            assert!(
                l.check_n(quota.burst()).unwrap().is_allowed(),
                "refused after {wait:?}"
            );
            // Back to t0 for the next limiter, which has not seen the advance.
            clock.set(t0);
        }
    }
}

/// The period kept is `per / rate` when exact, else that rounded up by less than 1/128 ns.
fn kept_period_is_honest(q: &Quota) {
    let (t, d) = q.period_fraction();
    assert!(d >= 1 && d <= Quota::MAX_DENOMINATOR, "{q:?}");
    let (rate, per) = (u128::from(q.rate()), q.per().as_nanos());
    // t/d against per/rate, cross-multiplied (per < 2^64, t < 2^64, d <= 128, rate < 2^64).
    let (kept, asked) = (u128::from(t) * rate, per * u128::from(d));
    if q.is_exact() {
        assert_eq!(kept, asked, "{q:?}");
    } else {
        assert_eq!(d * (128 / d), 128, "{q:?}");
        assert!(kept >= asked, "{q:?}: shorter than asked");
        // (t - 1/(128/d)) / d < per / rate: less than 1/128 ns above.
        assert!((u128::from(t) * 128 / u128::from(d) - 1) * rate < per * 128, "{q:?}");
    }
}

fuzz_target!(|i: Input| {
    // Every rate from a configuration constructs.
    let n = i.rate % 1_000_000_000 + 1;
    for q in [Quota::per_second(n), Quota::per_minute(n), Quota::per_hour(n)] {
        assert_eq!(q.rate(), n);
        kept_period_is_honest(&q);
    }
    let per = Duration::new(i.per_secs, i.per_subsec % 1_000_000_000);
    let candidates = [
        Quota::try_new(i.rate, per, i.burst),
        Quota::try_from_nanos(i.rate, i.per_ns, i.burst),
        Quota::try_new(1, Duration::from_nanos(i.per_ns), 1),
    ];
    for q in candidates.into_iter().flatten() {
        kept_period_is_honest(&q);
        behaves(q, i.start);
        let _ = q.try_with_burst(i.burst);
    }
    // The panicking constructors agree with the fallible form wherever it accepts.
    for (per_ns, make) in [
        (1_000_000_000u64, Quota::per_second as fn(u64) -> Quota),
        (60_000_000_000, Quota::per_minute),
        (3_600_000_000_000, Quota::per_hour),
    ] {
        let burst = i.rate.min(u64::from(Quota::MAX_BURST)) as u32;
        if let Ok(q) = Quota::try_from_nanos(i.rate, per_ns, burst) {
            assert_eq!(make(i.rate), q);
            behaves(q, i.start);
        }
    }
    let period = Duration::from_nanos(i.per_ns);
    if let Ok(q) = Quota::try_new(1, period, 1) {
        assert_eq!(Quota::with_period(period), q);
    }
});
