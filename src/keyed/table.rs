//! [`Keyed`] itself: the table, its constructors and the check path.

use super::KeyHasher;
use super::entry::KeyEntry;
use super::quotas::{KeyQuotas, Quotas, SWEEP_FLOOR};
use super::store::{KeyedStore, Retired};
use crate::limiter::shared::KeyedLimiter;
use alloc::borrow::ToOwned;
use alloc::boxed::Box;
use core::borrow::Borrow;
use core::future::Future;
use core::hash::Hash;
use core::time::Duration;

use dashmap::DashMap;

use crate::clock::Clock;
use crate::decision::Decision;
use crate::gcra::Gcra;
use crate::keyed::due::DueQueue;
use crate::keyed::store::{Lookup, PerLookup};
use crate::quota::InsufficientCapacity;
use crate::quota::Quota;
use crate::sync::{Arc, AtomicBool, AtomicUsize, Backoff, Mutex, Ordering};
use crate::token_bucket::TokenBucket;
use crate::wait::Wait;
use crate::wait::WaitError;

/// The store a [`Keyed`] table keeps its keys in unless it is given another
/// ([`Keyed::with_store`]): a [`FlatStore`](super::FlatStore), whose lookups probe slots that
/// hold each key and its entry in place, with no lock. A [`DashMap`] (lookups under a shard's
/// read lock) and, with the `papaya` feature, `keyed::LockFreeStore` are the others; `compare`
/// measures all three.
pub type DefaultStore<K, V> = super::FlatStore<K, V, KeyHasher>;

/// An empty default store.
fn default_store<K, V>() -> DefaultStore<K, V> {
    super::FlatStore::with_hasher(KeyHasher::new())
}

/// [`Keyed::check_key`]'s answer for one token.
#[inline(always)]
pub(super) fn one_token(answer: Result<Decision, InsufficientCapacity>) -> Decision {
    match answer {
        Ok(d) => d,
        // Only a quota function can give a key a burst below 1, and quotas cannot: a request
        // that could never pass, refused with no wait that would help.
        Err(_) => Decision::never(0),
    }
}

/// One limiter per key (client id, IP address, API key), created on first use, with bounded
/// memory.
///
/// Each key costs its own 8-byte state word plus the map's entry and its place in the eviction
/// index; the quota and the clock live in one limiter shared by every key with that quota. A check
/// on a key already present is one map lookup (a shard's read lock in the default [`DashMap`];
/// none in the lock-free store: see [`DefaultStore`]) and the limiter's own check: no allocation.
///
/// # Bounded memory
///
/// At most `max_keys` keys are held, at every instant ([`Keyed::len`] never reads more), without
/// the caller doing anything. When a new key arrives at the cap, the key whose bucket is full again
/// soonest is found in an index ordered by that instant, and dropped if its bucket is full now. A
/// full bucket is exactly a fresh one, so a dropped key that comes back is admitted exactly as if
/// it had stayed: eviction never over-admits. If no bucket is full yet, the new key is refused
/// with a decision for which [`Decision::is_table_full`] holds (a `503`, not a `429`), whose
/// `retry_after` is the instant the first held bucket is full again: waiting it lets the key in
/// unless another new key takes that place first. Finding a key to evict costs a heap step, not a
/// pass over the map, and a check on a held key never waits for it. Nothing is allocated for a
/// refused key, and a peek (`n = 0`) at a new key answers as a fresh bucket and takes no place.
///
/// With a quota function, keys with equal quotas share one limiter, kept only while a held key
/// uses it: memory stays bounded by the cap whatever the function returns.
/// [`Keyed::retain_recent`] and [`Keyed::shrink`] drop every full bucket on demand.
///
/// All limiters that `make` builds must read the same clock: the eviction index compares their
/// instants.
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
///
/// A full table answers differently from a key over its rate:
///
/// ```
/// use atomic_limiter::{Keyed, ManualClock, Quota};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let keyed = Keyed::gcra_with_clock(Quota::per_second(1), 1, clock.clone());
/// assert!(keyed.check_key(&"alice").is_allowed());
/// let over_rate = keyed.check_key(&"alice");
/// assert!(over_rate.is_denied() && !over_rate.is_table_full()); // 429
/// let no_room = keyed.check_key(&"bob");
/// assert!(no_room.is_table_full()); // 503
/// clock.advance(no_room.retry_after());
/// assert!(keyed.check_key(&"bob").is_allowed()); // alice's bucket was full: she made room
/// ```
pub struct Keyed<K, L, M = DefaultStore<K, KeyEntry<L>>> {
    pub(super) store: M,
    pub(super) quotas: Quotas<K, L>,
    pub(super) make: Box<dyn Fn(Quota) -> L + Send + Sync>,
    pub(super) max_keys: usize,
    /// Keys held, or being inserted: never above `max_keys` (a place is taken before inserting).
    pub(super) count: AtomicUsize,
    /// Held keys by when their bucket is full again.
    pub(super) due: Mutex<DueQueue<K>>,
    /// Where settlements and an operator's changes are counted.
    #[cfg(feature = "metrics")]
    pub(super) metrics: Option<crate::instrument::LimiterMetrics>,
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
        Keyed::with_store(default_store(), max_keys, KeyQuotas::Every(quota), make)
    }

    /// Each key on the quota `quota_for` gives it (keys with equal quotas share one limiter).
    pub fn with_quota_fn(
        max_keys: usize,
        quota_for: impl Fn(&K) -> Quota + Send + Sync + 'static,
        make: impl Fn(Quota) -> L + Send + Sync + 'static,
    ) -> Self {
        Keyed::with_store(
            default_store(),
            max_keys,
            KeyQuotas::PerKey(Box::new(quota_for)),
            make,
        )
    }
}

