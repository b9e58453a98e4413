//! The keyed subjects: ours on each store, governor's keyed limiter, and the floors beside
//! them, each a loop over one thread's range of keys.

use super::{Kind, Subject, coarse, governor_coarse_clock, nz, open_quota, subject};
use atomic_limiter::keyed::{FlatStore, KeyHasher, KeyedStore, LockFreeStore, Relocate, Retired};
use atomic_limiter::{Gcra, QuantaClock, Quota};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

impl Subject {
    /// Creates the `keys` keys of a thread's range (keyed subjects): range 0 is the keys of the
    /// runs on one thread, range 1 those of the second thread on distinct keys. They are created
    /// in an order of their own, unrelated to the order the timed runs visit them in
    /// ([`KeyCycle`]), which is made here too, outside any timing.
    pub fn run_keys_warm(&self, keys: u64, range: u64) {
        INSERTING.with(|r| r.set(Some(range)));
        black_box((self.run)(keys));
        INSERTING.with(|r| r.set(None));
        timed_order(range, keys);
    }
}

/// This thread's key range, 0 or 1: two threads started together get consecutive numbers, so
/// distinct ranges, and later threads reuse the ranges (and the keys already created in them).
fn thread_index() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    thread_local! {
        static INDEX: u64 = NEXT.fetch_add(1, Ordering::Relaxed) % 2;
    }
    INDEX.with(|i| *i)
}

/// This thread's keys, `base .. base + keys`, each once per round in a shuffled order, as requests
/// from many clients arrive. The keys were created in another shuffled order
/// ([`Subject::run_keys_warm`]): a store that allocates each entry on its own lays them out in
/// memory in the order they were created, and visited in that same order it would read memory
/// almost in sequence, which the hardware prefetches (measured: the lock-free store's check at
/// 100 000 keys took about a third of its time in an unrelated order). The order is worked out once
/// per key range and count, when the keys are created, and shared by every thread that runs over
/// that range. A shuffle made inside a timed run would be counted: on two threads in every run
/// (each run starts threads of its own; 0.3 to 1 ms at 100 000 keys), and on one thread in the
/// first run of the first subject, the one that sets how long its runs are. Each run goes on where
/// the thread's last run stopped, so that runs shorter than a round still visit every key in turn
/// rather than the first few again. A step reads the next key from the order (no division: a `%`
/// per step would cost both subjects several nanoseconds, and compress their ratio towards 1).
struct KeyCycle {
    order: Arc<[u64]>,
    i: usize,
    /// Creating the keys: a one-off order, not the timed runs' (its position is not kept).
    inserting: bool,
}

thread_local! {
    /// The key range being created by [`Subject::run_keys_warm`] on this thread, if any.
    static INSERTING: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// `base .. base + keys`, shuffled by Fisher-Yates on a fixed xorshift sequence from `seed`: the
/// same order every run.
pub fn shuffled(base: u64, keys: u64, seed: u64) -> Vec<u64> {
    let mut order: Vec<u64> = (base..base + keys).collect();
    let mut x = seed;
    for i in (1..order.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    order
}

/// The timed runs' order over key range `range` of `keys` keys: made on first asking, then
/// shared.
fn timed_order(range: u64, keys: u64) -> Arc<[u64]> {
    /// An order made: its range, its key count, the order.
    type Made = (u64, u64, Arc<[u64]>);
    static ORDERS: Mutex<Vec<Made>> = Mutex::new(Vec::new());
    let mut orders = ORDERS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, _, order)) = orders.iter().find(|(r, k, _)| (*r, *k) == (range, keys)) {
        return order.clone();
    }
    let order: Arc<[u64]> = Arc::from(shuffled(range * keys, keys, 0x9e37_79b9_7f4a_7c15));
    orders.push((range, keys, order.clone()));
    order
}

thread_local! {
    /// The order this thread ran over last (its key count, the order) and where its last run
    /// stopped in it.
    static CYCLE: std::cell::RefCell<(u64, Arc<[u64]>, usize)> =
        std::cell::RefCell::new((0, Arc::from(Vec::new()), 0));
}

