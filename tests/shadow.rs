//! Shadow mode: the same decisions as the limiter enforcing, every one let through.

use atomic_limiter::{Gcra, ManualClock, Quota, RateLimiter, Reconfigurable, Shadow, TokenBucket};
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

/// Every reconfigurable limiter is a `RateLimiter`: wrapped in shadow mode it lets everything
/// through, says what it would have refused, and a change of quota under the wrapper shows in the
/// next decisions (each counted once: four over a burst of two, then the new burst of three).
#[test]
fn every_reconfigurable_limiter_runs_in_shadow_mode() {
    use atomic_limiter::algorithm::{Fixed, GcraAlgorithm, WindowAlgorithm};
    use atomic_limiter::{Carry, ReconfigurableLog, ReconfigurableSharded, ReconfigurableThrottle};

    fn watched<L: RateLimiter>(shadow: &Shadow<L>, change: impl Fn(&L), name: &str) {
        let first: Vec<_> = (0..4).map(|_| shadow.check()).collect();
        assert!(first.iter().all(|d| d.is_allowed()), "{name}");
        let would = first.iter().filter(|d| d.would_allow()).count();
        assert_eq!(would, 2, "{name}: the burst of the first quota");
        change(shadow.limiter());
        assert_eq!(shadow.quota().burst(), 3, "{name}");
        assert!(
            shadow.check_n(4).unwrap().is_shadowed(),
            "{name}: above the new burst"
        );
    }

    // The rate is the burst, so that the windows' limits are the same figures.
    let (two, three) = (Quota::per_second(2), Quota::per_second(3));
    let clock = ManualClock::new();
    let gcra: Reconfigurable<GcraAlgorithm, _> = Reconfigurable::with_clock(two, clock.clone());
    watched(
        &Shadow::new(gcra),
        |l| l.set_quota(three, Carry::Debt),
        "gcra",
    );
    let window: Reconfigurable<WindowAlgorithm<Fixed>, _> =
        Reconfigurable::try_with_clock(two, clock.clone()).unwrap();
    let change = |l: &Reconfigurable<WindowAlgorithm<Fixed>, _>| {
        l.try_set_quota(three, Carry::Debt).unwrap()
    };
    watched(&Shadow::new(window), change, "fixed window");
    let sharded: ReconfigurableSharded<GcraAlgorithm, _> =
        ReconfigurableSharded::with_clock(two, 1, clock.clone());
    watched(
        &Shadow::new(sharded),
        |l| l.set_quota(three, Carry::Debt),
        "sharded",
    );
    let log = ReconfigurableLog::try_with_clock(two, clock.clone()).unwrap();
    let change = |l: &ReconfigurableLog<_>| l.try_set_quota(three, Carry::Debt).unwrap();
    watched(&Shadow::new(log), change, "log");
    let throttle = ReconfigurableThrottle::with_clock(two, clock);
    watched(
        &Shadow::new(throttle),
        |l| l.set_quota(three, Carry::Debt),
        "throttle",
    );
}

/// The trait's waits serve a reconfigurable limiter: a wait that spans a change of quota is
/// decided on the new quota at its next try.
#[test]
fn a_reconfigurable_limiter_waits_through_the_trait() {
    use atomic_limiter::algorithm::GcraAlgorithm;
    use atomic_limiter::{Carry, Wait};

    let clock = ManualClock::new();
    let limiter: Reconfigurable<GcraAlgorithm, _> =
        Reconfigurable::with_clock(Quota::per_second(1), clock.clone());
    assert!(limiter.check().is_allowed());
    let mut slept = Vec::new();
    let waited = limiter.wait_n_with(1, Wait::up_to(Duration::from_secs(5)), |d| {
        slept.push(d);
        if slept.len() == 1 {
            // Faster while it sleeps: the debt of 1 s becomes 100 ms, 10 ms of it left.
            limiter.set_quota(Quota::per_second(10), Carry::Proportional);
        }
        clock.advance(d.min(Duration::from_millis(90)));
    });
    assert!(waited.unwrap().is_allowed());
    assert_eq!(slept.len(), 2, "{slept:?}");
}