#[cfg(feature = "quanta")]
impl<K: Hash + Eq + Clone> Keyed<K, Gcra> {
    /// GCRA per key on the default clock (one clock shared by all keys).
    ///
    /// # Examples
    ///
    /// Five requests per second per client address, at most 100 000 addresses held:
    ///
    /// ```
    /// use atomic_limiter::{Keyed, Quota};
    /// use std::net::IpAddr;
    ///
    /// let per_client = Keyed::gcra(Quota::per_second(5), 100_000);
    /// let client: IpAddr = "192.0.2.7".parse().unwrap();
    /// assert_eq!((0..10).filter(|_| per_client.check_key(&client).is_allowed()).count(), 5);
    /// ```
    pub fn gcra(quota: Quota, max_keys: usize) -> Self {
        let clock = crate::clock::QuantaClock::new();
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
        quotas: KeyQuotas<K>,
        make: impl Fn(Quota) -> L + Send + Sync + 'static,
    ) -> Self {
        let quotas = match quotas {
            KeyQuotas::Every(quota) => {
                let first = Arc::new(make(quota));
                Quotas::Shared {
                    current: Mutex::new(first.clone()),
                    first,
                    changed: AtomicBool::new(false),
                }
            }
            KeyQuotas::PerKey(quota_for) => Quotas::PerKey {
                quota_for,
                by_quota: DashMap::with_hasher(KeyHasher::new()),
                made: AtomicUsize::new(0),
                sweep_after: AtomicUsize::new(SWEEP_FLOOR),
            },
        };
        Keyed {
            store,
            quotas,
            make: Box::new(make),
            max_keys: max_keys.max(1),
            count: AtomicUsize::new(0),
            due: Mutex::new(DueQueue::new()),
            #[cfg(feature = "metrics")]
            metrics: None,
        }
    }