impl KeyCycle {
    fn new(keys: u64) -> KeyCycle {
        if let Some(range) = INSERTING.with(|r| r.get()) {
            return KeyCycle {
                order: Arc::from(shuffled(range * keys, keys, 0x2545_f491_4f6c_dd1d)),
                i: 0,
                inserting: true,
            };
        }
        CYCLE.with(|c| {
            let mut c = c.borrow_mut();
            if c.0 != keys || c.1.is_empty() {
                *c = (keys, timed_order(thread_index(), keys), 0);
            }
            KeyCycle {
                order: c.1.clone(),
                i: c.2,
                inserting: false,
            }
        })
    }

    #[inline]
    fn next(&mut self) -> u64 {
        let key = self.order[self.i];
        self.i += 1;
        if self.i == self.order.len() {
            self.i = 0;
        }
        key
    }
}

impl Drop for KeyCycle {
    fn drop(&mut self) {
        if !self.inserting {
            CYCLE.with(|c| c.borrow_mut().2 = self.i);
        }
    }
}

/// Keyed limiters checked over `keys` keys already present (each thread on its own range of keys),
/// ours against governor's keyed limiter, both with a quota nothing hits.
pub fn keyed_subjects(keys: u64) -> Vec<Subject> {
    let q = open_quota();
    let gov_q = governor_open_quota();
    // The default store (on the default clock: `default_store_loop`).
    let ours_coarse = atomic_limiter::Keyed::gcra_with_clock(q, 1 << 24, coarse());
    // The other stores: dashmap (a shard's read lock a lookup) and papaya (no lock).
    let dash = table_on(
        dashmap::DashMap::with_hasher(KeyHasher::new()),
        q,
        QuantaClock::new(),
    );
    let free = table_on(
        LockFreeStore::with_hasher(KeyHasher::new()),
        q,
        QuantaClock::new(),
    );
    let free_coarse = table_on(LockFreeStore::with_hasher(KeyHasher::new()), q, coarse());
    let clock = QuantaClock::new();
    // Every key on the same quota, but through the quota function's path (one more lookup's
    // worth of work only when a key is new; the check builds its decision under the shard lock).
    let ours_fn = atomic_limiter::Keyed::<u64, Gcra>::with_quota_fn(
        1 << 24,
        move |_| q,
        move |q| Gcra::with_clock(q, clock.clone()),
    );
    let gov_coarse = governor::RateLimiter::dashmap_with_clock(gov_q, governor_coarse_clock());
    // Batches of checks through one pinned handle of the lock-free store.
    let free_pinned = table_on(
        LockFreeStore::with_hasher(KeyHasher::new()),
        q,
        QuantaClock::new(),
    );
    let free_pinned_coarse = table_on(LockFreeStore::with_hasher(KeyHasher::new()), q, coarse());
    vec![
        // The least an atomic check does on the default store: one compare-and-swap on the
        // key's word under the shard's read lock, as an admission makes (no decision).
        word_floor("floor: clock read + dashmap get + CAS", keys, take_word),
        // The same without the CAS: the word read only.
        word_floor("floor: clock read + dashmap get", keys, |w, now| {
            black_box(w.load(Ordering::Relaxed)) <= now
        }),
        // The same on a table made for one-word keys instead of dashmap: no lock.
        probe_floor("floor: clock read + lock-free probe + CAS", keys),
        // The default store's own lookup, its slots holding a bare word instead of an entry.
        flat_floor("floor: clock read + default store lookup + CAS", keys),
        default_store_loop(keys),
        keyed_loop(
            "Keyed<u64, Gcra>, dashmap store",
            Kind::Ours,
            keys,
            move |k| black_box(&dash).check_key(k).is_allowed(),
        ),
        keyed_loop(
            "Keyed<u64, Gcra>, lock-free store",
            Kind::Ours,
            keys,
            move |k| black_box(&free).check_key(k).is_allowed(),
        ),
        pinned_loop("Keyed<u64, Gcra>, pinned handle", keys, free_pinned),
        keyed_loop(
            "Keyed<u64, Gcra> + CoarseClock",
            Kind::Ours,
            keys,
            move |k| black_box(&ours_coarse).check_key(k).is_allowed(),
        ),
        keyed_loop(
            "Keyed<u64, Gcra> + CoarseClock, lock-free store",
            Kind::Ours,
            keys,
            move |k| black_box(&free_coarse).check_key(k).is_allowed(),
        ),
        pinned_loop(
            "Keyed<u64, Gcra> + CoarseClock, pinned handle",
            keys,
            free_pinned_coarse,
        ),
        keyed_loop(
            "Keyed<u64, Gcra>, quota function",
            Kind::Ours,
            keys,
            move |k| black_box(&ours_fn).check_key(k).is_allowed(),
        ),
        governor_loop(keys),
        keyed_loop(
            "governor keyed check_key + coarse clock",
            Kind::Peer,
            keys,
            move |k| black_box(&gov_coarse).check_key(k).is_ok(),
        ),
    ]
}

