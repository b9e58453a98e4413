//! Memory of keyed limiters on each store (the default, dashmap, and the lock-free store), measured with a
//! counting global allocator: bytes per key at a million keys, and the peak during a flood of ten
//! million distinct keys through a capped map. Without `ATOMIC_LIMITER_LONG_TESTS` every count is
//! a quarter as large (a map then fills its table to the same share, so the bytes per key and the
//! peak per cap slot are held to the same figures).
// A counting global allocator is an `unsafe impl`: the crate denies `unsafe` elsewhere.
#![allow(unsafe_code)]

use atomic_limiter::keyed::{FlatStore, KeyEntry, KeyHasher, KeyedStore, LockFreeStore};
use atomic_limiter::{Gcra, KeyQuotas, Keyed, ManualClock, Quota};
use dashmap::DashMap;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: defers every call to the system allocator unchanged; only counts the bytes live.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract for `dealloc` is passed on as is.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            let grow = new_size - layout.size();
            let live = LIVE.fetch_add(grow, Ordering::Relaxed) + grow;
            PEAK.fetch_max(live, Ordering::Relaxed);
        } else {
            LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract for `realloc` is passed on as is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

type Entry = KeyEntry<Gcra<ManualClock>>;

#[path = "common/long.rs"]
mod long;

/// The keys of the full-size runs, a quarter of them in the quick form.
fn keys(full: u64) -> u64 {
    long::sized(full, full / 4)
}

/// A store a table can be built on, and the figures it is held to.
trait Store: KeyedStore<u64, Entry> + Send + Sync + Sized + 'static {
    /// An empty store.
    fn empty() -> Self;
    /// The most bytes a key may take at a million keys.
    const PER_KEY: f64;
    /// The most bytes at the peak of a flood through a cap of a million keys.
    const FLOOD_PEAK: usize;
}

impl Store for FlatStore<u64, Entry, KeyHasher> {
    fn empty() -> Self {
        FlatStore::with_hasher(KeyHasher::new())
    }
    // A slot of 32 bytes (key, state, `Arc`, retired flag) and a byte of tag, in a table kept
    // between 3/8 and 7/8 full (growth doubles it); the eviction index as on dashmap.
    const PER_KEY: f64 = 100.0;
    // Under churn at the cap, a growth copies the live keys to a new table while the old one is
    // kept until its grace period ends: two tables at once.
    const FLOOD_PEAK: usize = 170 * 1_000_000;
}

impl Store for DashMap<u64, Entry, KeyHasher> {
    fn empty() -> Self {
        DashMap::with_hasher(KeyHasher::new())
    }
    // The map's entry and the key's state take about 52 bytes; the eviction index (a heap of
    // `(instant, key)` that grows by a quarter at a time) 16 to 20 more.
    const PER_KEY: f64 = 76.0;
    const FLOOD_PEAK: usize = 80 * 1_000_000;
}

impl Store for LockFreeStore<u64, Entry, KeyHasher> {
    fn empty() -> Self {
        LockFreeStore::with_hasher(KeyHasher::new())
    }
    // Each entry an allocation of its own (the key, the state, the retired flag and the
    // reclamation's header) behind a slot of the table, which grows by doubling; the eviction
    // index as on dashmap.
    const PER_KEY: f64 = 96.0;
    const FLOOD_PEAK: usize = 100 * 1_000_000;
}

/// A keyed GCRA on the store `M`, every key on `quotas`, on `clock`.
fn table<M: Store>(
    max_keys: usize,
    quotas: KeyQuotas<u64>,
    clock: &ManualClock,
) -> Keyed<u64, Gcra<ManualClock>, M> {
    let clock = clock.clone();
    Keyed::with_store(M::empty(), max_keys, quotas, move |q| {
        Gcra::with_clock(q, clock.clone())
    })
}

/// A keyed GCRA whose quota function gives every key a quota of its own.
fn a_quota_per_key<M: Store>(
    max_keys: usize,
    clock: &ManualClock,
) -> Keyed<u64, Gcra<ManualClock>, M> {
    let quotas = KeyQuotas::PerKey(Box::new(|k: &u64| Quota::per_second(1 + k % 1_000_000_000)));
    table(max_keys, quotas, clock)
}

/// Runs `f`, and answers what it returned and the most bytes that were live, above those live at
/// the start, while it ran.
fn peak_during<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let r = f();
    (r, PEAK.load(Ordering::Relaxed) - base)
}

/// One test, so that no other test's allocations are counted in between.
#[test]
fn memory_per_key_and_under_a_flood() {
    memory_on::<FlatStore<u64, Entry, KeyHasher>>("the default store");
    memory_on::<DashMap<u64, Entry, KeyHasher>>("dashmap");
    memory_on::<LockFreeStore<u64, Entry, KeyHasher>>("the lock-free store");
    pinned_flood();
}

