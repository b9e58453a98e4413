//! The hooks the loom models need and no user does: each protocol's broken twin (so that a model
//! shows it catches the bug it is for) and a raw state word. Built only under the
//! `atomic_limiter_loom` cfg, as `fuzz_api` is only under `fuzzing`; the hooks themselves stay
//! crate-private in the rooms they test.

use core::time::Duration;

use crate::clock::Clock;
use crate::decision::Decision;
use crate::gcra::reservation::Reservation;
use crate::gcra::throttle::{Throttle, ThrottleError};
use crate::limiter::Limiter;
use crate::limiter::algorithm::Algorithm;

/// `check_n` with the CAS replaced by a load and a store.
pub fn broken_check_n<A: Algorithm, C: Clock>(limiter: &Limiter<A, C>, n: u32) -> Decision {
    limiter.loom_broken_check_n(n)
}

/// The raw state word.
pub fn state<A: Algorithm, C: Clock>(limiter: &Limiter<A, C>) -> u64 {
    limiter.loom_state()
}

/// A reservation with the CAS replaced by a load and a store.
///
/// # Errors
///
/// As [`Throttle::reserve`].
pub fn broken_reserve<C: Clock>(
    throttle: &Throttle<C>,
    max_wait: Duration,
) -> Result<Reservation<'_, C>, ThrottleError> {
    throttle.loom_broken_reserve(max_wait)
}

/// A refund with the CAS replaced by a load and a store.
pub fn broken_refund<C: Clock>(reservation: Reservation<'_, C>) -> bool {
    reservation.loom_broken_refund()
}

/// A settlement with the CAS replaced by a load and a store.
pub fn broken_settle<A: crate::limiter::algorithm::Continuous, C: Clock>(
    charge: crate::limiter::charge::Charge<'_, A, C>,
    actual: u32,
) {
    charge.loom_broken_settle(actual);
}

/// A calendar window's check of one token with the CAS replaced by a load and a store: whether
/// it was admitted.
pub fn calendar_broken_check<C: Clock>(
    window: &crate::window::calendar::CalendarWindow<C>,
) -> bool {
    window.loom_broken_check()
}

/// A lease word (the `redis` wing's hot path, `limiter::lease`) on its own, so that its spend,
/// refill and give-back are modelled without a store. Ticks are passed in.
#[derive(Debug)]
pub struct LeaseWord(crate::state_cell::StateCell);

impl LeaseWord {
    /// A lease of `tokens` that may be spent before tick `expiry`.
    pub fn granted(expiry: u64, tokens: u32) -> LeaseWord {
        let word = crate::state_cell::StateCell::new(0);
        word.update(|w| crate::limiter::lease::add(w, 0, expiry, tokens));
        LeaseWord(word)
    }

    /// Takes `n` at `now`: the expiry of the lease they were spent from, or `None` if refused.
    pub fn spend(&self, now: u64, n: u32) -> Option<u64> {
        match self.0.update(|w| crate::limiter::lease::spend(w, now, n)) {
            crate::limiter::lease::Spend::Spent { expiry, .. } => Some(expiry),
            crate::limiter::lease::Spend::Short { .. } => None,
        }
    }

    /// A refill of `n` that expires at `expiry`, merged at `now`.
    pub fn refill(&self, now: u64, expiry: u64, n: u32) {
        self.0
            .update(|w| crate::limiter::lease::add(w, now, expiry, n));
    }

    /// Gives back `n` spent from a lease expiring at `spent_expiry`: whether they went back.
    pub fn give_back(&self, now: u64, spent_expiry: u64, n: u32) -> bool {
        self.0
            .update(|w| crate::limiter::lease::give_back(w, now, spent_expiry, n))
    }

    /// [`LeaseWord::give_back`] with the CAS replaced by a load and a store.
    pub fn broken_give_back(&self, now: u64, spent_expiry: u64, n: u32) -> bool {
        self.0
            .update_racy(|w| crate::limiter::lease::give_back(w, now, spent_expiry, n))
    }
}

#[cfg(feature = "std")]
pub use self::with_std::*;

#[cfg(feature = "std")]
mod with_std {
    use core::borrow::Borrow;
    use core::hash::Hash;

    use crate::clock::Clock;
    use crate::decision::Decision;
    use crate::keyed::table::Keyed;
    use crate::keyed::{KeyEntry, KeyedStore};
    use crate::limiter::algorithm::{Carry, Continuous, Retunable};
    use crate::limiter::shared::KeyedLimiter;
    use crate::quota::Quota;
    use crate::reconfigure::{Reconfigurable, ReconfigurableSharded};
    use crate::sharded::Sharded;

    /// The first check of a key as it was before insertions were serialised.
    pub fn keyed_broken_check_key<K, L, M, Q>(keyed: &Keyed<K, L, M>, key: &Q) -> Decision
    where
        K: Hash + Eq + Clone + Borrow<Q>,
        L: KeyedLimiter,
        M: KeyedStore<K, KeyEntry<L>>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        keyed.loom_broken_check_key(key)
    }

    /// The default store, or its broken twin whose growth copies entries without retiring them.
    pub fn flat_store<K, V>(broken: bool) -> crate::keyed::FlatStore<K, V> {
        // Fixed seeds: a model must place its keys the same way in every run.
        let hasher = crate::keyed::KeyHasher::with_seeds(1, 2, 3, 4);
        let store = crate::keyed::FlatStore::with_hasher(hasher);
        if broken { store.loom_broken() } else { store }
    }

    /// The one-quota fast path without looking whether a change has moved the key.
    pub fn keyed_unchecked_check_key<K, L, M>(keyed: &Keyed<K, L, M>, key: &K) -> Decision
    where
        K: Hash + Eq + Clone,
        L: KeyedLimiter,
        M: KeyedStore<K, KeyEntry<L>>,
    {
        keyed.loom_unchecked_check_key(key)
    }

    /// A gather of `n` from `home` that fails without giving back what it took.
    pub fn sharded_gather_keeping_what_it_took<L: KeyedLimiter>(
        sharded: &Sharded<L>,
        home: usize,
        n: u32,
    ) -> Option<Decision> {
        sharded.loom_gather_keeping_what_it_took(home, n)
    }

    /// The sharded check with `broken` in place of the other shards' `check_n`.
    pub fn sharded_check_with<L: KeyedLimiter>(
        sharded: &Sharded<L>,
        home: usize,
        n: u32,
        broken: impl Fn(&L, u32) -> Decision,
    ) -> Decision {
        sharded.loom_check_with(home, n, broken)
    }

    /// A change of quota that reads the old word instead of retiring it.
    pub fn broken_set_quota<A, C>(limiter: &Reconfigurable<A, C>, quota: Quota, carry: Carry)
    where
        A: Retunable + Continuous + 'static,
        C: Clock + Clone + Send + Sync + 'static,
    {
        limiter.loom_broken_set_quota(quota, carry);
    }

    /// A change of a sharded limiter's quota that reads the old words instead of retiring them.
    pub fn sharded_broken_set_quota<A, C>(
        limiter: &ReconfigurableSharded<A, C>,
        quota: Quota,
        carry: Carry,
    ) where
        A: Retunable + Continuous + 'static,
        C: Clock + Clone + Send + Sync + 'static,
    {
        limiter.loom_broken_set_quota(quota, carry);
    }
}