/// The keyed subjects of a run over so many keys that every table outgrows the cache (a check
/// then waits on memory): ours on the default store, governor's keyed limiter, and the default
/// store's own lookup under them. One thread, one quota; no other store, so that the run's
/// memory stays a few hundred megabytes.
pub fn keyed_past_cache_subjects(keys: u64) -> Vec<Subject> {
    vec![
        flat_floor("floor: clock read + default store lookup + CAS", keys),
        default_store_loop(keys),
        governor_loop(keys),
    ]
}

/// Governor's quota nothing hits, as [`open_quota`] is ours.
pub fn governor_open_quota() -> governor::Quota {
    governor::Quota::per_second(nz(1_000_000_000)).allow_burst(nz(Quota::MAX_BURST))
}

/// Ours as a user gets it: `Keyed<u64, Gcra>` on the default store and clock.
fn default_store_loop(keys: u64) -> Subject {
    let ours = atomic_limiter::Keyed::<u64, Gcra>::gcra(open_quota(), 1 << 24);
    keyed_loop("Keyed<u64, Gcra>", Kind::Ours, keys, move |k| {
        black_box(&ours).check_key(k).is_allowed()
    })
}

/// Governor's keyed limiter on its default clock.
fn governor_loop(keys: u64) -> Subject {
    let gov = governor::RateLimiter::keyed(governor_open_quota());
    keyed_loop("governor keyed check_key", Kind::Peer, keys, move |k| {
        black_box(&gov).check_key(k).is_ok()
    })
}

