// The tests of `Keyed`, run on each store: `tests/keyed.rs` on the default store (`FlatStore`),
// `tests/keyed_dashmap.rs` on dashmap, `tests/keyed_lock_free.rs` on the lock-free store. The including file names the store (`Store`, `store()`).

use atomic_limiter::keyed::{Change, KeyEntry, KeyHasher, KeyedStore, Retired};
use atomic_limiter::{
    Clock, Decision, Gcra, InsufficientCapacity, KeyQuotas, Keyed, KeyedLimiter, ManualClock, Quota, RateLimiter,
    TokenBucket,
};
use proptest::prelude::*;

#[path = "../common/long.rs"]
mod long;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Barrier;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::thread;
use std::time::Duration;

/// A table on this file's store.
type Table<K, L> = Keyed<K, L, Store<K, KeyEntry<L>>>;

/// Every key on `quota`, GCRA on `clock`.
fn gcra_table<K: std::hash::Hash + Eq + Clone + Send + Sync + 'static>(
    quota: Quota,
    cap: usize,
    clock: ManualClock,
) -> Table<K, Gcra<ManualClock>> {
    quota_table(quota, cap, move |q| Gcra::with_clock(q, clock.clone()))
}

/// Every key on `quota`, a token bucket on `clock`.
fn bucket_table<K: std::hash::Hash + Eq + Clone + Send + Sync + 'static>(
    quota: Quota,
    cap: usize,
    clock: ManualClock,
) -> Table<K, TokenBucket<ManualClock>> {
    quota_table(quota, cap, move |q| TokenBucket::with_clock(q, clock.clone()))
}

/// Every key on `quota`, each key's limiter made by `make`.
fn quota_table<K: std::hash::Hash + Eq + Clone + Send + Sync + 'static, L: KeyedLimiter>(
    quota: Quota,
    cap: usize,
    make: impl Fn(Quota) -> L + Send + Sync + 'static,
) -> Table<K, L> {
    Keyed::with_store(store(), cap, KeyQuotas::Every(quota), make)
}

/// Each key on the quota `quota_for` gives it.
fn fn_table<K: std::hash::Hash + Eq + Clone + Send + Sync + 'static, L: KeyedLimiter>(
    cap: usize,
    quota_for: impl Fn(&K) -> Quota + Send + Sync + 'static,
    make: impl Fn(Quota) -> L + Send + Sync + 'static,
) -> Table<K, L> {
    Keyed::with_store(store(), cap, KeyQuotas::PerKey(Box::new(quota_for)), make)
}

/// 10 million distinct keys (1 million without `ATOMIC_LIMITER_LONG_TESTS`), the clock moving
/// 1 µs per request (buckets fill again 1 ms after their last use), through a map capped at
/// 100 000: it never holds more, and keeps admitting.
#[test]
fn a_flood_of_ten_million_distinct_keys_stays_within_the_cap() {
    let clock = ManualClock::new();
    let cap = 100_000;
    let keys = long::sized(10_000_000u64, 1_000_000);
    let keyed = gcra_table(Quota::per_second(1000).with_burst(2), cap, clock.clone());
    let mut admitted = 0u64;
    for key in 0..keys {
        admitted += keyed.check_key(&key).is_allowed() as u64;
        assert!(keyed.len() <= cap, "{} keys held, cap {cap}", keyed.len());
        clock.advance_nanos(1_000);
    }
    // Every new key is admitted unless the map is at its cap with nothing full; with buckets full
    // 1 ms after use, at most a small share is refused.
    assert!(admitted > keys / 10 * 9, "only {admitted} of {keys} admitted");
}

