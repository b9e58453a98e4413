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
