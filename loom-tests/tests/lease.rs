//! Model 17, on the lease word that `Leased` spends: a give-back racing spends and a refill
//! neither loses a token nor hands one out twice.
#![cfg(atomic_limiter_loom)]

use atomic_limiter::loom_api::LeaseWord;
use loom::sync::Arc;
use loom::thread;

/// Model 17: a lease of 2 tokens (expiring at tick 10), read at tick 1. One thread takes a token
/// and gives it back, as an all-or-nothing request refused elsewhere does; another takes one
/// token twice; a third merges a refill of 1 (expiring at tick 20: merged into valid tokens,
/// the lease keeps tick 10; onto an empty one, it stands alone). Then the rest is drained. Every token granted (3) is taken exactly once in all:
/// the give-back neither drops a token (it is within its TTL) nor revives one spent meanwhile.
/// The broken twin gives back with a load and a store: it can overwrite a racing spend, and
/// the spent token is taken again.
fn give_back_conserves_tokens(broken: bool) {
    loom::model(move || {
        let word = Arc::new(LeaseWord::granted(10, 2));
        let a = {
            let word = word.clone();
            thread::spawn(move || match word.spend(1, 1) {
                Some(expiry) => {
                    let back = if broken {
                        word.broken_give_back(1, expiry, 1)
                    } else {
                        word.give_back(1, expiry, 1)
                    };
                    usize::from(!back)
                }
                None => 0,
            })
        };
        let b = {
            let word = word.clone();
            thread::spawn(move || (0..2).filter(|_| word.spend(1, 1).is_some()).count())
        };
        let c = {
            let word = word.clone();
            thread::spawn(move || word.refill(1, 20, 1))
        };
        let kept_by_a = a.join().unwrap();
        let taken_by_b = b.join().unwrap();
        c.join().unwrap();
        let drained = (0..8).filter(|_| word.spend(1, 1).is_some()).count();
        assert_eq!(
            kept_by_a + taken_by_b + drained,
            3,
            "every granted token taken exactly once"
        );
        // Whichever lease the word holds at the end, nothing is spent past tick 20.
        assert!(word.spend(20, 0).is_none());
    });
}

#[test]
fn model_17_a_give_back_racing_spends_and_a_refill_conserves_tokens() {
    give_back_conserves_tokens(false);
}

#[test]
#[should_panic(expected = "every granted token taken exactly once")]
fn model_17_broken_twin_is_caught() {
    give_back_conserves_tokens(true);
}
