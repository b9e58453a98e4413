//! [`Keyed`]: one limiter per key, with bounded memory, and what a custom store needs: the store
//! trait ([`KeyedStore`]), the entry it holds ([`KeyEntry`]) and the default hasher
//! ([`KeyHasher`]). `Keyed` and [`KeyQuotas`] are also at the crate root.

pub(crate) mod due;
#[cfg(feature = "papaya")]
pub(crate) mod pinned;
pub(crate) mod store;

#[cfg(feature = "papaya")]
pub use self::pinned::Pinned;
#[cfg(feature = "papaya")]
pub use self::store::LockFreeStore;
pub use self::store::{Change, KeyedStore, Retired};
pub use crate::limiter::shared::KeyedLimiter;

use alloc::borrow::ToOwned;
use alloc::boxed::Box;
use core::borrow::Borrow;
use core::future::Future;
use core::hash::Hash;
use core::time::Duration;

use dashmap::DashMap;

use crate::clock::Clock;
use crate::decision::Decision;
use crate::decision::Detail;
use crate::gcra::Gcra;
use crate::keyed::due::{DueQueue, Front, NoRoom};
use crate::keyed::store::{Lookup, PerLookup};
use crate::limiter::algorithm::Carry;
use crate::limiter::retire_word;
use crate::limiter::shared::engine::{KeyState, Seen};
use crate::quota::InsufficientCapacity;
use crate::quota::Quota;
use crate::state_cell::{StateCell, Step};
use crate::sync::{Arc, AtomicBool, AtomicUsize, Backoff, Mutex, Ordering};
use crate::token_bucket::TokenBucket;
use crate::wait::Wait;
use crate::wait::WaitError;
use std::sync::PoisonError;

/// [`Keyed::check_key`]'s answer for one token.
#[inline(always)]
fn one_token(answer: Result<Decision, InsufficientCapacity>) -> Decision {
    match answer {
        Ok(d) => d,
        // Only a quota function can give a key a burst below 1, and quotas cannot: a request
        // that could never pass, refused with no wait that would help.
        Err(_) => Decision::never(0),
    }
}

/// The hasher `Keyed` uses by default: aHash, keyed randomly per process, fast on short keys and
/// resistant to hash flooding (an attacker who cannot see the keys cannot aim keys at one bucket).
pub type KeyHasher = ahash::RandomState;

/// A function giving each key its quota.
pub type QuotaFn<K> = Box<dyn Fn(&K) -> Quota + Send + Sync>;

/// The fewest limiters made between two sweeps of a quota function's limiters.
const SWEEP_FLOOR: usize = 64;

/// The quota of each key of a [`Keyed`] limiter: one for all, or one per key from a function.
pub enum KeyQuotas<K> {
    /// Every key on this quota (one limiter serves them all).
    Every(Quota),
    /// Each key on the quota the function gives it (keys with equal quotas share a limiter).
    PerKey(QuotaFn<K>),
}

/// How a `Keyed` finds a key's limiter.
enum Quotas<K, L> {
    /// One quota for every key.
    Shared {
        /// The limiter the table was built with. A key on it decides after the shard lock is
        /// released, this limiter being alive as long as the table (the fast path).
        first: Arc<L>,
        /// The limiter new keys take: `first` until [`Keyed::set_quota`] changes it.
        current: Mutex<Arc<L>>,
        /// Whether `current` may differ from `first`; never reset.
        changed: AtomicBool,
    },
    /// A quota per key, and one limiter per distinct quota while a held key uses it.
    PerKey {
        quota_for: QuotaFn<K>,
        by_quota: DashMap<Quota, Arc<L>, KeyHasher>,
        /// Limiters made since `by_quota` was last swept, and how many more start a sweep.
        made: AtomicUsize,
        sweep_after: AtomicUsize,
    },
}