/// Keys cycling over three times the cap, so each comes back 300 ms later after being evicted:
/// none is ever admitted beyond its own quota (2 million requests; 400 000 without
/// `ATOMIC_LIMITER_LONG_TESTS`, each key still evicted and back more than ten times).
#[test]
fn evicted_keys_that_come_back_are_never_over_admitted() {
    let clock = ManualClock::new();
    let cap = 10_000;
    let keyed = gcra_table(Quota::per_second(1000).with_burst(2), cap, clock.clone());
    let key_space = 3 * cap as u64;
    let mut seen: HashMap<u64, (u64, u64)> = HashMap::new();
    for i in 0..long::sized(2_000_000u64, 400_000) {
        let key = i % key_space;
        // Two requests at once now and then, to drain buckets before they are evicted.
        for _ in 0..1 + (i / key_space) % 2 {
            if keyed.check_key(&key).is_allowed() {
                let now = clock.now();
                let (since, admitted) = seen.entry(key).or_insert((now, 0));
                *admitted += 1;
                let bound = 2 + (now - *since) * 1000 / 1_000_000_000;
                assert!(
                    *admitted <= bound,
                    "key {key}: {admitted} admitted, bound {bound}"
                );
            }
        }
        assert!(keyed.len() <= cap);
        clock.advance_nanos(1_000);
    }
}

/// On a frozen clock no bucket ever fills again: at the cap, new keys are refused, not admitted.
#[test]
fn at_the_cap_with_nothing_full_new_keys_are_refused() {
    let keyed = gcra_table(Quota::per_second(10), 1000, ManualClock::new());
    let admitted = (0..100_000u32)
        .filter(|k| keyed.check_key(k).is_allowed())
        .count();
    assert_eq!(admitted, 1000);
    assert_eq!(keyed.len(), 1000);
    let refused = keyed.check_key(&123_456);
    assert!(refused.is_denied());
}

/// Threads racing to create the same key share one bucket: exactly the burst is admitted.
#[test]
fn racing_first_checks_share_one_bucket() {
    let threads = 2 * thread::available_parallelism().map_or(2, |n| n.get());
    for round in 0..200u32 {
        let keyed =
            gcra_table(Quota::per_second(1).with_burst(3), 10, ManualClock::new());
        let barrier = Barrier::new(threads);
        let admitted: usize = thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        (0..3)
                            .filter(|_| keyed.check_key(&round).is_allowed())
                            .count()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(admitted, 3, "round {round}");
        assert_eq!(keyed.len(), 1);
    }
}

/// Threads racing to create the one key a table has room for: none is told the table is full
/// (a 503 for a service's first concurrent requests), whichever of them inserts it. The same at
/// the cap with a full bucket to evict: the key that takes its place is not refused to the others.
#[test]
fn racing_first_checks_of_the_only_key_that_fits_are_never_told_the_table_is_full() {
    let threads = 2 * thread::available_parallelism().map_or(2, |n| n.get());
    for round in 0..300u32 {
        let clock = ManualClock::new();
        let keyed = gcra_table(Quota::per_second(1).with_burst(100), 1, clock.clone());
        if round % 2 == 1 {
            // The one place is held by a key whose bucket is full again: it must be evicted.
            assert!(keyed.check_key(&u32::MAX).is_allowed());
            clock.advance(Duration::from_secs(1));
        }
        let barrier = Barrier::new(threads);
        let full: usize = thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        usize::from(keyed.check_key(&round).is_table_full())
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(full, 0, "round {round}: told the table is full");
        assert_eq!(keyed.len(), 1);
    }
}

#[test]
fn shrink_frees_full_buckets_only() {
    let clock = ManualClock::new();
    let keyed = gcra_table(Quota::per_second(10).with_burst(1), 1000, clock.clone());
    for k in 0..500u32 {
        assert!(keyed.check_key(&k).is_allowed());
    }
    assert_eq!(keyed.shrink(), 0, "nothing is full yet");
    clock.advance_nanos(100_000_000);
    assert!(keyed.check_key(&0).is_allowed()); // key 0 drained again
    assert_eq!(keyed.shrink(), 499);
    assert_eq!(keyed.len(), 1);
}

/// What a check answered, in full.
type Figures = Option<(bool, u64, Duration, Duration)>;

fn figures(r: Result<Decision, InsufficientCapacity>) -> Figures {
    r.ok().map(|d| {
        (
            d.is_allowed(),
            d.remaining(),
            d.retry_after(),
            d.reset_after(),
        )
    })
}

