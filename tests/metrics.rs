//! The `metrics` feature: every counter moves as it should, read back from `metrics-util`'s
//! debugging recorder. The Redis counters (backend errors, failure-policy decisions, lease
//! refills) are in `tests/redis.rs`, against a real server.

use std::time::Duration;

use atomic_limiter::{
    Gcra, Instrumented, Keyed, LimiterMetrics, ManualClock, Quota, RateLimiter, Shadow,
};
use metrics_util::debugging::DebuggingRecorder;

#[path = "common/counters.rs"]
mod counters;
use counters::{admin_counts, count, counters};

/// Admitted, near the limit, denied (over the quota and above the burst), per limiter name.
#[test]
fn decisions_are_counted_by_outcome_and_name() {
    let recorder = DebuggingRecorder::new();
    metrics::with_local_recorder(&recorder, || {
        let clock = ManualClock::new();
        let q = Quota::per_second(10).with_burst(5);
        // Near below 0.5 of 5 tokens: admissions that leave 2, 1 or 0.
        let api = Instrumented::new(
            Gcra::with_clock(q, clock.clone()),
            LimiterMetrics::new("api").near_limit_below(0.5),
        );
        let other = Instrumented::new(Gcra::with_clock(q, clock), LimiterMetrics::new("other"));
        for _ in 0..7 {
            let _ = api.check();
        }
        assert!(api.check_n(6).is_err());
        let _ = other.check();
    });
    let c = counters(&recorder);
    assert_eq!(count(&c, "allowed_total", "limiter=api"), 5);
    assert_eq!(count(&c, "near_limit_total", "limiter=api"), 3);
    assert_eq!(count(&c, "denied_total", "limiter=api"), 3);
    assert_eq!(count(&c, "allowed_total", "limiter=other"), 1);
    // The default near share, a fifth of 5: only the admission that leaves 0.
    assert_eq!(count(&c, "near_limit_total", "limiter=other"), 0);
    assert_eq!(count(&c, "table_full_total", "limiter=api"), 0);
}

/// A peek (`check_n(0)`) asks for nothing and admits nothing: five peeks and one check count one
/// admission, on an empty limiter too (a peek there is no denial either).
#[test]
fn peeks_are_not_counted() {
    let recorder = DebuggingRecorder::new();
    metrics::with_local_recorder(&recorder, || {
        let clock = ManualClock::new();
        let gcra = Instrumented::new(
            Gcra::with_clock(Quota::per_second(1).with_burst(1), clock),
            LimiterMetrics::new("x"),
        );
        for _ in 0..5 {
            assert!(gcra.check_n(0).unwrap().is_allowed());
        }
        assert!(gcra.check().is_allowed());
        for _ in 0..3 {
            let _ = gcra.check_n(0);
        }
    });
    let c = counters(&recorder);
    assert_eq!(count(&c, "allowed_total", "limiter=x"), 1);
    assert_eq!(count(&c, "denied_total", "limiter=x"), 0);
}

/// The near-limit share from a config file: nonsense counts nothing or everything, never panics.
#[test]
fn a_near_limit_share_out_of_range_is_clamped() {
    for (share, near) in [
        (f64::NAN, 0),
        (-1.0, 0),
        (0.0, 0),
        (f64::INFINITY, 3),
        (7.5, 3),
        (1.0, 3),
    ] {
        let recorder = DebuggingRecorder::new();
        metrics::with_local_recorder(&recorder, || {
            let l = Instrumented::new(
                Gcra::with_clock(Quota::per_second(1).with_burst(3), ManualClock::new()),
                LimiterMetrics::new("x").near_limit_below(share),
            );
            for _ in 0..3 {
                let _ = l.check();
            }
        });
        // Admissions leave 2, 1, 0 of 3: below the whole burst every time.
        assert_eq!(
            count(&counters(&recorder), "near_limit_total", "limiter=x"),
            near,
            "{share}"
        );
    }
}