/// One key's entry: its state word and the shared limiter (quota and clock) it is checked with.
#[derive(Debug)]
pub struct KeyEntry<L> {
    state: KeyState,
    limiter: Arc<L>,
}

impl<L: KeyedLimiter> KeyEntry<L> {
    /// The check on this entry, or `None` if it is retired (the caller looks the key up again).
    #[inline]
    fn check(
        &self,
        n: u32,
        retired: Option<&Retired>,
    ) -> Option<Result<Decision, InsufficientCapacity>> {
        if let Err(e) = InsufficientCapacity::check(n, self.limiter.quota().burst()) {
            return Some(Err(e));
        }
        match retired {
            None => Some(Ok(self.limiter.check_state(&self.state, n))),
            Some(retired) => self
                .limiter
                .take_state(&self.state, n, Some(retired.flag()))
                .map(|seen| Ok(self.limiter.decision_of(seen, n))),
        }
    }

    /// The state word, taken out of use: where checks run beside the change, the entry is retired
    /// first, and every admission made on it is in the word returned; where the change holds the
    /// entry exclusively, the word is read.
    fn retire(&self, retired: Option<&Retired>) -> u64 {
        match retired {
            Some(retired) => retire_word(&self.state.0, retired.flag()),
            // Nothing else changes the word meanwhile: the load is the last word.
            None => self.state.0.update(Step::Keep),
        }
    }

    /// The entry moved to the limiter `to` (another quota), its state carried over as `carry`
    /// says, this one retired where needed; and the instant to file it at in the eviction index (a
    /// lower bound on when its bucket is full again).
    fn moved_to(&self, to: &Arc<L>, carry: Carry, retired: Option<&Retired>) -> (KeyEntry<L>, u64) {
        // Read before the carry reads its own: the instant returned is a lower bound.
        let before = to.now_ns();
        let word = self.retire(retired);
        let entry = KeyEntry {
            state: self.limiter.carried_state(word, to, carry),
            limiter: to.clone(),
        };
        let at = before.saturating_add(entry.reset_ns());
        (entry, at)
    }

    /// The entry as it stands, filed: the instant its bucket is full again, a lower bound.
    fn full_at(&self) -> u64 {
        // Read before the peek reads its own.
        let before = self.limiter.now_ns();
        before.saturating_add(self.reset_ns())
    }

    /// Nanoseconds until the bucket is full again, as a peek answers now (nothing is taken).
    fn reset_ns(&self) -> u64 {
        duration_ns(self.limiter.check_state(&self.state, 0).reset_after())
    }
}