/// Runs `ops` (key, tokens, then advance the clock) on a keyed limiter and on one standalone
/// limiter per key, all on `clock`; every answer must be the same, figures included.
fn same_as_one_limiter_per_key<L: RateLimiter>(
    ops: &[(u8, u32, u64)],
    clock: &ManualClock,
    keyed: impl Fn(&u8, u32) -> Result<Decision, InsufficientCapacity>,
    fresh: impl Fn() -> L,
) -> Result<(), TestCaseError> {
    let mut alone: HashMap<u8, L> = HashMap::new();
    for (i, &(key, n, advance)) in ops.iter().enumerate() {
        let got = figures(keyed(&key, n));
        let want = figures(alone.entry(key).or_insert_with(&fresh).check_n(n));
        prop_assert_eq!(got, want, "op {} (key {}, n {})", i, key, n);
        clock.advance(Duration::from_nanos(advance));
    }
    Ok(())
}

fn keyed_ops() -> impl Strategy<Value = Vec<(u8, u32, u64)>> {
    // Four keys; 0 to 5 tokens against a burst of 4 (so some requests are too big); up to 0.4 s
    // between checks at 10/s (so buckets drain, refill and fill up).
    proptest::collection::vec((0u8..4, 0u32..6, 0u64..400_000_000), 1..200)
}

proptest! {
    /// The keyed check works its decision out after the map's lock is released, from what the
    /// transition saw (a shared quota), or under the lock (a quota function): both must answer
    /// exactly what one standalone limiter per key answers.
    #[test]
    fn keyed_answers_are_those_of_one_limiter_per_key(ops in keyed_ops()) {
        let q = Quota::per_second(10).with_burst(4);
        let clock = ManualClock::new();
        let shared = gcra_table(q, 100, clock.clone());
        let c = clock.clone();
        same_as_one_limiter_per_key(&ops, &clock, |k, n| shared.check_key_n(k, n), || {
            Gcra::with_clock(q, c.clone())
        })?;

        let clock = ManualClock::new();
        let shared = bucket_table(q, 100, clock.clone());
        let c = clock.clone();
        same_as_one_limiter_per_key(&ops, &clock, |k, n| shared.check_key_n(k, n), || {
            TokenBucket::with_clock(q, c.clone())
        })?;

        let clock = ManualClock::new();
        let c = clock.clone();
        let by_fn = fn_table(100, move |_: &u8| q, move |q| Gcra::with_clock(q, c.clone()));
        let c = clock.clone();
        same_as_one_limiter_per_key(&ops, &clock, |k, n| by_fn.check_key_n(k, n), || {
            Gcra::with_clock(q, c.clone())
        })?;
    }
}

/// Cap 1600 at 1/s, every key drained, then one new key an hour: each gets in, because an old
/// bucket is full again by then. (Refusals used to back off by count, not time: 100 hours.)
#[test]
fn at_the_cap_a_new_key_gets_in_once_an_old_bucket_is_full_again() {
    let clock = ManualClock::new();
    let keyed = gcra_table(Quota::per_second(1), 1600, clock.clone());
    for k in 0..1600u64 {
        assert!(keyed.check_key(&k).is_allowed());
    }
    assert!(keyed.check_key(&1_000_000).is_table_full());
    for k in 0..200u64 {
        clock.advance(Duration::from_secs(3600));
        let d = keyed.check_key(&(2_000_000 + k));
        assert!(d.is_allowed(), "new key {k} refused an hour on");
        assert!(keyed.len() <= 1600);
    }
}