/// A full table is counted apart from a key over its rate; shadow mode counts what it let
/// through, and its refusals as denials (what the limit would do).
#[test]
fn table_full_and_shadowed_refusals_are_counted() {
    let recorder = DebuggingRecorder::new();
    metrics::with_local_recorder(&recorder, || {
        let clock = ManualClock::new();
        let m = LimiterMetrics::new("keys");
        let keyed = Keyed::gcra_with_clock(Quota::per_second(1), 1, clock.clone());
        m.record(&keyed.check_key(&1)); // admitted
        m.record(&keyed.check_key(&1)); // over the rate
        m.record(&keyed.check_key(&2)); // no room
        clock.advance(Duration::from_secs(1));
        let shadow = Instrumented::new(
            Shadow::new(Gcra::with_clock(Quota::per_second(1), clock)),
            LimiterMetrics::new("shadow"),
        );
        let all_through = (0..3).all(|_| shadow.check().is_allowed());
        assert!(all_through);
    });
    let c = counters(&recorder);
    assert_eq!(count(&c, "allowed_total", "limiter=keys"), 1);
    assert_eq!(count(&c, "denied_total", "limiter=keys"), 1);
    assert_eq!(count(&c, "table_full_total", "limiter=keys"), 1);
    assert_eq!(count(&c, "allowed_total", "limiter=shadow"), 1);
    assert_eq!(count(&c, "denied_total", "limiter=shadow"), 2);
    assert_eq!(count(&c, "shadowed_total", "limiter=shadow"), 2);
}

/// With no recorder installed the counters are no-ops: the limiter decides as ever.
#[test]
fn without_a_recorder_nothing_changes() {
    let l = Instrumented::new(
        Gcra::with_clock(Quota::per_second(1).with_burst(2), ManualClock::new()),
        LimiterMetrics::new("quiet"),
    );
    let admitted = (0..5).filter(|_| l.check().is_allowed()).count();
    assert_eq!(admitted, 2);
}

/// A reconfigurable limiter is a `RateLimiter`, so `Instrumented` counts it: the decisions made
/// before and after a change of quota, under one name.
#[test]
fn a_reconfigurable_limiter_is_counted() {
    use atomic_limiter::algorithm::GcraAlgorithm;
    use atomic_limiter::{Carry, Reconfigurable, ReconfigurableThrottle};

    let recorder = DebuggingRecorder::new();
    metrics::with_local_recorder(&recorder, || {
        let clock = ManualClock::new();
        let tenant: Reconfigurable<GcraAlgorithm, _> =
            Reconfigurable::with_clock(Quota::per_second(2), clock.clone());
        let tenant = Instrumented::new(tenant, LimiterMetrics::new("tenant"));
        for _ in 0..3 {
            let _ = tenant.check();
        }
        tenant
            .limiter()
            .set_quota(Quota::per_second(10), Carry::Debt);
        // The debt of the first quota is one second: then full at the new burst.
        clock.advance(Duration::from_secs(1));
        for _ in 0..11 {
            let _ = tenant.check();
        }
        let paced = Instrumented::new(
            ReconfigurableThrottle::with_clock(Quota::per_second(1), clock.clone()),
            LimiterMetrics::new("paced"),
        );
        let _ = paced.check();
        let _ = paced.check();
    });
    let c = counters(&recorder);
    assert_eq!(count(&c, "allowed_total", "limiter=tenant"), 12);
    assert_eq!(count(&c, "denied_total", "limiter=tenant"), 2);
    assert_eq!(count(&c, "allowed_total", "limiter=paced"), 1);
    assert_eq!(count(&c, "denied_total", "limiter=paced"), 1);
}

/// A keyed table given counters counts each settlement and each operator's change of a key.
#[test]
fn a_keyed_tables_settlements_and_changes_are_counted() {
    let recorder = DebuggingRecorder::new();
    metrics::with_local_recorder(&recorder, || {
        let table = Keyed::gcra_with_clock(Quota::per_second(10), 100, ManualClock::new())
            .with_metrics(LimiterMetrics::new("keys"));
        table.charge_key("a", 5).unwrap().settle(1);
        table.charge_key("a", 1).unwrap().settle(3);
        drop(table.charge_key("a", 1).unwrap());
        let _ = table.penalize("b", 4);
        let _ = table.block("c", Duration::from_secs(1));
        assert!(table.reset("b"));
        assert!(table.remove("c"));
    });
    let c = counters(&recorder);
    assert_eq!(admin_counts(&c, "keys"), [2, 1, 1, 1, 1], "{c:?}");
}
