//! Models 5 and 10, on `Sharded`: stealing, and a gather that gives back what it took.
#![cfg(atomic_limiter_loom)]

mod common;

use atomic_limiter::{ManualClock, loom_api};
use common::*;
use loom::sync::Arc;
use loom::thread;

/// Model 5: stealing in the sharded limiter. Burst 2 over two shards (one token each); three
/// threads all start on shard 0, so two of them must steal from shard 1. Exactly 2 are admitted in
/// every interleaving. The broken twin takes from the victim shard with a load and a store.
use atomic_limiter::Sharded;

fn stealing_admits_exactly_the_burst(broken: bool) {
    loom::model(move || {
        let s = Arc::new(Sharded::gcra_with_clock(quota(2), 2, ManualClock::new()));
        assert_eq!(s.shard_count(), 2);
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let s = s.clone();
                thread::spawn(move || {
                    let d = if broken {
                        loom_api::sharded_check_with(&s, 0, 1, |l, n| {
                            loom_api::broken_check_n(l, n)
                        })
                    } else {
                        s.check_n_from(0, 1).unwrap()
                    };
                    u32::from(d.is_allowed())
                })
            })
            .collect();
        let admitted: u32 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(admitted, 2, "admitted with stealing");
    });
}

#[test]
fn model_5_stealing_admits_exactly_the_burst() {
    stealing_admits_exactly_the_burst(false);
}

#[test]
#[should_panic(expected = "admitted with stealing")]
fn model_5_broken_twin_is_caught() {
    stealing_admits_exactly_the_burst(true);
}

/// Model 10: a gather racing a plain check. Burst 2 over two shards (one token each); one
/// thread asks for 2 (more than a share: it gathers from both), another for 1 from shard 1.
/// In every interleaving the tokens taken plus those left add up to 2: a gather that loses the
/// race gives back what it took. The broken twin keeps what it took.
fn gather_gives_back_on_failure(broken: bool) {
    loom::model(move || {
        let s = Arc::new(Sharded::gcra_with_clock(quota(2), 2, ManualClock::new()));
        let gatherer = {
            let s = s.clone();
            thread::spawn(move || {
                let d = if broken {
                    loom_api::sharded_gather_keeping_what_it_took(&s, 0, 2)
                } else {
                    Some(s.check_n_from(0, 2).unwrap())
                };
                2 * u32::from(d.is_some_and(|d| d.is_allowed()))
            })
        };
        let single = {
            let s = s.clone();
            thread::spawn(move || u32::from(s.check_n_from(1, 1).unwrap().is_allowed()))
        };
        let taken = gatherer.join().unwrap() + single.join().unwrap();
        let left = (0..2)
            .filter(|_| s.check_n_from(0, 1).unwrap().is_allowed())
            .count() as u32;
        assert_eq!(taken + left, 2, "a failed gather gives back what it took");
    });
}

#[test]
fn model_10_a_failed_gather_gives_back() {
    gather_gives_back_on_failure(false);
}

#[test]
#[should_panic(expected = "a failed gather gives back what it took")]
fn model_10_broken_twin_is_caught() {
    gather_gives_back_on_failure(true);
}