/// One limiter per key (client id, IP address, API key), created on first use, with bounded
/// memory.
///
/// Each key costs its own 8-byte state word plus the map's entry and its place in the eviction
/// index; the quota and the clock live in one limiter shared by every key with that quota. A check
/// on a key already present is one map lookup (a shard read lock in [`DashMap`]) and the limiter's
/// own check: no allocation.
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
pub struct Keyed<K, L, M = DashMap<K, KeyEntry<L>, KeyHasher>> {
    store: M,
    quotas: Quotas<K, L>,
    make: Box<dyn Fn(Quota) -> L + Send + Sync>,
    max_keys: usize,
    /// Keys held, or being inserted: never above `max_keys` (a place is taken before inserting).
    count: AtomicUsize,
    /// Held keys by when their bucket is full again.
    due: Mutex<DueQueue<K>>,
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
            DashMap::with_hasher(KeyHasher::new()),
            max_keys,
            KeyQuotas::Every(quota),
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
            DashMap::with_hasher(KeyHasher::new()),
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
        }
    }

    /// Asks for one token for `key`, given as the key or any form it borrows as (`&str` for a
    /// `String` key: a check allocates nothing).
    #[inline]
    pub fn check_key<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_key_then(key, 1, one_token)
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
        self.check_key_then(key, n, |answer| answer)
    }

    /// [`Keyed::check_key_n`], its answer passed through `finish` where it is made: so that
    /// [`Keyed::check_key`]'s decision is built where it is returned, not built in a `Result` and
    /// then copied out of it (a copy of a decision just written with narrower stores, which stalls
    /// on store forwarding).
    #[inline(always)]
    pub(crate) fn check_key_then<Q, R>(
        &self,
        key: &Q,
        n: u32,
        finish: impl FnOnce(Result<Decision, InsufficientCapacity>) -> R,
    ) -> R
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_key_via(&PerLookup(&self.store), key, n, |_, _| None, finish)
    }

    /// [`Keyed::check_key_then`], the key looked up through `lookup`, with `on_seen` asked first
    /// about what the one-quota fast path's transition saw: its answer, if any, is the check's,
    /// and no decision is built.
    #[inline(always)]
    fn check_key_via<Q, R>(
        &self,
        lookup: &impl Lookup<K, KeyEntry<L>>,
        key: &Q,
        n: u32,
        on_seen: impl FnOnce(&L, Seen) -> Option<R>,
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
                let seen = lookup.look_up(key, |e, retired| {
                    // A change that began since the hint may have moved this key already, or be
                    // moving it (retired).
                    if !Arc::ptr_eq(&e.limiter, first) {
                        return None;
                    }
                    first.take_state(&e.state, n, retired.map(Retired::flag))
                });
                return match seen {
                    Some(Some(seen)) => match on_seen(first, seen) {
                        Some(answer) => answer,
                        None => finish(Ok(first.decision_of(seen, n))),
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

    /// [`Keyed::check_key_then`] for a caller that needs nothing of an admission but that it
    /// happened: `None` for one on the one-quota path, which then builds no decision; else the
    /// check's answer.
    #[cfg(feature = "tower")]
    #[inline(always)]
    pub(crate) fn admit_key<Q>(
        &self,
        key: &Q,
        n: u32,
    ) -> Option<Result<Decision, InsufficientCapacity>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let admitted = |first: &L, seen| first.admitted(seen, n).then_some(None);
        self.check_key_via(&PerLookup(&self.store), key, n, admitted, Some)
    }

    /// The check decided under the shard lock, on the entry's own limiter (a quota function's
    /// tables, and a table with one quota once it has changed), or on a new key.
    #[inline(never)]
    fn check_on_entry<Q>(
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
    #[doc(hidden)]
    pub fn loom_broken_check_key<Q>(&self, key: &Q) -> Decision
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
    #[doc(hidden)]
    pub fn loom_unchecked_check_key(&self, key: &K) -> Decision {
        let Quotas::Shared { first, changed, .. } = &self.quotas else {
            return self.check_key(key);
        };
        if changed.load(Ordering::Relaxed) {
            return self.check_key(key);
        }
        match self.store.with_existing(key, |e, retired| {
            first.take_state(&e.state, 1, retired.map(Retired::flag))
        }) {
            Some(Some(seen)) => first.decision_of(seen, 1),
            _ => self.check_key(key),
        }
    }

    /// A check that found its key moved to another quota by a change that began after the check
    /// looked: made again on the key's own limiter.
    #[cold]
    #[inline(never)]
    fn check_moved<Q>(&self, key: &Q, n: u32) -> Result<Decision, InsufficientCapacity>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_on_entry(&PerLookup(&self.store), key, n)
    }

    /// A key not (or no longer) held: take a place, insert a fresh limiter, check it. `serialised`
    /// is false only in a loom model's broken twin.
    #[cold]
    #[inline(never)]
    fn check_new<Q>(
        &self,
        key: &Q,
        n: u32,
        serialised: bool,
    ) -> Result<Decision, InsufficientCapacity>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // The key as stored is made from a borrowed form (`&str`) only when needed: by a quota
        // function (which takes the stored form), else once the key has a place.
        let mut owned: Option<K> = None;
        let quota = match &self.quotas {
            Quotas::Shared {
                first,
                current,
                changed,
            } => shared_quota(&**first, current, changed),
            Quotas::PerKey { quota_for, .. } => quota_for(owned.insert(key.to_owned())),
        };
        InsufficientCapacity::check(n, quota.burst())?;
        if n == 0 {
            // A peek at a key not held: a fresh bucket is full. Nothing is inserted.
            return Ok(Decision::new(
                true,
                1,
                Detail::Eager {
                    remaining: quota.burst(),
                    retry_ns: 0,
                    reset_ns: 0,
                    limit: quota.burst(),
                },
            ));
        }
        // Every insertion runs under the index's lock, from taking a place to filing the key. So a
        // thread that finds the table full cannot have raced an insertion of its own key: it looks
        // again under the lock, and finds the key there or is the one to insert it.
        let mut due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
        if serialised {
            // Under the index's lock no entry is retired: every change that retires one
            // replaces or removes it before letting go.
            if let Some(answer) = self
                .store
                .with_existing(key, |e, retired| e.check(n, retired))
            {
                return answer.unwrap_or_else(|| Ok(Decision::never(0)));
            }
        }
        if let Err(no_room) = self.take_place(&mut due) {
            return Ok(Decision::new(
                false,
                1, // measured from the held key's own rounded reset
                Detail::TableFull {
                    retry_ns: no_room.unwrap_or(1),
                    limit: quota.burst(),
                },
            ));
        }
        let due = serialised.then_some(due);
        // Only now, with a place, is anything allocated for the key.
        let key: K = owned.unwrap_or_else(|| key.to_owned());
        let limiter = self.limiter_for(quota);
        // Read before the check reads its own, so the instant filed below is a lower bound.
        let before = limiter.now_ns();
        let (answer, inserted) = self.store.with_inserted(
            key.clone(),
            || KeyEntry {
                state: limiter.fresh_state(),
                limiter: limiter.clone(),
            },
            |e, retired| e.check(n, retired),
        );
        // A fresh entry is not retired (see above); were it to be, the check refuses.
        let answer = answer.unwrap_or_else(|| Ok(Decision::never(0)));
        if inserted {
            // Full again at the latest when this first check's debt is paid; re-filed if used.
            let at = answer.map_or(before, |d| {
                before.saturating_add(duration_ns(d.reset_after()))
            });
            due.unwrap_or_else(|| self.due.lock().unwrap_or_else(PoisonError::into_inner))
                .push(key, at);
        } else {
            // Another thread inserted the key first, which only the loom twin's unserialised
            // insertions let happen: give the place back.
            // Relaxed: a counter; its RMWs are all the synchronisation it needs.
            self.count.fetch_sub(1, Ordering::Relaxed);
            drop(limiter);
            self.forget_unused(&quota);
        }
        answer
    }

    /// Applies a new answer of the quota function to the held `key` (a tenant's plan changed in
    /// the configuration the function reads): the key moves to the new quota now, its state
    /// carried over as `carry` says, exactly as a [`Reconfigurable`](crate::Reconfigurable)
    /// limiter's would be. Returns whether the key's quota changed. A key not held takes the
    /// function's answer when it next comes; a table with one quota for every key has no
    /// per-key quota to change (`false`).
    ///
    /// The change runs under the key's shard write lock, which no check on the key runs
    /// beside: every check decides on the old quota and state or on the new ones.
    ///
    /// # Examples
    ///
    /// ```
    /// use atomic_limiter::{Carry, Gcra, Keyed, ManualClock, Quota};
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    ///
    /// let pro_rate = Arc::new(AtomicU64::new(2)); // the configuration the quota function reads
    /// let rate = pro_rate.clone();
    /// let clock = ManualClock::new();
    /// let tenants = Keyed::with_quota_fn(
    ///     1000,
    ///     move |_: &&str| Quota::per_second(rate.load(Relaxed)),
    ///     move |q| Gcra::with_clock(q, clock.clone()),
    /// );
    /// assert_eq!((0..5).filter(|_| tenants.check_key(&"acme").is_allowed()).count(), 2);
    /// pro_rate.store(10, Relaxed); // the plan is upgraded
    /// assert!(tenants.requota(&"acme", Carry::Proportional));
    /// // Its burst was spent, and stays spent, of the new one.
    /// assert!(tenants.check_key(&"acme").is_denied());
    /// assert_eq!(tenants.quota_of(&"acme"), Quota::per_second(10));
    /// ```
    pub fn requota(&self, key: &K, carry: Carry) -> bool {
        let Quotas::PerKey { quota_for, .. } = &self.quotas else {
            return false;
        };
        let quota = quota_for(key);
        let limiter = self.limiter_for(quota);
        // The index's lock before the shard's, as insertions take them.
        let mut due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
        let changed = self
            .store
            .change(key, |e, retired| {
                if e.limiter.quota() == quota {
                    return (Change::Keep, None);
                }
                let old = e.limiter.quota();
                let (moved, at) = e.moved_to(&limiter, carry, retired);
                (Change::Replace(moved), Some((old, at)))
            })
            .flatten();
        drop(limiter);
        let Some((old_quota, at)) = changed else {
            drop(due);
            self.forget_unused(&quota);
            return false;
        };
        // The new quota may fill the bucket sooner than the instant filed: file it again, and
        // keep the index within twice the table by merging a key's entries now and then.
        due.push(key.clone(), at);
        if due.len() > 2 * self.max_keys.max(8) {
            due.dedup();
        }
        drop(due);
        self.forget_unused(&old_quota);
        true
    }

    /// Moves every key of a table with one quota to `quota` (an incident needs a tighter limit),
    /// each key's state carried over as `carry` says, exactly as a
    /// [`Reconfigurable`](crate::Reconfigurable) limiter's would be; keys that come later take
    /// `quota`. Returns whether the quota changed: `false` if it was already `quota`, and for a
    /// table with a quota function, whose keys change with [`Keyed::requota`].
    ///
    /// Each key moves under its shard's write lock, which no check on the key runs beside, so
    /// every check decides on the old quota and state or on the new ones. Keys move one shard
    /// after another: while the change runs, some keys are on the old quota and others on the
    /// new one, each exactly. The change visits every held key and files each anew in the
    /// eviction index, holding the index's lock (new keys wait for it): milliseconds for a
    /// hundred thousand keys.
    ///
    /// A table pays nothing for being changeable until it is changed. Afterwards (unless it is
    /// changed back to the quota it was built with) a check decides under the shard lock, as a
    /// table with a quota function does, and [`Keyed::quota_of`] takes a mutex.
    ///
    /// # Examples
    ///
    /// ```
    /// use atomic_limiter::{Carry, Keyed, ManualClock, Quota};
    ///
    /// let clock = ManualClock::new();
    /// let clients = Keyed::gcra_with_clock(Quota::per_second(10), 1000, clock);
    /// assert_eq!((0..20).filter(|_| clients.check_key(&1).is_allowed()).count(), 10);
    /// // An incident: a tenth of the rate, and a spent burst stays spent.
    /// assert!(clients.set_quota(Quota::per_second(1), Carry::Proportional));
    /// assert!(clients.check_key(&1).is_denied());
    /// assert_eq!((0..5).filter(|_| clients.check_key(&2).is_allowed()).count(), 1);
    /// ```
    pub fn set_quota(&self, quota: Quota, carry: Carry) -> bool {
        let Quotas::Shared {
            first,
            current,
            changed,
        } = &self.quotas
        else {
            return false;
        };
        // Held throughout: no key is inserted or evicted meanwhile, and changes are serialised.
        let mut due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
        let to = {
            let mut current = current.lock().unwrap_or_else(PoisonError::into_inner);
            if current.quota() == quota {
                return false;
            }
            let to = if first.quota() == quota {
                first.clone()
            } else {
                Arc::new((self.make)(quota))
            };
            *current = to.clone();
            to
        };
        // Relaxed: it only tells `quota_of` to read `current`, under `current`'s mutex.
        changed.store(true, Ordering::Relaxed);
        // The keys cannot change meanwhile: insertions and evictions wait for the index's lock.
        let keys = self.store.keys();
        let mut filed = alloc::vec::Vec::with_capacity(keys.len());
        for key in keys {
            let at = self.store.change(&key, |e, retired| {
                if Arc::ptr_eq(&e.limiter, &to) {
                    return (Change::Keep, e.full_at());
                }
                let (moved, at) = e.moved_to(&to, carry, retired);
                (Change::Replace(moved), at)
            });
            if let Some(at) = at {
                filed.push((key, at));
            }
        }
        // Every instant moved: the index is filed anew, one entry per key.
        due.refile(filed);
        true
    }

    fn limiter_for(&self, quota: Quota) -> Arc<L> {
        match &self.quotas {
            Quotas::Shared { current, .. } => current
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
            Quotas::PerKey {
                by_quota,
                made,
                sweep_after,
                ..
            } => {
                let mut new = false;
                let limiter = by_quota
                    .entry(quota)
                    .or_insert_with(|| {
                        new = true;
                        Arc::new((self.make)(quota))
                    })
                    .clone();
                // Relaxed, here and below: a count that only says when to sweep; a sweep is
                // right whenever it runs.
                if new
                    && made.fetch_add(1, Ordering::Relaxed) + 1
                        >= sweep_after.load(Ordering::Relaxed)
                {
                    // A store that frees a removed entry later (the lock-free one, once no check
                    // can still read it) leaves its limiter's count up when `forget_unused`
                    // looks: such limiters are dropped here. The map doubles at most between
                    // sweeps, so each limiter made pays for a bounded share of them.
                    by_quota.retain(|_, limiter| Arc::strong_count(limiter) > 1);
                    made.store(0, Ordering::Relaxed);
                    sweep_after.store(by_quota.len().max(SWEEP_FLOOR), Ordering::Relaxed);
                }
                limiter
            }
        }
    }

    /// Drops the shared limiter of `quota` if no held key uses it any more. The check runs under
    /// the map's shard lock, where every new user of it is made, so none can appear meanwhile.
    fn forget_unused(&self, quota: &Quota) {
        if let Quotas::PerKey { by_quota, .. } = &self.quotas {
            by_quota.remove_if(quota, |_, limiter| Arc::strong_count(limiter) == 1);
        }
    }

    /// Takes a place for a new key, evicting a full bucket when at the cap. `Err` tells when the
    /// soonest held bucket is full again, in ns from now.
    fn take_place(&self, due: &mut DueQueue<K>) -> Result<(), NoRoom> {
        loop {
            // Relaxed: the count's RMWs alone keep it exact; it guards no other memory. Never
            // above the cap, even for a moment.
            if self
                .count
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                    (c < self.max_keys).then_some(c + 1)
                })
                .is_ok()
            {
                return Ok(());
            }
            self.evict_one(due)?;
        }
    }

    /// Evicts the held key whose bucket is full soonest, if it is full now.
    fn evict_one(&self, due: &mut DueQueue<K>) -> Result<(), NoRoom> {
        due.evict_one(
            |key| match self.store.change(key, |e, retired| evict(e, retired)) {
                None => Front::Gone,
                Some(Evict::Removed(quota)) => {
                    // Relaxed: as in `take_place`.
                    self.count.fetch_sub(1, Ordering::Relaxed);
                    self.forget_unused(&quota);
                    Front::Evicted
                }
                Some(Evict::Held { at, wait }) => Front::FullAt { at, wait },
            },
        )
    }

    /// Drops the keys whose bucket is full again (they lose nothing: a full bucket is a fresh one);
    /// returns how many.
    pub fn retain_recent(&self) -> usize {
        // Held throughout, as every change that removes keys holds it.
        let mut due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
        let mut removed = 0;
        for key in self.store.keys() {
            if let Some(Evict::Removed(_)) = self.store.change(&key, |e, retired| evict(e, retired))
            {
                removed += 1;
            }
        }
        // Relaxed: as in `take_place`.
        self.count.fetch_sub(removed, Ordering::Relaxed);
        if let Quotas::PerKey { by_quota, .. } = &self.quotas {
            by_quota.retain(|_, limiter| Arc::strong_count(limiter) > 1);
        }
        due.retain(|key| self.store.with_existing(key, |_, _| ()).is_some());
        removed
    }

    /// [`Keyed::retain_recent`], then gives the freed memory back.
    pub fn shrink(&self) -> usize {
        let removed = self.retain_recent();
        self.store.shrink_to_fit();
        if let Quotas::PerKey { by_quota, .. } = &self.quotas {
            by_quota.shrink_to_fit();
        }
        self.due
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .shrink_to_fit();
        removed
    }

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

    /// The quota `key` is checked on: the one quota, or what the quota function gives it (called
    /// again: a header that states the policy asks for it per response).
    pub fn quota_of(&self, key: &K) -> Quota {
        match &self.quotas {
            Quotas::Shared {
                first,
                current,
                changed,
            } => shared_quota(&**first, current, changed),
            Quotas::PerKey { quota_for, .. } => quota_for(key),
        }
    }
}

