use super::table::Keyed;
use crate::clock::ManualClock;
use crate::gcra::Gcra;
use crate::limiter::algorithm::Carry;
use crate::quota::Quota;
use std::sync::Arc;
use std::sync::atomic::Ordering;

#[test]
fn keys_are_independent_and_counted() {
    let clock = ManualClock::new();
    let k = Keyed::gcra_with_clock(Quota::per_second(10).with_burst(2), 100, clock);
    for key in 0..10u32 {
        assert!(k.check_key(&key).is_allowed());
        assert!(k.check_key(&key).is_allowed());
        assert!(k.check_key(&key).is_denied());
    }
    assert_eq!(k.len(), 10);
    assert!(k.check_key_n(&99, 3).is_err());
    assert_eq!(k.len(), 10, "a request above the burst adds no key");
}

/// A key whose quota keeps changing is filed again each time; the index is merged before it
/// holds more than twice the table, and a full table still evicts what is full.
#[test]
fn requota_keeps_the_index_bounded() {
    use std::sync::atomic::AtomicU64;
    let clock = ManualClock::new();
    let rate = Arc::new(AtomicU64::new(1));
    let table = {
        let (rate, clock) = (rate.clone(), clock.clone());
        Keyed::with_quota_fn(
            4,
            move |_: &u32| Quota::per_second(rate.load(Ordering::Relaxed)),
            move |q| Gcra::with_clock(q, clock.clone()),
        )
    };
    for k in 0..4u32 {
        assert!(table.check_key(&k).is_allowed());
    }
    let rounds = if cfg!(miri) { 20 } else { 1000 };
    let mut changed = 0;
    for round in 0..rounds {
        rate.store(round % 7 + 1, Ordering::Relaxed);
        for k in 0..4u32 {
            changed += usize::from(table.requota(&k, Carry::Proportional));
        }
    }
    assert!(changed as u64 > 3 * rounds);
    let filed = table.due.lock().unwrap().len();
    assert!(filed <= 16, "{filed} entries for 4 keys");
    // Every bucket full again after a second: a new key evicts one.
    clock.advance(core::time::Duration::from_secs(1));
    assert!(table.check_key(&99).is_allowed());
    assert_eq!(table.len(), 4);
}

#[test]
fn full_buckets_are_evicted_at_the_cap_and_come_back_fresh() {
    let clock = ManualClock::new();
    let k = Keyed::gcra_with_clock(Quota::per_second(10).with_burst(1), 4, clock.clone());
    for key in 0..4u32 {
        assert!(k.check_key(&key).is_allowed());
    }
    // At the cap, nothing full: a new key is refused, not admitted past the cap.
    assert!(k.check_key(&4).is_denied());
    assert_eq!(k.len(), 4);
    // A period later every bucket is full again: the next new key sweeps them out.
    clock.advance(core::time::Duration::from_millis(100));
    k.retain_recent();
    assert!(k.check_key(&4).is_allowed());
    assert!(k.len() <= 4);
    // Key 0 was evicted full: it comes back with one token, as it would have had.
    assert!(k.check_key(&0).is_allowed());
    assert!(k.check_key(&0).is_denied());
}

