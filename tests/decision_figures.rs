//! What a decision tells a caller, in the terms a `429` response or a log line uses: the limit
//! for every limiter, a whole-seconds retry-after that is never early, and readable formatting.

use atomic_limiter::baseline::{MutexGcra, MutexTokenBucket};
use atomic_limiter::{
    FixedWindow, Gcra, Keyed, ManualClock, Quota, RateLimiter, Sharded, SlidingWindowCounter,
    SlidingWindowLog, Throttle, TokenBucket,
};
use std::time::Duration;

#[test]
fn every_limiter_reports_its_limit_allowed_or_denied() {
    let clock = ManualClock::new();
    let q = Quota::per_second(100).with_burst(10);
    let w = Quota::per_second(7);
    let limiters: Vec<(&str, Box<dyn RateLimiter>, u64)> = vec![
        ("gcra", Box::new(Gcra::with_clock(q, clock.clone())), 10),
        (
            "bucket",
            Box::new(TokenBucket::with_clock(q, clock.clone())),
            10,
        ),
        (
            "throttle",
            Box::new(Throttle::with_clock(q, clock.clone())),
            10,
        ),
        (
            "sharded",
            Box::new(Sharded::gcra_with_clock(q, 4, clock.clone())),
            10,
        ),
        (
            "mutex gcra",
            Box::new(MutexGcra::<ManualClock>::with_clock(q, clock.clone())),
            10,
        ),
        (
            "mutex bucket",
            Box::new(MutexTokenBucket::<ManualClock>::with_clock(
                q,
                clock.clone(),
            )),
            10,
        ),
        (
            "fixed window",
            Box::new(FixedWindow::with_clock(w, clock.clone()).unwrap()),
            7,
        ),
        (
            "sliding counter",
            Box::new(SlidingWindowCounter::with_clock(w, clock.clone()).unwrap()),
            7,
        ),
        (
            "sliding log",
            Box::new(SlidingWindowLog::with_clock(w, clock.clone()).unwrap()),
            7,
        ),
    ];
    for (name, l, limit) in &limiters {
        let first = l.check();
        assert!(first.is_allowed(), "{name}");
        if *name == "sharded" {
            // An admission answers with its shard's figures: that shard's limit and remaining.
            assert!(
                first.limit() < *limit && first.remaining() < first.limit(),
                "{name}"
            );
        } else {
            assert_eq!(first.limit(), *limit, "{name} allowed");
        }
        let denied = loop {
            let d = l.check();
            if d.is_denied() {
                break d;
            }
        };
        assert_eq!(denied.limit(), *limit, "{name} denied");
        assert_eq!(denied.remaining(), 0, "{name}");
    }
    let keyed = Keyed::gcra_with_clock(q, 1, clock.clone());
    assert_eq!(keyed.check_key(&1).limit(), 10);
    assert_eq!(
        keyed.check_key_n(&2, 0).unwrap().limit(),
        10,
        "a peek at a new key"
    );
    let full = keyed.check_key(&2);
    assert!(full.is_table_full());
    assert_eq!(full.limit(), 10);
}

#[test]
fn retry_after_secs_rounds_up_and_is_never_zero_for_a_denial() {
    for (rate_per_minute, wait_ms, secs) in [(150u64, 400u64, 1u64), (50, 1200, 2), (30, 2000, 2)] {
        let clock = ManualClock::new();
        let g = Gcra::with_clock(
            Quota::per_minute(rate_per_minute).with_burst(1),
            clock.clone(),
        );
        let allowed = g.check();
        assert_eq!(allowed.retry_after_secs(), 0);
        let denied = g.check();
        assert_eq!(denied.retry_after(), Duration::from_millis(wait_ms));
        assert_eq!(denied.retry_after_secs(), secs, "{wait_ms} ms");
        // Waiting the whole seconds is never early.
        clock.advance(Duration::from_secs(secs));
        assert!(g.check().is_allowed());
    }
}

#[test]
fn decisions_and_quotas_read_in_user_terms() {
    let clock = ManualClock::new();
    let q = Quota::per_second(10).with_burst(2);
    let g = Gcra::with_clock(q, clock.clone());
    let allowed = g.check();
    assert_eq!(allowed.to_string(), "allowed: 1 of 2 left, full in 100ms");
    let _ = g.check();
    let denied = g.check();
    assert_eq!(
        denied.to_string(),
        "denied: 0 of 2 left, retry after 100ms, full in 200ms"
    );
    assert_eq!(
        format!("{denied:?}"),
        "Decision { allowed: false, remaining: 0, limit: 2, retry_after: 100ms, reset_after: 200ms }"
    );
    let keyed = Keyed::gcra_with_clock(Quota::per_second(1), 1, clock.clone());
    let _ = keyed.check_key(&1);
    assert_eq!(
        keyed.check_key(&2).to_string(),
        "denied: table full, retry after 1s"
    );
    assert_eq!(q.to_string(), "10/s, burst 2");
    assert_eq!(Quota::per_hour(3).to_string(), "3/h, burst 3");
    assert_eq!(
        format!("{:?}", Quota::per_second(3)),
        "Quota { rate: 3, per: 1s, burst: 3, period: 333.333333ms, exact: true }"
    );
}

/// `next_token_after` is the moment one more token is held: waiting it out, a peek finds one more
/// than the decision left; a nanosecond less (on a nanosecond clock), not yet. Never later than
/// `reset_after`, and for a refused single token, its retry-after.
#[test]
fn next_token_after_is_when_one_more_token_is_back() {
    let quotas = [
        Quota::per_second(3),
        Quota::per_second(100).with_burst(10),
        Quota::with_period(Duration::from_nanos(1_234_567)).with_burst(5),
        Quota::per_minute(7).with_burst(2),
    ];
    let make = |name: &str, q: Quota, clock: &ManualClock| -> Box<dyn RateLimiter> {
        match name {
            "gcra" => Box::new(Gcra::with_clock(q, clock.clone())),
            "bucket" => Box::new(TokenBucket::with_clock(q, clock.clone())),
            _ => Box::new(MutexGcra::<ManualClock>::with_clock(q, clock.clone())),
        }
    };
    for q in quotas {
        // Spend k tokens at varied spacings, then look at the last decision.
        for k in 1..=q.burst() + 1 {
            for step_ns in [0u64, 1, 333_333, 7_000_001] {
                for name in ["gcra", "bucket", "mutex gcra"] {
                    let clock = ManualClock::new();
                    let limiter = make(name, q, &clock);
                    let mut d = limiter.check();
                    for _ in 1..k {
                        clock.advance(Duration::from_nanos(step_ns));
                        d = limiter.check();
                    }
                    let next = d.next_token_after();
                    let left = d.remaining();
                    let at = format!("{name} {q:?} k {k} step {step_ns}");
                    assert!(next <= d.reset_after(), "{at}: {next:?} past the reset");
                    if left >= u64::from(q.burst()) {
                        assert_eq!(next, Duration::ZERO, "{at}: full");
                        continue;
                    }
                    if d.is_denied() {
                        assert_eq!(next, d.retry_after(), "{at}: a refused token");
                    }
                    if next > Duration::from_nanos(1) {
                        clock.advance(next - Duration::from_nanos(1));
                        let early = limiter.check_n(0).unwrap().remaining();
                        assert_eq!(early, left, "{at}: one more a nanosecond early");
                        clock.advance(Duration::from_nanos(1));
                    } else {
                        clock.advance(next);
                    }
                    let peek = limiter.check_n(0).unwrap().remaining();
                    assert!(peek > left, "{at}: still {peek} after {next:?}");
                }
            }
        }
    }
}
