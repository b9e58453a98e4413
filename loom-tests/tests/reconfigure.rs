//! Models 12 and 13, on `Reconfigurable` and `ReconfigurableSharded`: a check racing a change of
//! quota.
#![cfg(atomic_limiter_loom)]

mod common;

use atomic_limiter::algorithm::GcraAlgorithm;
use atomic_limiter::{Carry, ManualClock, Reconfigurable, ReconfigurableSharded, loom_api};
use common::*;
use loom::sync::Arc;
use loom::thread;

/// Model 12: burst 1 on a frozen clock. One thread checks while another changes the quota (to the
/// same figures, so the carried state must be the old one exactly); then one more check. Exactly
/// one of the two checks is admitted, whichever cell each ran on. The broken twin reads the old
/// word instead of retiring it: the racing check admits on the old cell after its word was
/// carried, and the last check admits again on the new one. Without the Acquire fence that pairs
/// the retired flag with the retiring CAS, the model fails too: the check reads the retired word
/// without seeing the flag.
fn a_check_racing_a_change_is_counted_once(broken: bool) {
    loom::model(move || {
        let limiter: Arc<Reconfigurable<GcraAlgorithm, ManualClock>> =
            // At an odd instant, the retired word (the last one with its low bit flipped) reads
            // as a full limiter: a check that took it for live state would admit on it.
            Arc::new(Reconfigurable::with_clock(quota(1), ManualClock::starting_at(1)));
        let checker = {
            let limiter = limiter.clone();
            thread::spawn(move || u32::from(limiter.check().is_allowed()))
        };
        let changer = {
            let limiter = limiter.clone();
            thread::spawn(move || {
                if broken {
                    loom_api::broken_set_quota(&limiter, quota(1), Carry::Debt);
                } else {
                    limiter.set_quota(quota(1), Carry::Debt);
                }
            })
        };
        changer.join().unwrap();
        let admitted = checker.join().unwrap() + u32::from(limiter.check().is_allowed());
        assert_eq!(admitted, 1, "admitted for a burst of 1 on a frozen clock");
    });
}

#[test]
fn model_12_a_check_racing_a_change_is_counted_once() {
    a_check_racing_a_change_is_counted_once(false);
}

#[test]
#[should_panic(expected = "admitted for a burst of 1 on a frozen clock")]
fn model_12_broken_twin_is_caught() {
    a_check_racing_a_change_is_counted_once(true);
}

/// Model 12, longer: burst 2; one thread checks twice while another changes the quota twice
/// (the second change retires the cell the first built), then two more checks. Exactly 2 are
/// admitted in all.
#[test]
fn model_12_two_checks_racing_two_changes_are_counted_once_each() {
    loom::model(|| {
        let limiter: Arc<Reconfigurable<GcraAlgorithm, ManualClock>> = Arc::new(
            Reconfigurable::with_clock(quota(2), ManualClock::starting_at(1)),
        );
        let checker = {
            let limiter = limiter.clone();
            thread::spawn(move || (0..2).filter(|_| limiter.check().is_allowed()).count())
        };
        let changer = {
            let limiter = limiter.clone();
            thread::spawn(move || {
                limiter.set_quota(quota(2), Carry::Debt);
                limiter.set_quota(quota(2), Carry::Proportional);
            })
        };
        changer.join().unwrap();
        let racing = checker.join().unwrap();
        let after = (0..2).filter(|_| limiter.check().is_allowed()).count();
        assert_eq!(
            racing + after,
            2,
            "admitted for a burst of 2 on a frozen clock"
        );
    });
}

/// Model 13, on `ReconfigurableSharded`: burst 2 over two shards (one token each) on a frozen
/// clock. One thread checks while another changes the quota (to the same figures, so every shard
/// carries into itself); then two more checks. Both checks start on shard 0, so the later ones
/// reach shard 1 by stealing: the racing check is admitted (a check that met the retired cell
/// and took that for a refusal is caught), and exactly 2 are admitted in all. The broken twin
/// reads the words instead of retiring them: the racing check admits on an old shard after its
/// word was carried.
fn a_sharded_check_racing_a_change_is_counted_once(broken: bool) {
    loom::model(move || {
        let limiter: Arc<ReconfigurableSharded<GcraAlgorithm, ManualClock>> = Arc::new(
            ReconfigurableSharded::with_clock(quota(2), 2, ManualClock::starting_at(1)),
        );
        let checker = {
            let limiter = limiter.clone();
            thread::spawn(move || usize::from(limiter.check().is_allowed()))
        };
        let changer = {
            let limiter = limiter.clone();
            thread::spawn(move || {
                if broken {
                    loom_api::sharded_broken_set_quota(&limiter, quota(2), Carry::Debt);
                } else {
                    limiter.set_quota(quota(2), Carry::Debt);
                }
            })
        };
        changer.join().unwrap();
        let racing = checker.join().unwrap();
        // Tokens are there on either cell: a check that meets the change is never refused.
        assert_eq!(racing, 1, "the racing check was refused");
        let after = (0..2).filter(|_| limiter.check().is_allowed()).count();
        assert_eq!(
            racing + after,
            2,
            "admitted for a burst of 2 over two shards on a frozen clock"
        );
    });
}

#[test]
fn model_13_a_sharded_check_racing_a_change_is_counted_once() {
    a_sharded_check_racing_a_change_is_counted_once(false);
}

#[test]
#[should_panic(expected = "admitted for a burst of 2 over two shards on a frozen clock")]
fn model_13_broken_twin_is_caught() {
    a_sharded_check_racing_a_change_is_counted_once(true);
}