/// A new key refused at the cap waits the advertised retry-after and gets in, whatever the held
/// keys did in between (their buckets drained at different times, some used again).
#[test]
fn waiting_the_retry_after_of_a_full_table_lets_the_key_in() {
    let clock = ManualClock::new();
    let cap = 500u64;
    let keyed = gcra_table(
        Quota::per_second(10).with_burst(3),
        cap as usize,
        clock.clone(),
    );
    for k in 0..cap {
        for _ in 0..1 + k % 3 {
            assert!(keyed.check_key(&k).is_allowed());
        }
        clock.advance_nanos(7_919);
    }
    for round in 0..300u64 {
        let next_key = cap + round;
        // Some held keys are used again, so the index's instants go stale.
        for k in (round * 7..round * 7 + 5).map(|k| k % cap) {
            let _ = keyed.check_key(&k);
        }
        let d = keyed.check_key(&next_key);
        if d.is_denied() {
            assert!(
                d.is_table_full(),
                "round {round}: a new key refused by its own rate"
            );
            assert!(d.retry_after() > Duration::ZERO);
            clock.advance(d.retry_after());
            assert!(
                keyed.check_key(&next_key).is_allowed(),
                "round {round}: refused again after waiting {:?}",
                d.retry_after()
            );
        }
        assert!(keyed.len() <= cap as usize);
    }
}

#[test]
fn a_full_table_is_told_apart_and_a_peek_takes_no_place() {
    let keyed = gcra_table(Quota::per_second(1).with_burst(2), 1, ManualClock::new());
    assert!(keyed.check_key(&1).is_allowed());
    assert!(keyed.check_key(&1).is_allowed());
    let over_rate = keyed.check_key(&1);
    assert!(over_rate.is_denied() && !over_rate.is_table_full());
    let full = keyed.check_key(&2);
    assert!(full.is_denied() && full.is_table_full());
    assert_eq!(full.remaining(), 0);
    // A peek at a new key answers as a fresh bucket, takes no place and inserts nothing.
    let peek = keyed.check_key_n(&3, 0).unwrap();
    assert!(peek.is_allowed() && !peek.is_table_full());
    assert_eq!(peek.remaining(), 2);
    assert_eq!(keyed.len(), 1);
    assert!(
        keyed.check_key(&1).is_denied(),
        "key 1 is still held, drained"
    );
}

/// A map that counts lookups, to see how much of the map a new key at the cap looks at.
struct Counting<M> {
    map: M,
    lookups: Arc<AtomicU64>,
}

impl<K, V, M: KeyedStore<K, V>> KeyedStore<K, V> for Counting<M> {
    fn with_existing<Q, R>(&self, key: &Q, f: impl FnOnce(&V, Option<&Retired>) -> R) -> Option<R>
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        self.lookups.fetch_add(1, Relaxed);
        self.map.with_existing(key, f)
    }
    fn with_inserted<R>(
        &self,
        key: K,
        make: impl FnOnce() -> V,
        f: impl FnOnce(&V, Option<&Retired>) -> R,
    ) -> (R, bool) {
        self.map.with_inserted(key, make, f)
    }
    fn change<R>(
        &self,
        key: &K,
        f: impl FnOnce(&V, Option<&Retired>) -> (Change<V>, R),
    ) -> Option<R> {
        self.lookups.fetch_add(1, Relaxed);
        self.map.change(key, f)
    }
    fn keys(&self) -> Vec<K> {
        self.lookups.fetch_add(1 << 32, Relaxed); // a pass over the whole map
        self.map.keys()
    }
}

/// Steady churn: old buckets fill again at the rate new keys arrive, so each new key at the cap
/// finds about one full bucket. It looks at a handful of entries, never the whole map (a sweep
/// per new key used to cost 207 µs at 50 000 keys; `cargo bench --bench limiters keyed_churn`
/// measures the cost now).
#[test]
fn at_the_cap_under_steady_churn_a_new_key_looks_at_a_few_entries_not_the_map() {
    let clock = ManualClock::new();
    let cap = 20_000u64;
    let lookups = Arc::new(AtomicU64::new(0));
    let store = Counting {
        map: store(),
        lookups: lookups.clone(),
    };
    let c = clock.clone();
    let keyed = Keyed::with_store(
        store,
        cap as usize,
        KeyQuotas::Every(Quota::per_second(1)),
        move |q| Gcra::with_clock(q, c.clone()),
    );
    // Fill the table, one key per 1/cap s: key k is full again 1 s after its check.
    let step = 1_000_000_000 / cap;
    for k in 0..cap {
        assert!(keyed.check_key(&k).is_allowed());
        clock.advance_nanos(step);
    }
    let new_keys = 3 * cap;
    let before = lookups.load(Relaxed);
    let mut admitted = 0;
    for k in cap..cap + new_keys {
        admitted += u64::from(keyed.check_key(&k).is_allowed());
        clock.advance_nanos(step);
        assert!(keyed.len() <= cap as usize);
    }
    let per_new_key = (lookups.load(Relaxed) - before) as f64 / new_keys as f64;
    assert!(
        admitted >= new_keys - 2,
        "only {admitted} of {new_keys} admitted"
    );
    // Its own miss, then the front of the index looked up and removed: about 3.
    assert!(
        per_new_key < 5.0,
        "{per_new_key} map operations per new key"
    );
}