fn memory_on<M: Store>(store: &str) {
    println!("{store}:");
    // A million keys (u64), GCRA on a shared manual clock.
    let n = keys(1_000_000);
    let before = LIVE.load(Ordering::Relaxed);
    let keyed = table::<M>(
        2 * n as usize,
        KeyQuotas::Every(Quota::per_second(10)),
        &ManualClock::new(),
    );
    for key in 0..n {
        assert!(keyed.check_key(&key).is_allowed());
    }
    let per_key = (LIVE.load(Ordering::Relaxed) - before) as f64 / n as f64;
    println!("  bytes per key at {n} keys: {per_key:.1}");
    assert!(per_key < M::PER_KEY, "{store}: {per_key} bytes per key");
    drop(keyed);

    // Ten million distinct keys through a map capped at a million; buckets full 1 ms after use.
    let clock = ManualClock::new();
    let cap = n as usize;
    let (keyed, peak) = peak_during(|| {
        let keyed = table::<M>(
            cap,
            KeyQuotas::Every(Quota::per_second(1000).with_burst(1)),
            &clock,
        );
        for key in 0..10 * n {
            let _ = keyed.check_key(&key);
            clock.advance_nanos(1_000);
        }
        keyed
    });
    println!(
        "  flood of {} keys, cap {cap}: {} keys held, peak {:.1} MB ({:.1} bytes per cap slot)",
        10 * n,
        keyed.len(),
        peak as f64 / 1e6,
        peak as f64 / cap as f64
    );
    assert!(keyed.len() <= cap);
    let allowed = M::FLOOD_PEAK / 1_000_000 * cap;
    assert!(
        peak < allowed,
        "{store}: peak {peak} bytes for a cap of {cap} keys"
    );
    drop(keyed);

    // A quota function that gives every key its own quota, through a cap of 1000: only the
    // limiters of held keys are kept (this grew by 204 MiB over a million keys when every
    // distinct quota's limiter was kept forever).
    let clock = ManualClock::new();
    let (keyed, peak) = peak_during(|| {
        let keyed = a_quota_per_key::<M>(1000, &clock);
        for key in 0..keys(300_000) {
            let _ = keyed.check_key(&key);
            clock.advance_nanos(1_000_000);
        }
        keyed
    });
    println!(
        "  {} keys with distinct quotas, cap 1000: peak {:.2} MB",
        keys(300_000),
        peak as f64 / 1e6
    );
    assert!(
        peak < 2_000_000,
        "{store}: peak {peak} bytes for a cap of 1000 keys"
    );
    drop(keyed);

    // Refused keys allocate nothing: a frozen clock, a full table of 10, half a million new keys
    // with distinct quotas, all refused.
    let clock = ManualClock::new();
    let keyed = a_quota_per_key::<M>(10, &clock);
    for key in 0..10u64 {
        assert!(keyed.check_key(&key).is_allowed());
    }
    let ((), grown) = peak_during(|| {
        for key in 10..10 + keys(500_000) {
            assert!(keyed.check_key(&key).is_table_full());
        }
    });
    println!(
        "  {} refused keys: {grown} bytes allocated at the peak",
        keys(500_000)
    );
    assert!(grown < 4096, "{store}: {grown} bytes for refused keys");
}

/// A flood through one pinned handle held for all of it: the handle renews its pin as it goes, so
/// the entries it evicts are freed, and the peak is within a quarter of the same flood's through
/// `check_key` (a million keys through a cap of 100 000).
fn pinned_flood() {
    let plain = flood_peak(false);
    let pinned = flood_peak(true);
    println!(
        "the lock-free store, a flood of {} keys through a cap of {}:\n  \
         peak {:.1} MB through check_key, {:.1} MB through one pinned handle",
        keys(1_000_000),
        keys(100_000),
        plain as f64 / 1e6,
        pinned as f64 / 1e6
    );
    assert!(
        pinned < plain + plain / 4,
        "pinned: peak {pinned} bytes, against {plain} through check_key"
    );
}

/// The peak of a flood of a million keys through a cap of 100 000 on the lock-free store,
/// through one pinned handle or through `check_key`.
fn flood_peak(through_pinned: bool) -> usize {
    type Free = LockFreeStore<u64, Entry, KeyHasher>;
    let clock = ManualClock::new();
    let (keyed, peak) = peak_during(|| {
        let keyed = table::<Free>(
            keys(100_000) as usize,
            KeyQuotas::Every(Quota::per_second(1000).with_burst(1)),
            &clock,
        );
        // No handle at all for `check_key`: one held idle would keep every evicted entry.
        let mut pinned = through_pinned.then(|| keyed.pinned());
        for key in 0..keys(1_000_000) {
            let _ = match &mut pinned {
                Some(pinned) => pinned.check_key(&key),
                None => keyed.check_key(&key),
            };
            clock.advance_nanos(1_000);
        }
        drop(pinned);
        keyed
    });
    assert!(keyed.len() <= keys(100_000) as usize);
    peak
}
