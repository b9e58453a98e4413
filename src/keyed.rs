use alloc::boxed::Box;
use core::hash::Hash;

use dashmap::DashMap;

use crate::decision::Detail;
use crate::keyed_limiter::{KeyState, KeyedLimiter};
use crate::keyed_store::KeyedStore;
use crate::sync::{Arc, AtomicUsize, Ordering};
use crate::{Clock, Decision, Gcra, InsufficientCapacity, Quota, TokenBucket};

/// The default hasher: aHash, keyed randomly per process, fast on short keys and resistant to
/// hash flooding (an attacker who cannot see the keys cannot aim keys at one bucket).
pub type DefaultHasher = ahash::RandomState;

/// A function giving each key its quota.
pub type QuotaFn<K> = Box<dyn Fn(&K) -> Quota + Send + Sync>;

/// One key's entry: its state word and the shared limiter (quota and clock) it is checked with.
#[derive(Debug)]
pub struct KeyEntry<L> {
    state: KeyState,
    limiter: Arc<L>,
}

impl<L: KeyedLimiter> KeyEntry<L> {
    #[inline]
    fn check(&self, n: u32) -> Result<Decision, InsufficientCapacity> {
        InsufficientCapacity::check(n, self.limiter.quota().burst())?;
        Ok(self.limiter.check_state(&self.state, n))
    }
}

/// One limiter per key (client id, IP address, API key), created on first use, with bounded
/// memory.
///
/// Each key costs its own 8-byte state word plus the map's entry; the quota and the clock live in
/// one limiter shared by every key with that quota. A check on a key already present is one map
/// lookup (a shard read lock in [`DashMap`]) and the limiter's own check: no allocation.
///
/// # Bounded memory
///
/// At most `max_keys` keys are kept, without the caller doing anything: when a new key arrives at
/// the cap, the keys whose bucket is full again are dropped first. A full bucket is exactly a
/// fresh one, so a dropped key that comes back is admitted exactly as if it had stayed: eviction
/// never over-admits. If no bucket is full, the new key is refused (a denial whose `retry_after`
/// is the soonest refill seen in that sweep, an estimate) rather than admitted past the cap, and
/// further sweeps back off so that a flood of new keys costs no more than a constant per key.
/// [`Keyed::retain_recent`] and [`Keyed::shrink`] do the same sweep on demand.
///
/// # Examples
///
/// Two clients with their own budget, one of them with a bigger one:
///
/// ```
/// use atomic_limiter::{Gcra, Keyed, ManualClock, Quota, RateLimiter};
///
/// let clock = ManualClock::new();
/// let keyed = Keyed::with_quota_fn(
///     1_000_000,
///     |client: &u64| if *client == 0 { Quota::per_second(10) } else { Quota::per_second(2) },
///     move |q| Gcra::with_clock(q, clock.clone()),
/// );
/// assert_eq!((0..20).filter(|_| keyed.check_key(&0).is_allowed()).count(), 10);
/// assert_eq!((0..20).filter(|_| keyed.check_key(&7).is_allowed()).count(), 2);
/// assert_eq!(keyed.len(), 2);
/// ```
pub struct Keyed<K, L, M = DashMap<K, KeyEntry<L>, DefaultHasher>> {
    store: M,
    /// The quota of every key, or `None` with a quota function.
    shared: Option<Arc<L>>,
    quota_for: Option<QuotaFn<K>>,
    make: Box<dyn Fn(Quota) -> L + Send + Sync>,
    /// One shared limiter per distinct quota the quota function returns.
    by_quota: DashMap<Quota, Arc<L>, DefaultHasher>,
    max_keys: usize,
    /// Keys held (an exact count: slots are reserved before inserting).
    count: AtomicUsize,
    /// New keys to refuse before the next sweep, after a sweep that freed nothing.
    backoff: AtomicUsize,
    /// The soonest refill the last fruitless sweep saw, in ns: a refused new key's retry estimate.
    soonest_ns: crate::sync::AtomicU64,
}