/// `len()` never reads more than the cap, not even for a moment, while threads insert new keys.
#[test]
fn len_never_exceeds_the_cap_under_threads() {
    let cap = 64;
    let keyed = gcra_table(Quota::per_second(1000), cap, ManualClock::new());
    let stop = std::sync::atomic::AtomicBool::new(false);
    thread::scope(|s| {
        let watcher = s.spawn(|| {
            let mut most = 0;
            while !stop.load(Relaxed) {
                most = most.max(keyed.len());
            }
            most
        });
        let inserters: Vec<_> = (0..3u64)
            .map(|t| {
                let keyed = &keyed;
                s.spawn(move || {
                    for k in 0..200_000u64 {
                        let _ = keyed.check_key(&(k * 3 + t));
                    }
                })
            })
            .collect();
        for h in inserters {
            h.join().unwrap();
        }
        stop.store(true, Relaxed);
        assert!(watcher.join().unwrap() <= cap);
    });
}

#[derive(Debug, Clone)]
enum Requota {
    Advance(u64),
    Check(u8, u32),
    /// Key `.0`'s configured quota becomes quota `.1` of the run's list, applied with `.2`.
    Set(u8, usize, atomic_limiter::Carry),
}

fn requota_run() -> impl Strategy<Value = (Vec<Quota>, Vec<Requota>)> {
    let quota = (1u64..=1_000_000, 1u64..=64, 1u32..=20)
        .prop_filter_map("quota rejected", |(per_us, rate, burst)| {
            Quota::try_new(rate, Duration::from_micros(per_us), burst).ok()
        });
    proptest::collection::vec(quota, 2..5).prop_flat_map(|quotas| {
        let count = quotas.len();
        let carry = prop_oneof![
            Just(atomic_limiter::Carry::Debt),
            Just(atomic_limiter::Carry::Proportional)
        ];
        let op = prop_oneof![
            2 => (0u64..=2_000_000).prop_map(Requota::Advance),
            5 => (0u8..4, 0u32..=21).prop_map(|(k, n)| Requota::Check(k, n)),
            2 => (0u8..4, 0..count, carry).prop_map(|(k, i, c)| Requota::Set(k, i, c)),
        ];
        (Just(quotas), proptest::collection::vec(op, 1..150))
    })
}

/// How a run's changes reach the table.
#[derive(Clone, Copy)]
enum Changes {
    /// The quota function's answer for one key changes; `requota` applies it to that key.
    PerKey,
    /// The table's one quota changes; `set_quota` applies it to every key (a change's key is
    /// ignored).
    Whole,
}

