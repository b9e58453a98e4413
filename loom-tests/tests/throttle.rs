//! Models 8 and 9, on `Throttle`: racing reservations get distinct slots; a refund racing a
//! reservation never hands a slot out twice.
#![cfg(atomic_limiter_loom)]

mod common;

use atomic_limiter::{ManualClock, loom_api};
use common::*;
use loom::sync::Arc;
use loom::thread;
use std::time::Duration;

/// Model 8: the throttle's slot reservation. Burst 1, frozen clock, two threads reserve at once:
/// they get distinct slots, now and one period later. The broken twin (load, then store) can hand
/// both the same slot.
use atomic_limiter::Throttle;

fn slots_are_distinct(broken: bool) {
    loom::model(move || {
        let t = Arc::new(Throttle::with_clock(quota(1), ManualClock::new()));
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let t = t.clone();
                thread::spawn(move || {
                    let max = Duration::from_secs(10);
                    if broken {
                        loom_api::broken_reserve(&t, max)
                    } else {
                        t.reserve(max)
                    }
                    .unwrap()
                    .wait()
                })
            })
            .collect();
        let mut waits: Vec<Duration> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        waits.sort();
        assert_eq!(waits, [Duration::ZERO, PERIOD], "distinct slots");
    });
}

#[test]
fn model_8_reservations_get_distinct_slots() {
    slots_are_distinct(false);
}

#[test]
#[should_panic(expected = "distinct slots")]
fn model_8_broken_twin_is_caught() {
    slots_are_distinct(true);
}

/// Model 9: a refund racing a reservation. Burst 1, frozen clock; A is reserved first (now). One
/// thread reserves B and gives it back while another reserves C. If B is still the latest
/// reservation when it is given back, its slot goes back: C and the next reservation D take one
/// period and two. If C came after B, nothing is given back (B's slot is left empty rather than
/// handed out under C): C waits two periods and D three. The broken twin refunds with a load and
/// a store and can move the next free slot back under C: D lands on C's slot.
fn refund_and_reserve_both_land(broken: bool) {
    loom::model(move || {
        let t = Arc::new(Throttle::with_clock(quota(1), ManualClock::new()));
        let max = Duration::from_secs(10);
        assert_eq!(t.reserve(max).unwrap().wait(), Duration::ZERO);
        let refunder = {
            let t = t.clone();
            thread::spawn(move || {
                let b = t.reserve(max).unwrap();
                if broken {
                    loom_api::broken_refund(b)
                } else {
                    b.refund()
                }
            })
        };
        let reserver = {
            let t = t.clone();
            thread::spawn(move || t.reserve(max).unwrap().wait())
        };
        let refunded = refunder.join().unwrap();
        let c = reserver.join().unwrap();
        let d = t.reserve(max).unwrap().wait();
        let expected = if refunded {
            (PERIOD, 2 * PERIOD)
        } else {
            (2 * PERIOD, 3 * PERIOD)
        };
        assert_eq!((c, d), expected, "refund and reservation both land");
    });
}

#[test]
fn model_9_refund_and_reserve_both_land() {
    refund_and_reserve_both_land(false);
}

#[test]
#[should_panic(expected = "refund and reservation both land")]
fn model_9_broken_twin_is_caught() {
    refund_and_reserve_both_land(true);
}