/// What an eviction made of a held key.
enum Evict {
    /// Removed: its bucket was full (the quota it was on).
    Removed(Quota),
    /// Kept: full again at the instant `at`, `wait` ns from now.
    Held { at: u64, wait: u64 },
}

impl Evict {
    /// `e` as it stands: full again at `at`, `wait` ns from now (0: full now).
    fn held<L: KeyedLimiter>(e: &KeyEntry<L>) -> Evict {
        // Read before the peek reads its own: `at` is not later than the instant the bucket is
        // full, and `wait` from now is not shorter.
        let t = e.limiter.now_ns();
        let wait = e.reset_ns();
        Evict::Held {
            at: t.saturating_add(wait),
            wait,
        }
    }
}

/// The change that evicts `e` if its bucket is full now. Where checks run beside the change, the
/// entry is retired and the last word looked at again: a check that took a token after the first
/// look keeps the key (put back with that word), so an eviction never forgets an admission.
fn evict<L: KeyedLimiter>(
    e: &KeyEntry<L>,
    retired: Option<&Retired>,
) -> (Change<KeyEntry<L>>, Evict) {
    let quota = e.limiter.quota();
    match Evict::held(e) {
        Evict::Held { wait: 0, .. } if retired.is_none() => {
            // Decided with the entry held exclusively: nobody drained it in between.
            (Change::Remove, Evict::Removed(quota))
        }
        Evict::Held { wait: 0, .. } => {
            let last = KeyEntry {
                state: KeyState(StateCell::new(e.retire(retired))),
                limiter: e.limiter.clone(),
            };
            match Evict::held(&last) {
                Evict::Held { wait: 0, .. } => (Change::Remove, Evict::Removed(quota)),
                held => (Change::Replace(last), held),
            }
        }
        held => (Change::Keep, held),
    }
}

/// The quota new keys of a table with one quota take.
fn shared_quota<L: KeyedLimiter>(
    first: &L,
    current: &Mutex<Arc<L>>,
    changed: &AtomicBool,
) -> Quota {
    // Relaxed: a quota read moments before a change is as good as one read moments after;
    // `current` itself is read under its mutex.
    if changed.load(Ordering::Relaxed) {
        current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .quota()
    } else {
        first.quota()
    }
}

fn duration_ns(d: core::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(all(test, not(atomic_limiter_loom)))]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

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
}
