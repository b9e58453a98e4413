//! Models 6, 11, 14, 15, 16 and 19, on `Keyed`: racing first checks on one key share one bucket,
//! and are not told the table is full by each other; a check racing a change of the table's quota
//! decides on one quota; on a store whose checks run beside its changes, no admission is lost to
//! an eviction or a move, and no penalty to a move.
#![cfg(atomic_limiter_loom)]

mod common;

use atomic_limiter::{Decision, Gcra, ManualClock, loom_api};
use common::*;
use loom::sync::Arc;
use loom::thread;

/// Model 6: the keyed limiter's insert-or-get race. Two threads make the first check on the same
/// key at once, burst 1: one bucket must be created, so exactly one is admitted. dashmap's locks
/// are invisible to loom, so the model runs `Keyed` on a map loom can see: a loom mutex around a
/// `HashMap`. One bucket is kept two ways: `Keyed` serialises insertions, and the map's
/// insert-or-get is atomic. Its broken twin breaks both: the first check as it was before
/// insertions were serialised, on a map that looks the key up, unlocks, and inserts afterwards;
/// two threads can both insert, each with a fresh bucket.
use atomic_limiter::keyed::{Change, KeyEntry, KeyedStore, Retired};
use atomic_limiter::{KeyQuotas, Keyed};
use loom::sync::Mutex;
use std::collections::HashMap;

struct LoomMap<V> {
    map: Mutex<HashMap<u32, Arc<V>>>,
    broken: bool,
}

impl<V> KeyedStore<u32, V> for LoomMap<V> {
    fn with_existing<Q, R>(&self, key: &Q, f: impl FnOnce(&V, Option<&Retired>) -> R) -> Option<R>
    where
        u32: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        let v = self.map.lock().unwrap().get(key).cloned();
        v.map(|v| f(&v, None))
    }

    fn with_inserted<R>(
        &self,
        key: u32,
        make: impl FnOnce() -> V,
        f: impl FnOnce(&V, Option<&Retired>) -> R,
    ) -> (R, bool) {
        if self.broken {
            let found = self.map.lock().unwrap().get(&key).cloned();
            if let Some(v) = found {
                return (f(&v, None), false);
            }
            let v = Arc::new(make());
            self.map.lock().unwrap().insert(key, v.clone());
            return (f(&v, None), true);
        }
        let mut map = self.map.lock().unwrap();
        let (v, inserted) = match map.get(&key) {
            Some(v) => (v.clone(), false),
            None => {
                let v = Arc::new(make());
                map.insert(key, v.clone());
                (v, true)
            }
        };
        drop(map);
        (f(&v, None), inserted)
    }

    fn change<R>(
        &self,
        key: &u32,
        f: impl FnOnce(&V, Option<&Retired>) -> (Change<V>, R),
    ) -> Option<R> {
        // Held exclusively: the map's mutex keeps new checks out, and a check holding the
        // entry's `Arc` (taken under the mutex) finishes first.
        let mut map = self.map.lock().unwrap();
        let v = map.get_mut(key)?;
        while Arc::get_mut(v).is_none() {
            thread::yield_now();
        }
        let (change, answer) = f(v, None);
        match change {
            Change::Keep => {}
            Change::Replace(new) => *v = Arc::new(new),
            Change::Remove => {
                map.remove(key);
            }
        }
        Some(answer)
    }

    fn keys(&self) -> Vec<u32> {
        self.map.lock().unwrap().keys().copied().collect()
    }
}

/// A map whose checks run beside its changes, as a lock-free one's do: a lookup takes the entry's
/// `Arc` and its flag under the mutex and lets go before the check runs; a change decides outside
/// the mutex too, then replaces or removes the entry. Its broken form hands out no flag, as if its
/// changes held the entry exclusively: the table then moves and evicts entries that checks are
/// still taking tokens from.
struct SharedMap<V> {
    map: Mutex<HashMap<u32, Arc<(V, Retired)>>>,
    broken: bool,
}

impl<V> SharedMap<V> {
    fn new(broken: bool) -> Self {
        SharedMap {
            map: Mutex::new(HashMap::new()),
            broken,
        }
    }

    fn flag<'a>(&self, slot: &'a (V, Retired)) -> Option<&'a Retired> {
        (!self.broken).then_some(&slot.1)
    }
}