/// Runs a table through `ops` beside one reconfigurable limiter per key given the same changes:
/// every check must answer the same, figures included, and each change must say whether it
/// changed anything exactly when the limiters changed.
fn against_one_reconfigurable_per_key<A>(
    quotas: &[Quota],
    ops: &[Requota],
    changes: Changes,
) -> Result<(), TestCaseError>
where
    A: atomic_limiter::algorithm::Retunable + atomic_limiter::algorithm::Continuous + 'static,
{
    use atomic_limiter::{Limiter, Reconfigurable};
    use std::sync::Mutex;
    let clock = ManualClock::starting_at(1_000_000);
    let config = Arc::new(Mutex::new([0usize; 4]));
    let make = {
        let clock = clock.clone();
        move |q| Limiter::<A, ManualClock>::with_clock(q, clock.clone())
    };
    let quotas_for = quotas.to_vec();
    let table = match changes {
        Changes::PerKey => {
            let config = config.clone();
            fn_table(
                64,
                move |k: &u8| quotas_for[config.lock().unwrap()[usize::from(*k)]],
                make,
            )
        }
        Changes::Whole => quota_table(quotas[0], 64, make),
    };
    let mut each: HashMap<u8, Reconfigurable<A, ManualClock>> = HashMap::new();
    for op in ops {
        match *op {
            Requota::Advance(ns) => clock.advance_nanos(ns),
            Requota::Check(k, n) => {
                let q = quotas[config.lock().unwrap()[usize::from(k)]];
                if !each.contains_key(&k) && (n == 0 || n > q.burst()) {
                    // Neither takes a place: a peek at a key not held answers a full bucket, and
                    // a request above the burst is refused.
                    match table.check_key_n(&k, n) {
                        Ok(a) => {
                            prop_assert!(n == 0 && a.is_allowed());
                            prop_assert_eq!(a.remaining(), u64::from(q.burst()));
                        }
                        Err(_) => prop_assert!(n > q.burst()),
                    }
                    continue;
                }
                let one = each
                    .entry(k)
                    .or_insert_with(|| Reconfigurable::with_clock(q, clock.clone()));
                let (a, b) = (table.check_key_n(&k, n), one.check_n(n));
                prop_assert_eq!(a.is_err(), b.is_err(), "key {} n {}", k, n);
                if let (Ok(a), Ok(b)) = (a, b) {
                    prop_assert_eq!(a, b, "key {} n {}", k, n);
                }
            }
            Requota::Set(k, i, carry) => match changes {
                Changes::PerKey => {
                    config.lock().unwrap()[usize::from(k)] = i;
                    let expected = each.get(&k).is_some_and(|one| one.quota() != quotas[i]);
                    if expected {
                        each[&k].set_quota(quotas[i], carry);
                    }
                    prop_assert_eq!(table.requota(&k, carry), expected);
                }
                Changes::Whole => {
                    let expected = quotas[config.lock().unwrap()[0]] != quotas[i];
                    *config.lock().unwrap() = [i; 4];
                    for one in each.values() {
                        prop_assert_eq!(one.quota() != quotas[i], expected);
                        if expected {
                            one.set_quota(quotas[i], carry);
                        }
                    }
                    prop_assert_eq!(table.set_quota(quotas[i], carry), expected);
                    prop_assert_eq!(table.quota_of(&k), quotas[i]);
                }
            },
        }
    }
    Ok(())
}

proptest! {
    /// A keyed table whose quota function reads a configuration that changes, each change
    /// applied with `requota`, decides every check exactly as one reconfigurable limiter per key
    /// given the same changes: figures included, and `requota` says whether the key's quota
    /// changed.
    #[test]
    fn requota_is_one_reconfigurable_limiter_per_key((quotas, ops) in requota_run()) {
        use atomic_limiter::algorithm::GcraAlgorithm;
        against_one_reconfigurable_per_key::<GcraAlgorithm>(&quotas, &ops, Changes::PerKey)?;
    }

    /// A table with one quota changed with `set_quota` decides every check exactly as one
    /// reconfigurable limiter per key given each change: GCRA and the token bucket, both carries.
    #[test]
    fn set_quota_is_one_reconfigurable_limiter_per_key((quotas, ops) in requota_run()) {
        use atomic_limiter::algorithm::{GcraAlgorithm, TokenBucketAlgorithm};
        against_one_reconfigurable_per_key::<GcraAlgorithm>(&quotas, &ops, Changes::Whole)?;
        against_one_reconfigurable_per_key::<TokenBucketAlgorithm>(&quotas, &ops, Changes::Whole)?;
    }
}