impl<K, L, M> core::fmt::Debug for Keyed<K, L, M> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Keyed")
            .field("max_keys", &self.max_keys)
            .field("keys", &self.count.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<K: Hash + Eq + Clone, L: KeyedLimiter> Keyed<K, L> {
    /// Every key on `quota`, at most `max_keys` keys, each key's limiter made by `make`.
    pub fn new(
        quota: Quota,
        max_keys: usize,
        make: impl Fn(Quota) -> L + Send + Sync + 'static,
    ) -> Self {
        Keyed::with_store(
            DashMap::with_hasher(DefaultHasher::new()),
            max_keys,
            Some(quota),
            None,
            make,
        )
    }

    /// Each key on the quota `quota_for` gives it (keys with equal quotas share one limiter).
    pub fn with_quota_fn(
        max_keys: usize,
        quota_for: impl Fn(&K) -> Quota + Send + Sync + 'static,
        make: impl Fn(Quota) -> L + Send + Sync + 'static,
    ) -> Self {
        Keyed::with_store(
            DashMap::with_hasher(DefaultHasher::new()),
            max_keys,
            None,
            Some(Box::new(quota_for)),
            make,
        )
    }
}

#[cfg(feature = "quanta")]
impl<K: Hash + Eq + Clone> Keyed<K, Gcra> {
    /// GCRA per key on the default clock (one clock shared by all keys).
    pub fn gcra(quota: Quota, max_keys: usize) -> Self {
        let clock = crate::QuantaClock::new();
        Keyed::new(quota, max_keys, move |q| Gcra::with_clock(q, clock.clone()))
    }
}

impl<K: Hash + Eq + Clone, C: Clock + Clone + Send + Sync + 'static> Keyed<K, Gcra<C>> {
    /// GCRA per key on `clock`.
    pub fn gcra_with_clock(quota: Quota, max_keys: usize, clock: C) -> Self {
        Keyed::new(quota, max_keys, move |q| Gcra::with_clock(q, clock.clone()))
    }
}

impl<K: Hash + Eq + Clone, C: Clock + Clone + Send + Sync + 'static> Keyed<K, TokenBucket<C>> {
    /// A token bucket per key on `clock`.
    pub fn token_bucket_with_clock(quota: Quota, max_keys: usize, clock: C) -> Self {
        Keyed::new(quota, max_keys, move |q| {
            TokenBucket::with_clock(q, clock.clone())
        })
    }
}

impl<K: Hash + Eq + Clone, L: KeyedLimiter, M: KeyedStore<K, KeyEntry<L>>> Keyed<K, L, M> {
    /// The general constructor: any [`KeyedStore`], one quota or a quota function.
    pub fn with_store(
        store: M,
        max_keys: usize,
        quota: Option<Quota>,
        quota_for: Option<QuotaFn<K>>,
        make: impl Fn(Quota) -> L + Send + Sync + 'static,
    ) -> Self {
        Keyed {
            store,
            shared: quota.map(|q| Arc::new(make(q))),
            quota_for,
            make: Box::new(make),
            by_quota: DashMap::with_hasher(DefaultHasher::new()),
            max_keys: max_keys.max(1),
            count: AtomicUsize::new(0),
            backoff: AtomicUsize::new(0),
            soonest_ns: crate::sync::AtomicU64::new(0),
        }
    }

    /// Asks for one token for `key`.
    #[inline]
    pub fn check_key(&self, key: &K) -> Decision {
        match self.check_key_n(key, 1) {
            Ok(d) => d,
            // Only a quota function can give a key a burst below 1, and quotas cannot.
            Err(_) => self.refusal(),
        }
    }

