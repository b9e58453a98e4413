//! Models 6, 11 and 14, on `Keyed`: racing first checks on one key share one bucket, and are not
//! told the table is full by each other; a check racing a change of the table's quota decides on
//! one quota.
#![cfg(atomic_limiter_loom)]

mod common;

use atomic_limiter::{Decision, Gcra, ManualClock};
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
use atomic_limiter::keyed::{KeyEntry, KeyedStore};
use atomic_limiter::{KeyQuotas, Keyed};
use loom::sync::Mutex;
use std::collections::HashMap;

struct LoomMap<V> {
    map: Mutex<HashMap<u32, Arc<V>>>,
    broken: bool,
}

impl<V> KeyedStore<u32, V> for LoomMap<V> {
    fn with_existing<Q, R>(&self, key: &Q, f: impl FnOnce(&V) -> R) -> Option<R>
    where
        u32: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        let v = self.map.lock().unwrap().get(key).cloned();
        v.map(|v| f(&v))
    }

    fn with_existing_mut<R>(&self, key: &u32, f: impl FnOnce(&mut V) -> R) -> Option<R> {
        // The map's mutex excludes every check while `f` runs (a check clones the entry's `Arc`
        // under it, so the value is changed in place only when no check holds it).
        let mut map = self.map.lock().unwrap();
        map.get_mut(key).and_then(Arc::get_mut).map(f)
    }

    fn with_inserted<R>(
        &self,
        key: u32,
        make: impl FnOnce() -> V,
        f: impl FnOnce(&V) -> R,
    ) -> (R, bool) {
        if self.broken {
            let found = self.map.lock().unwrap().get(&key).cloned();
            if let Some(v) = found {
                return (f(&v), false);
            }
            let v = Arc::new(make());
            self.map.lock().unwrap().insert(key, v.clone());
            return (f(&v), true);
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
        (f(&v), inserted)
    }

    fn update_all(&self, mut f: impl FnMut(&u32, &mut V)) {
        let mut map = self.map.lock().unwrap();
        for (k, v) in map.iter_mut() {
            // A check holding the entry's `Arc` finishes without the map's mutex.
            let v = loop {
                if Arc::get_mut(v).is_some() {
                    break Arc::get_mut(v).unwrap();
                }
                thread::yield_now();
            };
            f(k, v);
        }
    }

    fn remove_where(&self, mut remove: impl FnMut(&u32, &V) -> bool) {
        self.map.lock().unwrap().retain(|k, v| !remove(k, v));
    }

    fn remove_if(&self, key: &u32, remove: impl FnOnce(&V) -> bool) -> bool {
        let mut map = self.map.lock().unwrap();
        match map.get(key) {
            Some(v) if remove(v) => map.remove(key).is_some(),
            _ => false,
        }
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
                    keyed.loom_broken_check_key(&7)
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
                    keyed.loom_unchecked_check_key(&7)
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