/// After a change of the table's quota, the eviction index holds each key at its new instant.
/// Key 1, left empty by a proportional carry to a quota that refills in a millisecond, is full
/// after that millisecond; key 2, checked half-way, is not yet. A new key at the cap must find
/// key 1 (filed on the old quota it would have been a second away, behind key 2, and the table
/// would answer "full").
#[test]
fn set_quota_files_every_key_at_its_new_instant() {
    use atomic_limiter::Carry;
    let clock = ManualClock::new();
    let table = gcra_table(Quota::per_second(1), 2, clock.clone());
    assert!(table.check_key(&1).is_allowed());
    let fast = Quota::per_second(1000).with_burst(1);
    assert!(table.set_quota(fast, Carry::Proportional));
    assert!(!table.set_quota(fast, Carry::Debt), "no change");
    assert_eq!(table.check_key_n(&1, 0).unwrap().remaining(), 0);
    clock.advance(Duration::from_micros(500));
    assert!(table.check_key(&2).is_allowed());
    clock.advance(Duration::from_micros(500));
    let newcomer = table.check_key(&3);
    assert!(newcomer.is_allowed(), "{newcomer:?}");
    assert_eq!(table.len(), 2);
    // Back to the quota the table was built with: its keys decide on the fast path again, as
    // exactly (key 3's debt of 1 ms becomes a debt of 1 s, proportionally).
    assert!(table.set_quota(Quota::per_second(1), Carry::Proportional));
    assert!(table.check_key(&3).is_denied());
    clock.advance(Duration::from_secs(1));
    assert!(table.check_key(&3).is_allowed());
    assert!(!table.requota(&3, Carry::Debt), "no quota function");
}

/// Two threads check on a frozen clock, each `check(i)` for `i` in `0..checks` with a `check` of
/// its own from `checker()`, while a third calls `flip(flips)` until they are done (50 times at
/// least): how many were admitted.
fn admitted_while_flipping<C: FnMut(u32) -> bool>(
    checks: u32,
    checker: impl Fn() -> C + Sync,
    flip: impl Fn(u32) + Sync,
) -> usize {
    use std::sync::atomic::{AtomicBool, AtomicUsize};
    let admitted = AtomicUsize::new(0);
    let done = AtomicBool::new(false);
    let start = Barrier::new(3);
    thread::scope(|s| {
        s.spawn(|| {
            start.wait();
            let mut flips = 0u32;
            while !done.load(Relaxed) || flips < 50 {
                flip(flips);
                flips += 1;
            }
        });
        let checkers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let mut check = checker();
                    start.wait();
                    for i in 0..checks {
                        if check(i) {
                            admitted.fetch_add(1, Relaxed);
                        }
                    }
                })
            })
            .collect();
        for c in checkers {
            c.join().unwrap();
        }
        done.store(true, Relaxed);
    });
    admitted.load(Relaxed)
}

/// What is left in `keys` of a table on a frozen clock: up to 200 admissions per key.
fn drain<K: std::hash::Hash + Eq + Clone>(
    table: &Table<K, Gcra<ManualClock>>,
    keys: impl Iterator<Item = K>,
) -> usize {
    keys.map(|k| {
        (0..200)
            .filter(|_| table.check_key(&k).is_allowed())
            .count()
    })
    .sum()
}

/// Threads check four keys on a frozen clock while another flips the table between bursts of
/// 100 and 50 at one rate, the debt carried as time: every admission is counted in the state
/// carried over, so once the quota is back at 100 and every key drained, exactly 100 were
/// admitted per key. Twenty rounds; `admitted(table, flip)` runs 400 checks racing `flip` and
/// answers how many were admitted.
fn set_quota_racing(
    admitted: impl Fn(&Table<u32, Gcra<ManualClock>>, &(dyn Fn(u32) + Sync)) -> usize,
) {
    use atomic_limiter::Carry;
    let big = Quota::per_second(10).with_burst(100);
    let small = Quota::per_second(10).with_burst(50);
    for round in 0..20 {
        let table = gcra_table(big, 8, ManualClock::new());
        let flip = |flips: u32| {
            let _ = table.set_quota(if flips % 2 == 0 { small } else { big }, Carry::Debt);
        };
        let admitted = admitted(&table, &flip);
        let _ = table.set_quota(big, Carry::Debt);
        let rest = drain(&table, 0..4u32);
        assert_eq!(admitted + rest, 400, "round {round}");
    }
}