impl<V> KeyedStore<u32, V> for SharedMap<V> {
    fn with_existing<Q, R>(&self, key: &Q, f: impl FnOnce(&V, Option<&Retired>) -> R) -> Option<R>
    where
        u32: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        let slot = self.map.lock().unwrap().get(key).cloned();
        slot.map(|s| f(&s.0, self.flag(&s)))
    }

    fn with_inserted<R>(
        &self,
        key: u32,
        make: impl FnOnce() -> V,
        f: impl FnOnce(&V, Option<&Retired>) -> R,
    ) -> (R, bool) {
        let mut map = self.map.lock().unwrap();
        let (slot, inserted) = match map.get(&key) {
            Some(s) => (s.clone(), false),
            None => {
                let s = Arc::new((make(), Retired::new()));
                map.insert(key, s.clone());
                (s, true)
            }
        };
        drop(map);
        (f(&slot.0, self.flag(&slot)), inserted)
    }

    fn change<R>(
        &self,
        key: &u32,
        f: impl FnOnce(&V, Option<&Retired>) -> (Change<V>, R),
    ) -> Option<R> {
        let slot = self.map.lock().unwrap().get(key).cloned()?;
        let (change, answer) = f(&slot.0, self.flag(&slot));
        let mut map = self.map.lock().unwrap();
        match change {
            Change::Keep => {}
            Change::Replace(new) => {
                map.insert(*key, Arc::new((new, Retired::new())));
            }
            Change::Remove => {
                map.remove(key);
            }
        }
        Some(answer)
    }

    fn keys(&self) -> Vec<u32> {
        self.map.lock().unwrap().keys().copied().collect()
    }
}

type L = Gcra<ManualClock>;

/// A table of `max_keys` keys, each of `burst`, on a `LoomMap` (looking up, unlocking and then
/// inserting when `broken_store`); two threads make the first check on key 7 at once (the
/// unserialised first check when `broken`). Returns the table and both decisions.
fn two_first_checks(
    max_keys: usize,
    burst: u32,
    broken_store: bool,
    broken: bool,
) -> (Arc<Keyed<u32, L, LoomMap<KeyEntry<L>>>>, Vec<Decision>) {
    let clock = ManualClock::new();
    let store = LoomMap::<KeyEntry<L>> {
        map: Mutex::new(HashMap::new()),
        broken: broken_store,
    };
    let keyed = Arc::new(Keyed::with_store(
        store,
        max_keys,
        KeyQuotas::Every(quota(burst)),
        move |q| Gcra::with_clock(q, clock.clone()),
    ));
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let keyed = keyed.clone();
            thread::spawn(move || {
                if broken {
                    loom_api::keyed_broken_check_key(&keyed, &7)
                } else {
                    keyed.check_key(&7)
                }
            })
        })
        .collect();
    let decisions = handles.into_iter().map(|h| h.join().unwrap()).collect();
    (keyed, decisions)
}

fn first_checks_share_one_bucket(broken: bool) {
    loom::model(move || {
        let (_, decisions) = two_first_checks(8, 1, broken, broken);
        let admitted = decisions.iter().filter(|d| d.is_allowed()).count();
        assert_eq!(admitted, 1, "admitted for one key of burst 1");
    });
}

#[test]
fn model_6_first_checks_share_one_bucket() {
    first_checks_share_one_bucket(false);
}

#[test]
#[should_panic(expected = "admitted for one key of burst 1")]
fn model_6_broken_twin_is_caught() {
    first_checks_share_one_bucket(true);
}

/// Model 11: two first checks of the one key a table has room for. Every insertion runs under the
/// eviction index's lock, and a check that finds no room looks for its key again under that lock,
/// so neither check is told the table is full: the key is held, or about to be, by the other. Its
/// broken twin is the first check as it was before insertions were serialised: it can find the
/// place taken by its own key's insertion and refuse with a 503.
fn the_only_key_that_fits_is_never_refused_as_table_full(broken: bool) {
    loom::model(move || {
        let (keyed, decisions) = two_first_checks(1, 2, false, broken);
        let full = decisions.iter().filter(|d| d.is_table_full()).count();
        assert_eq!(full, 0, "told the table is full");
        assert_eq!(keyed.len(), 1);
    });
}

#[test]
fn model_11_the_only_key_that_fits_is_never_refused_as_table_full() {
    the_only_key_that_fits_is_never_refused_as_table_full(false);
}

#[test]
#[should_panic(expected = "told the table is full")]
fn model_11_broken_twin_is_caught() {
    the_only_key_that_fits_is_never_refused_as_table_full(true);
}

