//! Models 1 to 4, on each limiter whose state is one word (`Gcra`, `TokenBucket`): every
//! interleaving of three threads on the CAS protocol, with a broken twin (load then store instead
//! of CAS) that loom must catch (`#[should_panic]`). Run with `bash .ci/loom.sh`.
#![cfg(atomic_limiter_loom)]

mod common;

use atomic_limiter::{Clock, Gcra, ManualClock, TokenBucket};
use common::*;
use loom::sync::Arc;
use loom::thread;

/// Models 1 and 2: burst 2, frozen clock, three threads each asking for one token. Every
/// interleaving admits exactly 2, and the two admissions report 1 and 0 remaining.
fn frozen_clock_admits_exactly_the_burst<L: Subject>(check: Check<L>) {
    loom::model(move || {
        let limiter = Arc::new(L::make(quota(2), ManualClock::new()));
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let limiter = limiter.clone();
                thread::spawn(move || {
                    let d = check(&limiter, 1);
                    d.is_allowed().then(|| d.remaining())
                })
            })
            .collect();
        let mut remaining: Vec<u64> = handles
            .into_iter()
            .filter_map(|h| h.join().unwrap())
            .collect();
        remaining.sort_unstable();
        assert_eq!(remaining, [0, 1], "admissions and their remaining counts");
        assert_eq!(limiter.check_n(0).unwrap().remaining(), 0);
    });
}

/// Model 3: mixed sizes while another thread advances the clock by one period. Burst 2, so in any
/// interleaving at most 2 + 1 tokens are admitted, and tokens are conserved: what is admitted plus
/// what is left at the end never exceeds that either.
fn concurrent_advance_never_exceeds_the_quota<L: Subject>(check: Check<L>) {
    loom::model(move || {
        let clock = ManualClock::new();
        let limiter = Arc::new(L::make(quota(2), clock.clone()));
        let big = {
            let limiter = limiter.clone();
            thread::spawn(move || {
                let d = check(&limiter, 2);
                if d.is_allowed() { 2 } else { 0 }
            })
        };
        let small = {
            let limiter = limiter.clone();
            thread::spawn(move || (0..2).filter(|_| check(&limiter, 1).is_allowed()).count() as u64)
        };
        let ticker = thread::spawn(move || clock.advance(PERIOD));
        let admitted = big.join().unwrap() + small.join().unwrap();
        ticker.join().unwrap();
        assert!(admitted <= 3, "admitted {admitted} > burst 2 + 1 period");
        let left = limiter.check_n(0).unwrap().remaining();
        assert!(
            admitted + left <= 3,
            "admitted {admitted} + left {left} > 3"
        );
    });
}

/// Model 3, second half: a denied call changes nothing. A drained limiter on a frozen clock; two
/// threads are denied while a third watches the state word: it never moves.
fn denials_do_not_write<L: Subject>() {
    loom::model(|| {
        let limiter = Arc::new(L::make(quota(2), ManualClock::new()));
        assert!(limiter.check_n(2).unwrap().is_allowed());
        let before = limiter.state();
        let deniers: Vec<_> = [1, 2]
            .into_iter()
            .map(|n| {
                let limiter = limiter.clone();
                thread::spawn(move || assert!(limiter.check_n(n).unwrap().is_denied()))
            })
            .collect();
        let watcher = {
            let limiter = limiter.clone();
            thread::spawn(move || {
                assert_eq!(limiter.state(), before);
                assert_eq!(limiter.state(), before);
            })
        };
        for h in deniers {
            h.join().unwrap();
        }
        watcher.join().unwrap();
        assert_eq!(limiter.state(), before);
    });
}

/// Model 4: the clock steps back between two readers. Burst 1, drained at the start; one thread
/// moves the clock forward a period then back two, two threads check. At most one token can have
/// returned (the clock never showed more than one period later), so at most one is admitted.
fn clock_stepping_back_admits_nothing_extra<L: Subject>() {
    loom::model(|| {
        let clock = ManualClock::starting_at(1_000_000_000);
        let limiter = Arc::new(L::make(quota(1), clock.clone()));
        assert!(limiter.check().is_allowed());
        let mover = {
            let clock = clock.clone();
            thread::spawn(move || {
                clock.advance(PERIOD);
                clock.rewind(PERIOD * 2);
            })
        };
        let checkers: Vec<_> = (0..2)
            .map(|_| {
                let limiter = limiter.clone();
                thread::spawn(move || limiter.check().is_allowed() as u64)
            })
            .collect();
        mover.join().unwrap();
        let admitted: u64 = checkers.into_iter().map(|h| h.join().unwrap()).sum();
        assert!(
            admitted <= 1,
            "admitted {admitted} with at most one period shown"
        );
        // Back at the start minus a period: nothing more until the clock passes the TAT again.
        assert!(clock.now() < 1_000_000_000);
        assert!(limiter.check().is_denied());
    });
}

/// Models 1 to 4 for one limiter type, with the broken twins of 1 (2 for the token bucket) and 3.
macro_rules! models_for {
    ($module:ident, $limiter:ty) => {
        mod $module {
            use super::*;
            type L = $limiter;

            #[test]
            fn model_1_2_frozen_clock_admits_exactly_the_burst() {
                frozen_clock_admits_exactly_the_burst::<L>(real);
            }

            #[test]
            #[should_panic(expected = "admissions and their remaining counts")]
            fn model_1_2_broken_twin_is_caught() {
                frozen_clock_admits_exactly_the_burst::<L>(broken);
            }

            #[test]
            fn model_3_concurrent_advance_never_exceeds_the_quota() {
                concurrent_advance_never_exceeds_the_quota::<L>(real);
            }

            #[test]
            #[should_panic(expected = "admitted")]
            fn model_3_broken_twin_is_caught() {
                concurrent_advance_never_exceeds_the_quota::<L>(broken);
            }

            #[test]
            fn model_3_denials_do_not_write() {
                denials_do_not_write::<L>();
            }

            #[test]
            fn model_4_clock_stepping_back_admits_nothing_extra() {
                clock_stepping_back_admits_nothing_extra::<L>();
            }
        }
    };
}

models_for!(gcra, Gcra<ManualClock>);
models_for!(token_bucket, TokenBucket<ManualClock>);
