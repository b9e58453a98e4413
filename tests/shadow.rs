//! Shadow mode: the same decisions as the limiter enforcing, every one let through.

use atomic_limiter::{Gcra, ManualClock, Quota, RateLimiter, Shadow, TokenBucket};
use proptest::prelude::*;
use std::time::Duration;

#[derive(Debug, Clone)]
enum Op {
    Advance(u64),
    Check(u32),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        1 => (0u64..=300_000_000).prop_map(Op::Advance),
        3 => (0u32..=6).prop_map(Op::Check),
    ];
    proptest::collection::vec(op, 1..100)
}

/// A limiter in shadow and its twin enforcing, on one clock, through the same checks: every
/// shadow decision is allowed, its `would_allow` is the twin's verdict, it is shadowed exactly
/// when the twin refused, and every figure is the twin's.
fn same_as_enforcing<L: RateLimiter>(
    shadow: &Shadow<L>,
    twin: &L,
    clock: &ManualClock,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    for op in ops {
        match op {
            Op::Advance(ns) => clock.advance(Duration::from_nanos(*ns)),
            Op::Check(n) => {
                let s = shadow
                    .check_n(*n)
                    .expect("shadow mode lets everything through");
                prop_assert!(s.is_allowed());
                let Ok(t) = twin.check_n(*n) else {
                    // Above the burst: refused outright, with no wait that helps.
                    prop_assert!(s.is_shadowed() && !s.would_allow());
                    prop_assert_eq!(s.retry_after(), Duration::from_nanos(u64::MAX));
                    continue;
                };
                prop_assert_eq!(s.would_allow(), t.is_allowed());
                prop_assert_eq!(s.is_shadowed(), t.is_denied());
                prop_assert_eq!(s.remaining(), t.remaining());
                prop_assert_eq!(s.retry_after(), t.retry_after());
                prop_assert_eq!(s.retry_after_secs(), t.retry_after_secs());
                prop_assert_eq!(s.reset_after(), t.reset_after());
                prop_assert_eq!(s.limit(), t.limit());
            }
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn gcra_in_shadow_decides_as_it_would_enforcing(ops in ops()) {
        let clock = ManualClock::new();
        let q = Quota::per_second(10).with_burst(4);
        let shadow = Shadow::new(Gcra::with_clock(q, clock.clone()));
        let twin = Gcra::with_clock(q, clock.clone());
        same_as_enforcing(&shadow, &twin, &clock, &ops)?;
    }

    #[test]
    fn token_bucket_in_shadow_decides_as_it_would_enforcing(ops in ops()) {
        let clock = ManualClock::new();
        let q = Quota::per_second(10).with_burst(4);
        let shadow = Shadow::new(TokenBucket::with_clock(q, clock.clone()));
        let twin = TokenBucket::with_clock(q, clock.clone());
        same_as_enforcing(&shadow, &twin, &clock, &ops)?;
    }
}

/// The log line says what happened.
#[test]
fn a_shadowed_refusal_reads_as_one() {
    let limiter = Shadow::new(Gcra::with_clock(Quota::per_second(1), ManualClock::new()));
    assert!(limiter.check().to_string().starts_with("allowed: "));
    let refused = limiter.check();
    assert_eq!(
        refused.to_string(),
        "allowed in shadow, would deny: 0 of 1 left, retry after 1s, full in 1s"
    );
    assert!(format!("{refused:?}").contains("shadowed: true"));
}