/// Model 14: a check racing `Keyed::set_quota` on a table with one quota. Key 7 is drained at
/// 1/s with a burst of 2 (its debt is two seconds); the change moves the table to 10/s, burst 2,
/// carrying the share in use, so the key stays drained (its debt becomes 200 ms). A check racing
/// the change is refused whichever quota it decides on. The broken twin's fast path trusts the
/// hint read before the lock: it decides the moved key with the first limiter's parameters on
/// the new state (200 ms of debt is within the first quota's one-second tolerance) and admits.
fn a_check_racing_set_quota_decides_on_one_quota(broken: bool) {
    loom::model(move || {
        use atomic_limiter::{Carry, Quota};
        let clock = ManualClock::new();
        let store = LoomMap::<KeyEntry<L>> {
            map: Mutex::new(HashMap::new()),
            broken: false,
        };
        let slow = Quota::per_second(1).with_burst(2);
        let keyed = Arc::new(Keyed::with_store(
            store,
            4,
            KeyQuotas::Every(slow),
            move |q| Gcra::with_clock(q, clock.clone()),
        ));
        assert!(keyed.check_key(&7).is_allowed() && keyed.check_key(&7).is_allowed());
        let checker = {
            let keyed = keyed.clone();
            thread::spawn(move || {
                if broken {
                    loom_api::keyed_unchecked_check_key(&keyed, &7)
                } else {
                    keyed.check_key(&7)
                }
            })
        };
        let fast = Quota::per_second(10).with_burst(2);
        assert!(keyed.set_quota(fast, Carry::Proportional));
        let racing = checker.join().unwrap();
        assert!(
            racing.is_denied(),
            "a drained key admitted while its quota changed"
        );
    });
}

#[test]
fn model_14_a_check_racing_set_quota_decides_on_one_quota() {
    a_check_racing_set_quota_decides_on_one_quota(false);
}

#[test]
#[should_panic(expected = "a drained key admitted while its quota changed")]
fn model_14_broken_twin_is_caught() {
    a_check_racing_set_quota_decides_on_one_quota(true);
}

/// Model 15: on a store whose checks run beside its changes, a check racing the eviction of its
/// key. Key 7 (burst 1, 10/s) was drained and is full again when a check on it races
/// `retain_recent`. However they meet, key 7 is admitted once in the period: the eviction retires
/// the entry first and looks again, so the check's token is either taken before (the key is kept,
/// drained) or after (on the fresh entry the key comes back with). The broken twin is the same
/// store handing out no flag: the eviction decides on its first look and forgets the token the
/// check took meanwhile, and the key comes back fresh.
fn an_eviction_never_forgets_an_admission(broken: bool) {
    loom::model(move || {
        use std::time::Duration;
        let clock = ManualClock::new();
        let c = clock.clone();
        let keyed = Arc::new(Keyed::with_store(
            SharedMap::<KeyEntry<L>>::new(broken),
            4,
            KeyQuotas::Every(quota(1)),
            move |q| Gcra::with_clock(q, c.clone()),
        ));
        assert!(keyed.check_key(&7).is_allowed());
        clock.advance(Duration::from_millis(100));
        let checker = {
            let keyed = keyed.clone();
            thread::spawn(move || keyed.check_key(&7).is_allowed())
        };
        keyed.retain_recent();
        let racing = checker.join().unwrap();
        let after = keyed.check_key(&7).is_allowed();
        assert!(
            !(racing && after),
            "key 7 admitted twice in one period around an eviction"
        );
    });
}

#[test]
fn model_15_an_eviction_never_forgets_an_admission() {
    an_eviction_never_forgets_an_admission(false);
}

#[test]
#[should_panic(expected = "key 7 admitted twice in one period around an eviction")]
fn model_15_broken_twin_is_caught() {
    an_eviction_never_forgets_an_admission(true);
}

/// Models 16 and 19's table: on the store of model 15 (with no flag when `broken`), key 7 at 1/s
/// burst 2 until `fast` is set, then 10/s burst 2, through a quota function.
fn moving_table(
    broken: bool,
) -> (
    Arc<Keyed<u32, L, SharedMap<KeyEntry<L>>>>,
    Arc<std::sync::atomic::AtomicBool>,
) {
    use atomic_limiter::Quota;
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let clock = ManualClock::new();
    let fast = Arc::new(AtomicBool::new(false));
    let quota_fast = fast.clone();
    let keyed = Arc::new(Keyed::with_store(
        SharedMap::<KeyEntry<L>>::new(broken),
        4,
        KeyQuotas::PerKey(Box::new(move |_: &u32| {
            if quota_fast.load(Relaxed) {
                Quota::per_second(10).with_burst(2)
            } else {
                Quota::per_second(1).with_burst(2)
            }
        })),
        move |q| Gcra::with_clock(q, clock.clone()),
    ));
    (keyed, fast)
}

