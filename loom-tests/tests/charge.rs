//! Model 18, on `Gcra`'s charge and settlement: a settlement racing another charge and its
//! settlement loses neither.
#![cfg(atomic_limiter_loom)]

mod common;

use atomic_limiter::{Gcra, ManualClock, loom_api};
use common::*;
use loom::sync::Arc;
use loom::thread;

/// Model 18: burst 3, frozen clock at 0. A charges 2 and settles at 0 (all of it back); B charges
/// 1 and settles at 2 (one owed past the estimate). A surplus comes back only while its charge is
/// the latest change, so the debt left is B's 2 when A's charge was refused (B's debt left no room)
/// or given back, and 4 when B's charge came between A's and A's settlement (A's 2 kept, never
/// more than was taken). Never anything else: less would be credit no one gave back, more a lost
/// settlement. The broken twin settles A with a load and a store, and overwrites B's charge or
/// settlement.
fn settlements_lose_nothing(broken: bool) {
    loom::model(move || {
        let limiter = Arc::new(Gcra::with_clock(quota(3), ManualClock::new()));
        let a = {
            let limiter = limiter.clone();
            thread::spawn(move || {
                let charge = limiter.charge(2).unwrap();
                if broken {
                    loom_api::broken_settle(charge, 0);
                } else {
                    charge.settle(0);
                }
            })
        };
        let b = {
            let limiter = limiter.clone();
            thread::spawn(move || {
                let charge = limiter.charge(1).unwrap();
                assert!(charge.is_allowed(), "B's charge always fits");
                charge.settle(2);
            })
        };
        a.join().unwrap();
        b.join().unwrap();
        // The TAT on a clock at 0, in tokens of 100 ms.
        let debt = loom_api::state(&*limiter) / PERIOD.as_nanos() as u64;
        assert!(
            debt == 2 || debt == 4,
            "settlements lose nothing: a debt of {debt}"
        );
    });
}

#[test]
fn model_18_settlements_lose_nothing() {
    settlements_lose_nothing(false);
}

#[test]
#[should_panic(expected = "settlements lose nothing")]
fn model_18_broken_twin_is_caught() {
    settlements_lose_nothing(true);
}