    /// Asks for `n` tokens for `key`, all or nothing; `n = 0` peeks.
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] if `n` exceeds the key's burst (the key is not added).
    #[inline]
    pub fn check_key_n(&self, key: &K, n: u32) -> Result<Decision, InsufficientCapacity> {
        if let Some(shared) = &self.shared {
            // One quota for every key: every entry's limiter is `shared`. Only the transition runs
            // under the shard lock; the decision is worked out after it is released.
            InsufficientCapacity::check(n, shared.quota().burst())?;
            return match self
                .store
                .with_existing(key, |e| shared.take_state(&e.state, n))
            {
                Some(seen) => Ok(shared.decision_of(seen, n)),
                None => self.check_new(key, n),
            };
        }
        match self.store.with_existing(key, |e| e.check(n)) {
            Some(answer) => answer,
            None => self.check_new(key, n),
        }
    }

    /// A key not (or no longer) in the map: reserve a slot, insert a fresh limiter, check it.
    #[cold]
    #[inline(never)]
    fn check_new(&self, key: &K, n: u32) -> Result<Decision, InsufficientCapacity> {
        let limiter = self.limiter_for(key);
        InsufficientCapacity::check(n, limiter.quota().burst())?;
        if !self.reserve() {
            return Ok(self.refusal());
        }
        let (answer, inserted) = self.store.with_inserted(
            key.clone(),
            || KeyEntry {
                state: limiter.fresh_state(),
                limiter: limiter.clone(),
            },
            |e| e.check(n),
        );
        if !inserted {
            // Another thread inserted the key first: give the slot back.
            // Relaxed: a counter; its RMWs are all the synchronisation it needs.
            self.count.fetch_sub(1, Ordering::Relaxed);
        }
        answer
    }

    fn limiter_for(&self, key: &K) -> Arc<L> {
        if let Some(shared) = &self.shared {
            return shared.clone();
        }
        let quota = self
            .quota_for
            .as_ref()
            .map_or_else(unreachable_quota, |f| f(key));
        self.by_quota
            .entry(quota)
            .or_insert_with(|| Arc::new((self.make)(quota)))
            .clone()
    }

    /// Takes a slot for a new key, sweeping full buckets out when at the cap.
    fn reserve(&self) -> bool {
        // Relaxed: the count's RMWs alone keep it exact; it guards no other memory.
        if self.count.fetch_add(1, Ordering::Relaxed) < self.max_keys {
            return true;
        }
        self.count.fetch_sub(1, Ordering::Relaxed);
        // After a fruitless sweep, refuse new keys for a while instead of sweeping each time.
        // Relaxed: a heuristic counter; a lost decrement only delays the next sweep.
        let skip = self.backoff.load(Ordering::Relaxed);
        if skip > 0 {
            self.backoff.store(skip - 1, Ordering::Relaxed);
            return false;
        }
        if self.sweep() == 0 {
            self.backoff
                .store((self.max_keys / 16).max(1), Ordering::Relaxed);
            return false;
        }
        self.count.fetch_add(1, Ordering::Relaxed) < self.max_keys || {
            self.count.fetch_sub(1, Ordering::Relaxed);
            false
        }
    }

    /// Drops every key whose bucket is full again; returns how many.
    fn sweep(&self) -> usize {
        let mut removed = 0;
        let mut soonest = u64::MAX;
        self.store.remove_where(|_, e| {
            let d = e.limiter.check_state(&e.state, 0);
            let wait = u64::try_from(d.reset_after().as_nanos()).unwrap_or(u64::MAX);
            if wait == 0 {
                removed += 1;
                true
            } else {
                soonest = soonest.min(wait);
                false
            }
        });
        // Relaxed: as in `reserve`.
        self.count.fetch_sub(removed, Ordering::Relaxed);
        self.soonest_ns.store(soonest, Ordering::Relaxed);
        removed
    }

    fn refusal(&self) -> Decision {
        // Relaxed: an estimate for the caller, read once.
        let soonest = self.soonest_ns.load(Ordering::Relaxed);
        Decision::new(
            false,
            1,
            Detail::Eager {
                remaining: 0,
                retry_ns: soonest,
                reset_ns: soonest,
            },
        )
    }

    /// Drops the keys whose bucket is full again (they lose nothing: a full bucket is a fresh one);
    /// returns how many.
    pub fn retain_recent(&self) -> usize {
        self.backoff.store(0, Ordering::Relaxed);
        self.sweep()
    }

    /// [`Keyed::retain_recent`], then gives the freed memory back.
    pub fn shrink(&self) -> usize {
        let removed = self.retain_recent();
        self.store.shrink_to_fit();
        removed
    }

    /// How many keys are held.
    pub fn len(&self) -> usize {
        // Relaxed: a snapshot.
        self.count.load(Ordering::Relaxed)
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most keys held at once.
    pub fn max_keys(&self) -> usize {
        self.max_keys
    }
}

/// `limiter_for` without a shared limiter always has a quota function (the constructors set one
/// or the other); this keeps the code free of a panic path all the same.
#[cold]
fn unreachable_quota() -> Quota {
    Quota::per_second(1)
}

#[cfg(all(test, not(atomic_limiter_loom)))]
mod tests {
    use super::*;
    use crate::ManualClock;

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
}