/// Model 16: on a store whose checks run beside its changes, a check racing `Keyed::requota`.
/// Key 7 has a burst of 2 at 1/s and has spent one token; the change moves it to 10/s with the
/// same burst, carrying the share in use (one token of two). A check racing the move takes the last
/// token on the old entry (and the move carries the word with it) or on the new one, never both:
/// with the clock frozen, exactly one of the racing check and a later check is admitted. The
/// broken twin, with no flag, moves a word a check is still taking from: the token taken on the
/// old entry is lost, and both are admitted.
fn a_move_never_forgets_an_admission(broken: bool) {
    loom::model(move || {
        use atomic_limiter::Carry;
        use std::sync::atomic::Ordering::Relaxed;
        let (keyed, fast) = moving_table(broken);
        assert!(keyed.check_key(&7).is_allowed());
        let checker = {
            let keyed = keyed.clone();
            thread::spawn(move || keyed.check_key(&7).is_allowed())
        };
        fast.store(true, Relaxed);
        assert!(keyed.requota(&7, Carry::Proportional));
        let racing = checker.join().unwrap();
        let after = keyed.check_key(&7).is_allowed();
        assert!(
            racing != after,
            "a burst of 2 with one token spent: racing {racing}, after {after}"
        );
    });
}

#[test]
fn model_16_a_move_never_forgets_an_admission() {
    a_move_never_forgets_an_admission(false);
}

#[test]
#[should_panic(expected = "a burst of 2 with one token spent")]
fn model_16_broken_twin_is_caught() {
    a_move_never_forgets_an_admission(true);
}

/// Model 19: on a store whose checks run beside its changes, `Keyed::penalize` racing
/// `Keyed::requota`. Key 7 (burst 2 at 1/s) has spent one token; a penalty of one more races the
/// move to 10/s with the same burst, carrying the share in use. The penalty lands on the old entry
/// before the move carries its word, or sees the entry retired and lands on the new one: either
/// way the key is empty after both, and a check is refused. The broken twin, with no flag, writes
/// the penalty into a word the move has already carried: it is lost, and the check admitted.
fn a_penalty_racing_a_move_is_kept(broken: bool) {
    loom::model(move || {
        use atomic_limiter::Carry;
        use std::sync::atomic::Ordering::Relaxed;
        let (keyed, fast) = moving_table(broken);
        assert!(keyed.check_key(&7).is_allowed());
        let penalty = {
            let keyed = keyed.clone();
            thread::spawn(move || {
                let _ = keyed.penalize(&7, 1);
            })
        };
        fast.store(true, Relaxed);
        assert!(keyed.requota(&7, Carry::Proportional));
        penalty.join().unwrap();
        assert!(!keyed.check_key(&7).is_allowed(), "the penalty is kept");
    });
}

#[test]
fn model_19_a_penalty_racing_a_move_is_kept() {
    a_penalty_racing_a_move_is_kept(false);
}

#[test]
#[should_panic(expected = "the penalty is kept")]
fn model_19_broken_twin_is_caught() {
    a_penalty_racing_a_move_is_kept(true);
}

/// Model 20: a check racing the default store's growth. Keys 1 to 3 fill the smallest table
/// (four slots under loom); key 1, burst 2, has spent one token. One thread checks key 1 while
/// another inserts key 4, which copies every entry to a larger table. The check lands on the old
/// entry before the copy retires it (and the copy carries the admission), or finds it retired and
/// looks again in the new table: either way key 1 is empty after both, and a check is refused.
/// The broken twin copies the entries without retiring them: an admission made on the old entry
/// after its copy is lost, and the last check admitted.
fn a_check_racing_growth_is_kept(broken: bool) {
    loom::model(move || {
        let clock = ManualClock::new();
        let keyed = Arc::new(Keyed::with_store(
            loom_api::flat_store(broken),
            16,
            KeyQuotas::Every(atomic_limiter::Quota::per_second(1).with_burst(2)),
            move |q| Gcra::with_clock(q, clock.clone()),
        ));
        for key in 1..=3u32 {
            assert!(keyed.check_key(&key).is_allowed());
        }
        let grow = {
            let keyed = keyed.clone();
            thread::spawn(move || assert!(keyed.check_key(&4).is_allowed()))
        };
        assert!(keyed.check_key(&1).is_allowed());
        grow.join().unwrap();
        assert!(
            !keyed.check_key(&1).is_allowed(),
            "a burst of 2, both spent"
        );
    });
}

#[test]
fn model_20_a_check_racing_growth_is_kept() {
    a_check_racing_growth_is_kept(false);
}

#[test]
#[should_panic(expected = "a burst of 2, both spent")]
fn model_20_broken_twin_is_caught() {
    a_check_racing_growth_is_kept(true);
}