/// A quota function that checks, penalizes and requotas other keys of its own table (a quota
/// read from state that the table also limits) runs under none of the table's locks, so it
/// neither deadlocks nor loses what it did.
#[test]
#[cfg_attr(miri, ignore)] // a thread and a timeout: the deadlock would be Miri's own report
fn a_quota_function_may_change_its_own_table() {
    use std::sync::OnceLock;
    use std::sync::mpsc;
    use std::time::Duration;
    static TABLE: OnceLock<Keyed<u32, Gcra<ManualClock>>> = OnceLock::new();
    let clock = ManualClock::new();
    TABLE.get_or_init(|| {
        Keyed::with_quota_fn(
            8,
            |k: &u32| {
                if *k >= 100 {
                    let table = TABLE.get().expect("built before its first check");
                    assert!(table.check_key(&(k - 100)).is_allowed());
                    let _ = table.penalize(&(k - 100), 1);
                    let _ = table.requota(&(k - 100), Carry::Debt);
                }
                Quota::per_hour(2)
            },
            move |q| Gcra::with_clock(q, clock.clone()),
        )
    });
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let table = TABLE.get().unwrap();
        let new_key = table.check_key(&105).is_allowed();
        let _ = done.send((new_key, table.check_key_n(&5, 0).unwrap().remaining()));
    });
    let (new_key, left) = finished
        .recv_timeout(Duration::from_secs(30))
        .expect("a quota function calling into its own table deadlocked");
    assert!(new_key);
    assert_eq!(left, 0, "key 5 took one token and one penalty of its 2");
}

/// The default store under a reader: one thread looks keys up (and checks them) while another
/// inserts `String` keys past two growths, removes and replaces some, and shrinks the table.
/// Small enough for Miri (whose smallest table is 16 slots), which checks every read of a slot
/// against the writes and frees of the other thread.
#[test]
fn the_flat_store_reads_beside_growth_removal_and_frees() {
    use super::{Change, FlatStore, KeyEntry, KeyHasher, KeyedStore, Relocate};
    use alloc::string::{String, ToString};
    let clock = ManualClock::new();
    let limiter = Arc::new(Gcra::with_clock(
        Quota::per_second(1).with_burst(1000),
        clock,
    ));
    let entry = || KeyEntry {
        state: crate::limiter::shared::engine::KeyedEngine::fresh_state(&*limiter),
        limiter: limiter.clone(),
    };
    let store: Arc<FlatStore<String, KeyEntry<Gcra<ManualClock>>>> =
        Arc::new(FlatStore::with_hasher(KeyHasher::new()));
    store.with_inserted("held".to_string(), entry, |_, _| ());
    let done = Arc::new(core::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (store, done) = (store.clone(), done.clone());
        std::thread::spawn(move || {
            // Admissions of the key held throughout (moved by each growth).
            let mut admitted = 0u64;
            while !done.load(Ordering::Relaxed) {
                for key in ["held", "k3", "k40"] {
                    let seen = store.with_existing(key, |e, retired| e.check(1, retired));
                    if let Some(Some(Ok(d))) = seen {
                        admitted += u64::from(key == "held" && d.is_allowed());
                    }
                }
            }
            admitted
        })
    };
    // Past seven eighths of the smallest table twice (an even count).
    let keys = super::flat::MIN_SLOTS / 8 * 7 * 2 + 4;
    for i in 0..keys {
        store.with_inserted(alloc::format!("k{i}"), entry, |_, _| ());
    }
    for i in (0..keys).step_by(2) {
        let key = alloc::format!("k{i}");
        assert!(
            store
                .change(&key, |e, r| (Change::Remove, e.retire(r)))
                .is_some()
        );
    }
    for i in (1..keys).step_by(4) {
        let key = alloc::format!("k{i}");
        let replaced = store.change(&key, |e, r| {
            let r = r.expect("the flat store hands out the retired flag");
            (Change::Replace(e.relocate(r)), ())
        });
        assert!(replaced.is_some());
    }
    store.shrink_to_fit();
    done.store(true, Ordering::Relaxed);
    let admitted = reader.join().unwrap();
    let mut held = store.keys();
    held.sort();
    assert_eq!(held.len(), keys / 2 + 1, "{held:?}");
    assert!(held.contains(&"held".to_string()) && !held.contains(&"k40".to_string()));
    let left = store
        .with_existing("held", |e, _| e.check(0, None))
        .and_then(|d| d?.ok())
        .map(|d| d.remaining());
    assert_eq!(
        left.map(|l| l + admitted),
        Some(1000),
        "{admitted} admitted"
    );
}