#[test]
fn set_quota_racing_checks_loses_no_admission() {
    set_quota_racing(|table, flip| {
        admitted_while_flipping(400, || |i| table.check_key(&(i % 4)).is_allowed(), flip)
    });
}

/// A key flood at the cap while the table's quota flips: three threads check four hot keys and
/// flood new ones (the table fills and then refuses them), a fourth flips the quota between
/// bursts of 100 and 50 at one rate, and a watcher reads `len()`. The table never holds more than
/// its cap, no admission on a hot key is lost or made twice (exactly 100 per key once the quota
/// is back and every key drained), and every key answers under the final quota.
#[test]
fn a_key_flood_at_the_cap_during_set_quota_stays_bounded_and_exact() {
    use atomic_limiter::Carry;
    use std::sync::atomic::{AtomicBool, AtomicUsize};
    let big = Quota::per_second(10).with_burst(100);
    let small = Quota::per_second(10).with_burst(50);
    let cap = 64;
    for round in 0..5 {
        let table = gcra_table(big, cap, ManualClock::new());
        let hot_admitted = AtomicUsize::new(0);
        let (done, most) = (AtomicBool::new(false), AtomicUsize::new(0));
        thread::scope(|s| {
            s.spawn(|| {
                while !done.load(Relaxed) {
                    most.fetch_max(table.len(), Relaxed);
                }
            });
            s.spawn(|| {
                let mut flips = 0u32;
                while !done.load(Relaxed) || flips < 50 {
                    let q = if flips % 2 == 0 { small } else { big };
                    let _ = table.set_quota(q, Carry::Debt);
                    flips += 1;
                }
            });
            let flooders: Vec<_> = (0..3u64)
                .map(|t| {
                    let (table, hot_admitted) = (&table, &hot_admitted);
                    s.spawn(move || {
                        for i in 0..2_000u64 {
                            if table.check_key(&(i % 4)).is_allowed() {
                                hot_admitted.fetch_add(1, Relaxed);
                            }
                            let _ = table.check_key(&(1_000 + i * 3 + t));
                        }
                    })
                })
                .collect();
            for f in flooders {
                f.join().unwrap();
            }
            done.store(true, Relaxed);
        });
        assert!(most.load(Relaxed) <= cap, "round {round}: {most:?}");
        assert!(table.len() <= cap);
        let _ = table.set_quota(big, Carry::Debt);
        let rest = drain(&table, 0..4u64);
        assert_eq!(hot_admitted.load(Relaxed) + rest, 400, "round {round}");
        for k in 0..4u64 {
            assert_eq!(table.check_key(&k).limit(), 100, "round {round}, key {k}");
        }
    }
}

/// Threads check one key on a frozen clock while another changes its quota back and forth
/// (bursts of 100 and 50 at 10/s, the debt carried as time: every token costs the same time in
/// both): every admission is counted in the state carried over, so once the quota is back to the
/// larger burst and the bucket drained, exactly 100 were admitted.
#[test]
fn requota_racing_checks_loses_no_admission() {
    use atomic_limiter::Carry;
    use std::sync::atomic::AtomicBool;
    for round in 0..20 {
        let big = Quota::per_second(10).with_burst(100);
        let small = Quota::per_second(10).with_burst(50);
        let use_small = Arc::new(AtomicBool::new(false));
        let table = {
            let use_small = use_small.clone();
            fn_table(
                8,
                move |_: &u8| if use_small.load(Relaxed) { small } else { big },
                |q| Gcra::with_clock(q, ManualClock::new()),
            )
        };
        let admitted = admitted_while_flipping(
            100,
            || |_| table.check_key(&7).is_allowed(),
            |_| {
                use_small.fetch_xor(true, Relaxed);
                let _ = table.requota(&7, Carry::Debt);
            },
        );
        use_small.store(false, Relaxed);
        let _ = table.requota(&7, Carry::Debt);
        let rest = (0..200)
            .filter(|_| table.check_key(&7).is_allowed())
            .count();
        assert_eq!(admitted + rest, 100, "round {round}");
    }
}

include!("panics.rs");
