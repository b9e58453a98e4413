//! The default keyed store on its own: what it holds through growth, removals and replacements,
//! the memory it frees, and checks that run beside its growth.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

use atomic_limiter::keyed::{Change, FlatStore, KeyHasher, KeyedStore, Relocate, Retired};
use atomic_limiter::{Gcra, KeyQuotas, Keyed, ManualClock, Quota};

/// A value that counts how many of its kind are alive, and how many times it was moved.
struct Counted {
    id: u64,
    moves: u32,
    alive: Arc<AtomicUsize>,
}

impl Counted {
    fn new(id: u64, alive: &Arc<AtomicUsize>) -> Counted {
        alive.fetch_add(1, Relaxed);
        Counted {
            id,
            moves: 0,
            alive: alive.clone(),
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.alive.fetch_sub(1, Relaxed);
    }
}

impl Relocate for Counted {
    fn relocate(&self, retired: &Retired) -> Counted {
        let _ = retired;
        self.alive.fetch_add(1, Relaxed);
        Counted {
            id: self.id,
            moves: self.moves + 1,
            alive: self.alive.clone(),
        }
    }
}

/// The id held for `key`, looked up both ways a check can: the lookup with work run before it
/// (a check's clock read) finds what the plain one does, runs that work once whether or not the
/// key is there, and hands its answer on.
fn found(store: &FlatStore<u64, Counted>, key: u64) -> Option<u64> {
    let id = store.with_existing(&key, |v, retired| {
        assert!(
            retired.is_some(),
            "the flat store's checks run beside its changes"
        );
        v.id
    });
    let mut ran = 0;
    let after = store.with_existing_after(
        &key,
        || {
            ran += 1;
            key ^ 0x5a5a
        },
        |v, retired, first| {
            assert!(retired.is_some());
            assert_eq!(first, key ^ 0x5a5a, "the work's answer is handed on");
            v.id
        },
    );
    assert_eq!(ran, 1, "the work before a lookup runs once, found or not");
    assert_eq!(after, id, "both lookups find the same entry");
    id
}

/// Ten thousand keys in (the table grows from 256 slots through six doublings), every third
/// removed, every third replaced: each lookup finds what a `HashMap` would, `keys()` lists the
/// keys held, and once `shrink_to_fit` has passed, only the values held are alive (those removed,
/// replaced or moved away were dropped).
#[test]
fn it_holds_what_a_map_holds_and_frees_the_rest() {
    let alive = Arc::new(AtomicUsize::new(0));
    let store: FlatStore<u64, Counted> = FlatStore::with_hasher(KeyHasher::new());
    let mut model = std::collections::HashMap::new();
    for key in 0..10_000u64 {
        let (id, inserted) = store.with_inserted(key, || Counted::new(key, &alive), |v, _| v.id);
        assert!(inserted && id == key);
        model.insert(key, key);
    }
    let (id, inserted) = store.with_inserted(7, || Counted::new(0, &alive), |v, _| v.id);
    assert!(!inserted && id == 7, "a key held is not inserted again");
    for key in (0..10_000u64).step_by(3) {
        let answer = store.change(&key, |v, _| (Change::Remove, v.id));
        assert_eq!(answer, Some(key));
        model.remove(&key);
    }
    for key in (1..10_000u64).step_by(3) {
        let by = key + 1_000_000;
        let answer = store.change(&key, |_, _| (Change::Replace(Counted::new(by, &alive)), ()));
        assert_eq!(answer, Some(()));
        model.insert(key, by);
    }
    assert_eq!(
        store.change(&0, |_, _| (Change::<Counted>::Remove, ())),
        None
    );
    for key in 0..10_000u64 {
        assert_eq!(found(&store, key), model.get(&key).copied(), "key {key}");
    }
    let keys: HashSet<u64> = store.keys().into_iter().collect();
    assert_eq!(keys, model.keys().copied().collect::<HashSet<u64>>());
    store.shrink_to_fit();
    assert_eq!(
        alive.load(Relaxed),
        model.len(),
        "values alive after shrink_to_fit"
    );
    for key in 0..10_000u64 {
        assert_eq!(
            found(&store, key),
            model.get(&key).copied(),
            "key {key} after shrinking"
        );
    }
    drop(store);
    assert_eq!(alive.load(Relaxed), 0, "values alive after the store");
}

/// The slots of the table lookups read, from the store's `Debug`.
fn slots(store: &FlatStore<u64, Counted>) -> usize {
    format!("{store:?}")
        .split("slots: ")
        .nth(1)
        .and_then(|s| s.split([',', ' ', '}']).next())
        .and_then(|s| s.parse().ok())
        .expect("the store's Debug shows its slots")
}

/// Keys removed and added for ever at a steady count (a table at its cap, churning): the table
/// stays within a few times the keys held throughout, and once no check is running (other tests'
/// threads may hold off a grace period for a while), only the values held are alive.
#[test]
fn churn_at_a_steady_count_stays_bounded() {
    let alive = Arc::new(AtomicUsize::new(0));
    let store: FlatStore<u64, Counted> = FlatStore::with_hasher(KeyHasher::new());
    const HELD: u64 = 1_000;
    for key in 0..200_000u64 {
        store.with_inserted(key, || Counted::new(key, &alive), |_, _| ());
        if key >= HELD {
            assert!(
                store
                    .change(&(key - HELD), |_, _| (Change::Remove, ()))
                    .is_some()
            );
        }
        assert!(
            slots(&store) <= 2048,
            "{} slots for {HELD} keys",
            slots(&store)
        );
    }
    let start = std::time::Instant::now();
    while alive.load(Relaxed) > HELD as usize && start.elapsed().as_secs() < 5 {
        store.shrink_to_fit();
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(
        alive.load(Relaxed),
        HELD as usize,
        "values alive after shrink_to_fit"
    );
}

/// Two threads check keys 0 to 63 (a burst of 100 000, a clock that never moves) while a third
/// adds 20 000 keys, growing the table seven times: each growth retires and copies the checked
/// entries under the checks. No admission is lost to a copy: for every key, the admissions
/// counted and the tokens it has left add up to its burst.
#[test]
fn checks_beside_growth_lose_no_admission() {
    const BURST: u32 = 100_000;
    let clock = ManualClock::new();
    let keyed = Arc::new(Keyed::with_store(
        FlatStore::with_hasher(KeyHasher::new()),
        1_000_000,
        KeyQuotas::Every(Quota::per_second(1).with_burst(BURST)),
        move |q| Gcra::with_clock(q, clock.clone()),
    ));
    for key in 0..64u64 {
        assert!(keyed.check_key_n(&key, 0).unwrap().is_allowed());
        let _ = keyed.check_key(&(key + 1_000_000));
    }
    let growing = Arc::new(AtomicBool::new(true));
    let grower = {
        let (keyed, growing) = (keyed.clone(), growing.clone());
        std::thread::spawn(move || {
            for key in 2_000_000..2_020_000u64 {
                let _ = keyed.check_key(&key);
            }
            growing.store(false, Relaxed);
        })
    };
    let checkers: Vec<_> = (0..2)
        .map(|_| {
            let (keyed, growing) = (keyed.clone(), growing.clone());
            std::thread::spawn(move || {
                let mut admitted = vec![0u64; 64];
                // Bounded: the burst runs out after BURST / 2 rounds of two threads.
                while growing.load(Relaxed) {
                    for key in 0..64u64 {
                        admitted[key as usize] += u64::from(keyed.check_key(&key).is_allowed());
                    }
                }
                admitted
            })
        })
        .collect();
    grower.join().unwrap();
    let mut total = vec![0u64; 64];
    for c in checkers {
        for (t, a) in total.iter_mut().zip(c.join().unwrap()) {
            *t += a;
        }
    }
    assert!(
        total.iter().all(|&t| t > 0),
        "every key was admitted: {total:?}"
    );
    for (key, admitted) in total.iter().enumerate() {
        let left = keyed.check_key_n(&(key as u64), 0).unwrap().remaining();
        assert_eq!(
            admitted + left,
            u64::from(BURST),
            "key {key}: {admitted} admitted, {left} left"
        );
    }
}

/// A key whose `Hash` panics, as a caller's key might, at the hash that counts `PANIC_AT` down
/// to zero.
#[derive(Clone, PartialEq, Eq)]
struct Fragile(u64);

static PANIC_AT: AtomicUsize = AtomicUsize::new(usize::MAX);

impl std::hash::Hash for Fragile {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        if PANIC_AT.fetch_sub(1, Relaxed) == 1 {
            panic!("the key's Hash panicked");
        }
        self.0.hash(state);
    }
}

/// A growth whose key hashing panics part way (a caller's `Hash`) leaves the store as it was:
/// every key is still found, once, in the published table; the growth succeeds later; and once
/// grace periods pass, only the values held are alive (no copy left in an abandoned table).
#[test]
fn a_panicking_hash_during_growth_leaves_the_store_whole() {
    let alive = Arc::new(AtomicUsize::new(0));
    let store: FlatStore<Fragile, Counted> = FlatStore::with_hasher(KeyHasher::new());
    // 224 keys fill the smallest table, 256 slots, to seven eighths: the 225th grows it, hashing
    // the 224 again. (Under Miri the table starts at 16 slots and is 256 by then, as full.)
    const FULL: u64 = 224;
    const NEW: u64 = 1_000;
    for key in 0..FULL {
        store.with_inserted(Fragile(key), || Counted::new(key, &alive), |_, _| ());
    }
    let before = format!("{store:?}");
    let moves = |key| store.with_existing(&Fragile(key), |v, _| v.moves);
    let moved_before: Vec<_> = (0..FULL).map(moves).collect();
    // The new key is hashed once or twice before the growth: the 8th hash is the growth's,
    // after it has hashed (and, before the fix, copied) at least five entries.
    PANIC_AT.store(8, Relaxed);
    let grown = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        store.with_inserted(Fragile(NEW), || Counted::new(NEW, &alive), |_, _| ())
    }));
    PANIC_AT.store(usize::MAX, Relaxed);
    assert!(grown.is_err(), "the growth hashed and panicked");
    assert_eq!(format!("{store:?}"), before, "the table is the one before");
    for key in 0..FULL {
        let was = moved_before[key as usize];
        assert_eq!(moves(key), was, "key {key} is where it was, not moved");
    }
    let (_, inserted) = store.with_inserted(Fragile(NEW), || Counted::new(NEW, &alive), |_, _| ());
    assert!(inserted, "the growth succeeds once the key hashes");
    for key in 0..FULL {
        let was = moved_before[key as usize].expect("held");
        assert_eq!(moves(key), Some(was + 1), "key {key} moved once");
    }
    assert_eq!(moves(NEW), Some(0), "the new key placed once");
    let held = FULL as usize + 1;
    let start = std::time::Instant::now();
    while alive.load(Relaxed) > held && start.elapsed().as_secs() < 5 {
        store.shrink_to_fit();
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(alive.load(Relaxed), held, "values alive: only those held");
}