/// A floor's admission on a key's word: one CAS to the reading, with the orderings an admission
/// uses, deciding nothing.
#[inline(always)]
pub fn take_word(w: &AtomicU64, now: u64) -> bool {
    let seen = w.load(Ordering::Acquire);
    w.compare_exchange(seen, now, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
}

/// A floor of a check on the default store: `keys` keys in one loop, on a dashmap of its own
/// with the same hasher and a word per key, each check the lookup of the key's word, the clock
/// read under the shard's lock (where the check reads it: read before the lookup, the same loop
/// took 2.5 ns longer at one key on a 2-core host) and `on_word` on that word with the reading.
/// A key not there yet gets its word and counts as refused.
fn word_floor(
    name: &'static str,
    keys: u64,
    on_word: impl Fn(&AtomicU64, u64) -> bool + Send + Sync + 'static,
) -> Subject {
    let words: dashmap::DashMap<u64, AtomicU64, _> =
        dashmap::DashMap::with_hasher(atomic_limiter::keyed::KeyHasher::new());
    let clock = QuantaClock::new();
    keyed_loop(name, Kind::Floor, keys, move |k| {
        use atomic_limiter::Clock;
        match words.get(k) {
            Some(w) => on_word(&w, clock.now()),
            None => {
                words.insert(*k, AtomicU64::new(0));
                false
            }
        }
    })
}

/// What a store made for `u64` keys could reach, where dashmap's shard lock bounds the default
/// store: a probe of open-addressed 16-byte slots (the key and its state word in one cache line)
/// that takes no lock, a clock read and one CAS on the word, deciding nothing. It is a floor, not
/// a store: it never evicts, moves or removes a key, and takes no other key type.
fn probe_floor(name: &'static str, keys: u64) -> Subject {
    #[repr(align(16))]
    struct Slot {
        key: AtomicU64,
        word: AtomicU64,
    }
    const EMPTY: u64 = u64::MAX;
    // Room for two threads' keys at half load at most, so that probes stay short; and at
    // least 256 cache lines, so that two threads' single keys seldom share one.
    let cap = usize::try_from((4 * keys).next_power_of_two().max(1024)).expect("a bench's size");
    let slots: Box<[Slot]> = (0..cap)
        .map(|_| Slot {
            key: AtomicU64::new(EMPTY),
            word: AtomicU64::new(0),
        })
        .collect();
    let hasher = atomic_limiter::keyed::KeyHasher::new();
    let clock = QuantaClock::new();
    keyed_loop(name, Kind::Floor, keys, move |k| {
        use atomic_limiter::Clock;
        let mask = slots.len() - 1;
        // Truncated on 32-bit targets: a slot index needs only the low bits.
        let mut i = hasher.hash_one(k) as usize & mask;
        loop {
            let s = &slots[i];
            // Acquire: pairs with the claim's CAS; the key is all a slot publishes.
            let seen = s.key.load(Ordering::Acquire);
            if seen == *k {
                return take_word(&s.word, clock.now());
            }
            if seen == EMPTY {
                // A key first seen claims the slot, unless a thread claimed it first (for this
                // key: done; for another: probe on). AcqRel/Acquire: publishes the key, and
                // reads a rival's.
                match s
                    .key
                    .compare_exchange(EMPTY, *k, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => return false,
                    Err(other) if other == *k => return false,
                    Err(_) => {}
                }
            }
            i = (i + 1) & mask;
        }
    })
}

/// A bare state word, as a floor's value in the default store: moved by a plain copy (the floor
/// grows its table only while its keys are created, with no check running).
pub struct Word(pub AtomicU64);

impl Relocate for Word {
    fn relocate(&self, _: &Retired) -> Word {
        Word(AtomicU64::new(self.0.load(Ordering::Relaxed)))
    }
}

/// What the default store itself costs a check: its lookup (a check section, the probe of its
/// 32-byte slots by tag and key, the retired flag), a clock read made while the slot is fetched,
/// as a check's is, and one CAS on the word found, deciding nothing. Its slots hold a bare word
/// where the default store's hold an entry (the word and the key's limiter); slot size, load and
/// growth are the store's own.
fn flat_floor(name: &'static str, keys: u64) -> Subject {
    let store: FlatStore<u64, Word> = FlatStore::with_hasher(KeyHasher::new());
    let clock = QuantaClock::new();
    keyed_loop(name, Kind::Floor, keys, move |k| {
        use atomic_limiter::Clock;
        store
            .with_existing_after(k, || clock.now(), |w, _, now| take_word(&w.0, now))
            .unwrap_or_else(|| {
                store.with_inserted(*k, || Word(AtomicU64::new(0)), |_, _| ());
                false
            })
    })
}

/// GCRA per key on `clock`, in `store`.
fn table_on<S, C>(store: S, q: Quota, clock: C) -> atomic_limiter::Keyed<u64, Gcra<C>, S>
where
    S: atomic_limiter::keyed::KeyedStore<u64, atomic_limiter::keyed::KeyEntry<Gcra<C>>>,
    C: atomic_limiter::Clock + Clone + Send + Sync + 'static,
{
    atomic_limiter::Keyed::with_store(
        store,
        1 << 24,
        atomic_limiter::KeyQuotas::Every(q),
        move |q| Gcra::with_clock(q, clock.clone()),
    )
}

/// A keyed subject through one pinned handle a run (a batch of checks on one thread), as a caller
/// would hold it.
fn pinned_loop<C: atomic_limiter::Clock + Clone + Send + Sync + 'static>(
    name: &'static str,
    keys: u64,
    table: atomic_limiter::Keyed<
        u64,
        Gcra<C>,
        atomic_limiter::keyed::LockFreeStore<u64, atomic_limiter::keyed::KeyEntry<Gcra<C>>>,
    >,
) -> Subject {
    subject(name, Kind::Ours, move |iters| {
        let mut key = KeyCycle::new(keys);
        let mut pinned = black_box(&table).pinned();
        let mut ok = 0;
        for _ in 0..iters {
            ok += pinned.check_key(&key.next()).is_allowed() as u64;
        }
        ok
    })
}

/// A keyed subject: `iters` checks over this thread's `keys` keys in turn.
fn keyed_loop(
    name: &'static str,
    kind: Kind,
    keys: u64,
    check: impl Fn(&u64) -> bool + Send + Sync + 'static,
) -> Subject {
    subject(name, kind, move |iters| {
        let mut key = KeyCycle::new(keys);
        let mut ok = 0;
        for _ in 0..iters {
            ok += check(&key.next()) as u64;
        }
        ok
    })
}
