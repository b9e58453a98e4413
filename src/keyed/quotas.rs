//! The quota of each key: one for all, or one per key from a function, changed at run time.

use super::KeyHasher;
use super::entry::KeyEntry;
use super::store::{Change, KeyedStore};
use super::table::Keyed;
use crate::limiter::shared::KeyedLimiter;
use alloc::boxed::Box;
use core::hash::Hash;

use dashmap::DashMap;

use crate::limiter::algorithm::Carry;
use crate::quota::Quota;
use crate::sync::{Arc, AtomicBool, AtomicUsize, Mutex, Ordering};
use std::sync::PoisonError;

/// A function giving each key its quota.
pub type QuotaFn<K> = Box<dyn Fn(&K) -> Quota + Send + Sync>;

/// The fewest limiters made between two sweeps of a quota function's limiters.
pub(super) const SWEEP_FLOOR: usize = 64;

/// The quota of each key of a [`Keyed`] limiter: one for all, or one per key from a function.
pub enum KeyQuotas<K> {
    /// Every key on this quota (one limiter serves them all).
    Every(Quota),
    /// Each key on the quota the function gives it (keys with equal quotas share a limiter).
    PerKey(QuotaFn<K>),
}

/// How a `Keyed` finds a key's limiter.
pub(super) enum Quotas<K, L> {
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

impl<K: Hash + Eq + Clone, L: KeyedLimiter, M: KeyedStore<K, KeyEntry<L>>> Keyed<K, L, M> {
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

    pub(super) fn limiter_for(&self, quota: Quota) -> Arc<L> {
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
    pub(super) fn forget_unused(&self, quota: &Quota) {
        if let Quotas::PerKey { by_quota, .. } = &self.quotas {
            by_quota.remove_if(quota, |_, limiter| Arc::strong_count(limiter) == 1);
        }
    }

    /// The quota `key` is checked on: the one quota, or what the quota function gives it (called
    /// again: a header that states the policy asks for it per response).
    pub fn quota_of(&self, key: &K) -> Quota {
        self.quota_by(|quota_for| quota_for(key))
    }

    /// The table's one quota, or what `per_key` makes of the quota function.
    pub(super) fn quota_by(&self, per_key: impl FnOnce(&QuotaFn<K>) -> Quota) -> Quota {
        match &self.quotas {
            Quotas::Shared {
                first,
                current,
                changed,
            } => shared_quota(&**first, current, changed),
            Quotas::PerKey { quota_for, .. } => per_key(quota_for),
        }
    }
}

/// The quota new keys of a table with one quota take.
pub(super) fn shared_quota<L: KeyedLimiter>(
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