    /// Counts settlements and an operator's changes of keys ([`Keyed::reset`], [`Keyed::remove`],
    /// [`Keyed::penalize`], [`Keyed::block`]) in `metrics`, as `atomic_limiter_admin_total`.
    /// Checks are counted by the caller, with [`LimiterMetrics::record`](crate::LimiterMetrics::record)
    /// on their decisions, so that the hot path pays for no counter it was not asked for.
    ///
    /// # Examples
    ///
    /// ```
    /// use atomic_limiter::{Keyed, LimiterMetrics, ManualClock, Quota};
    ///
    /// let table = Keyed::gcra_with_clock(Quota::per_second(10), 100, ManualClock::new())
    ///     .with_metrics(LimiterMetrics::new("per_user"));
    /// table.remove("mallory"); // counted as atomic_limiter_admin_total{op="remove"}
    /// ```
    #[cfg(feature = "metrics")]
    pub fn with_metrics(mut self, metrics: crate::instrument::LimiterMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Counts one settlement or operator's change, where counters were given.
    pub(super) fn count_admin(&self, op: &str) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            m.admin(op);
        }
        let _ = op;
    }

    /// Asks for one token for `key`, given as the key or any form it borrows as (`&str` for a
    /// `String` key: a check allocates nothing).
    #[inline]
    pub fn check_key<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_key_via(&self.per_lookup(), key, 1, |_, _| None, one_token)
    }

    /// Asks for `n` tokens for `key`, all or nothing; `n = 0` peeks.
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] if `n` exceeds the key's burst (the key is not added).
    #[inline]
    pub fn check_key_n<Q>(&self, key: &Q, n: u32) -> Result<Decision, InsufficientCapacity>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_key_via(&self.per_lookup(), key, n, |_, _| None, |answer| answer)
    }

    /// The lookup of a key in the table's own store, for [`Keyed::check_key_via`].
    #[inline(always)]
    pub(crate) fn per_lookup(&self) -> PerLookup<'_, M> {
        PerLookup(&self.store)
    }

    /// [`Keyed::check_key_n`], the key looked up through `lookup`, its answer passed through
    /// `finish` where it is made: so that [`Keyed::check_key`]'s decision is built where it is
    /// returned, not built in a `Result` and then copied out of it (a copy of a decision just
    /// written with narrower stores, which stalls on store forwarding). `on_seen` is asked first
    /// about what the one-quota fast path's transition saw: its answer, if any, is the check's,
    /// and no decision is built (the hook of a consumer that needs nothing of an admission but
    /// that it happened: the HTTP backend).
    #[inline(always)]
    pub(crate) fn check_key_via<Q, R>(
        &self,
        lookup: &impl Lookup<K, KeyEntry<L>>,
        key: &Q,
        n: u32,
        on_seen: impl FnOnce(&L, L::Seen) -> Option<R>,
        finish: impl FnOnce(Result<Decision, InsufficientCapacity>) -> R,
    ) -> R
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if let Quotas::Shared { first, changed, .. } = &self.quotas {
            // Relaxed: a hint only; the entry's own limiter, read under the shard lock, decides.
            if !changed.load(Ordering::Relaxed) {
                // One quota for every key, never changed: every entry's limiter is `first`. Only
                // the transition runs under the shard lock; the decision is worked out after it
                // is released.
                if let Err(e) = InsufficientCapacity::check(n, first.quota().burst()) {
                    return finish(Err(e));
                }
                // The limiter itself, read out of the table's `Arc` here, before the lookup's
                // lock: a load after a locked instruction waits for it, and the step under the
                // lock and the decision after it would each read the pointer again.
                let limiter: &L = first;
                // Read while the store fetches the key's slot, where it sends for it first (the
                // default store does): the two waits overlap.
                let seen = lookup.look_up_after(
                    key,
                    || limiter.read_clock(),
                    |e, retired, reading| {
                        // A change that began since the hint may have moved this key already, or
                        // be moving it (retired).
                        if !core::ptr::eq(&*e.limiter, limiter) {
                            return None;
                        }
                        limiter.take_state_read(&e.state, n, retired.map(Retired::flag), reading)
                    },
                );
                return match seen {
                    Some(Some(seen)) => match on_seen(limiter, seen) {
                        Some(answer) => answer,
                        None => finish(Ok(limiter.decision_of(seen))),
                    },
                    Some(None) => finish(self.check_moved(key, n)),
                    None => finish(self.check_new(key, n, true)),
                };
            }
            // Once the quota has changed, keys decide under the lock, each on its entry's
            // limiter, as with a quota function.
        }
        finish(self.check_on_entry(lookup, key, n))
    }

    /// The check decided under the shard lock, on the entry's own limiter (a quota function's
    /// tables, and a table with one quota once it has changed), or on a new key.
    #[inline(never)]
    pub(super) fn check_on_entry<Q>(
        &self,
        lookup: &impl Lookup<K, KeyEntry<L>>,
        key: &Q,
        n: u32,
    ) -> Result<Decision, InsufficientCapacity>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let backoff = Backoff::new();
        loop {
            match lookup.look_up(key, |e, retired| e.check(n, retired)) {
                Some(Some(answer)) => return answer,
                // Retired: the change that retired it replaces or removes it next, holding the
                // index's lock (a few instructions, or a pass over the table).
                Some(None) => backoff.snooze(),
                None => return self.check_new(key, n, true),
            }
        }
    }

    /// Waits until `n` tokens for `key` are granted, sleeping with `sleep` between tries, as
    /// [`RateLimiter::wait_n_with`](crate::RateLimiter::wait_n_with) does for one limiter; a full
    /// table's refusal is waited out the same way (its retry-after is when a place frees).
    ///
    /// # Errors
    ///
    /// [`WaitError::InsufficientCapacity`] if `n` exceeds the key's burst; [`WaitError::TimedOut`]
    /// if the next sleep would take the total past `wait.max_wait()`.
    pub fn wait_key_n_with<Q>(
        &self,
        key: &Q,
        n: u32,
        wait: Wait,
        sleep: impl FnMut(Duration),
    ) -> Result<Decision, WaitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        crate::wait::wait_with(|| self.check_key_n(key, n), wait, sleep)
    }

    /// [`Keyed::wait_key_n_with`] on the calling thread, with `std::thread::sleep`.
    ///
    /// # Errors
    ///
    /// As [`Keyed::wait_key_n_with`].
    pub fn wait_key_n<Q>(&self, key: &Q, n: u32, wait: Wait) -> Result<Decision, WaitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.wait_key_n_with(key, n, wait, std::thread::sleep)
    }

    /// The asynchronous form of [`Keyed::wait_key_n_with`], bound to no runtime: `sleep` makes the
    /// runtime's timer future (`|d| tokio::time::sleep(d)`), awaited between tries. Nothing is held
    /// across an await but the references.
    ///
    /// # Errors
    ///
    /// As [`Keyed::wait_key_n_with`].
    pub fn until_key_n_ready_with<'a, Q, S, F>(
        &'a self,
        key: &'a Q,
        n: u32,
        wait: Wait,
        sleep: S,
    ) -> impl Future<Output = Result<Decision, WaitError>> + 'a
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        S: FnMut(Duration) -> F + 'a,
        F: Future<Output = ()> + 'a,
    {
        crate::wait::until_with(move || self.check_key_n(key, n), wait, sleep)
    }

    /// For the loom models' teeth: the first check as it was before insertions were serialised.
    /// It neither looks for the key again under the index's lock nor holds that lock while it
    /// inserts, so a racing insertion of the same key can make it answer that the table is full.
    #[cfg(atomic_limiter_loom)]
    pub(crate) fn loom_broken_check_key<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let answer = match self
            .store
            .with_existing(key, |e, retired| e.check(1, retired))
        {
            Some(Some(answer)) => answer,
            _ => self.check_new(key, 1, false),
        };
        answer.expect("the loom models ask for one token of a burst of at least one")
    }

    /// For the loom models' teeth: the fast path of a table with one quota, without looking under
    /// the shard lock whether a change has moved the key since the hint was read (a key moved
    /// meanwhile is decided with the first limiter's parameters on its new state).
    #[cfg(atomic_limiter_loom)]
    pub(crate) fn loom_unchecked_check_key(&self, key: &K) -> Decision {
        let Quotas::Shared { first, changed, .. } = &self.quotas else {
            return self.check_key(key);
        };
        if changed.load(Ordering::Relaxed) {
            return self.check_key(key);
        }
        match self.store.with_existing(key, |e, retired| {
            first.take_state(&e.state, 1, retired.map(Retired::flag))
        }) {
            Some(Some(seen)) => first.decision_of(seen),
            _ => self.check_key(key),
        }
    }

    /// A check that found its key moved to another quota by a change that began after the check
    /// looked: made again on the key's own limiter.
    #[cold]
    #[inline(never)]
    pub(super) fn check_moved<Q>(&self, key: &Q, n: u32) -> Result<Decision, InsufficientCapacity>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_on_entry(&self.per_lookup(), key, n)
    }
}

impl<K: Hash + Eq + Clone, L: KeyedLimiter, M: KeyedStore<K, KeyEntry<L>>> Keyed<K, L, M> {
    /// How many keys are held (places taken by insertions under way included): never more than
    /// [`Keyed::max_keys`].
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

    /// Gives back `n` tokens that `key` was admitted moments ago and never used (another policy
    /// of the same request refused it), never past full; nothing if the key is gone or moving
    /// to another quota (which can only under-admit).
    #[cfg(any(feature = "tower", feature = "rls"))]
    pub(crate) fn give_back_key<Q>(&self, key: &Q, n: u32)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let _ = self
            .store
            .with_existing(key, |entry, retired| entry.give_back(n, retired));
    }
}
