//! [`Pinned`]: checks on a lock-free keyed table through one entry into its map's epoch, held
//! across them.

use alloc::borrow::ToOwned;
use core::borrow::Borrow;
use core::hash::{BuildHasher, Hash};

use crate::decision::Decision;
use crate::keyed::KeyEntry;
use crate::keyed::store::{HeldPin, LockFreeStore};
use crate::keyed::table::{Keyed, one_token};
use crate::limiter::shared::KeyedLimiter;
use crate::quota::InsufficientCapacity;

/// Checks a handle makes on one entry into the epoch before it leaves and enters again, letting
/// go of what the table removed meanwhile. Leaving costs one atomic swap: every 64 checks, it is
/// a fraction of a nanosecond a check.
const RENEW_AFTER: u32 = 64;

/// Many checks in a row on one thread, on a [`Keyed`] table on the [`LockFreeStore`]: the map's
/// epoch is entered once for them all, where [`Keyed::check_key`] enters and leaves it for each
/// (the leaving is an atomic swap, the largest cost of a lookup after the state word's own
/// compare-and-swap). Every answer is the one `check_key` would give. A handle also remembers the
/// key it found last, so a run of checks on one key (a client's burst, a flood from one address)
/// skips the hash and the lookup.
///
/// **What it holds.** While a handle is in the epoch, what the table removes or replaces (evicted
/// keys, keys moved to a new quota, the map's old array after it grows) is kept instead of freed.
/// A handle leaves and enters again every 64 of its checks, so what one pins is what the whole
/// table removed during 64 of its checks; a handle that makes no checks pins what the table
/// removes for as long as it is kept. Keep one for a batch of checks, not across a wait: it is not
/// `Send`, so it cannot be held across an `.await` in a task that may move between threads. Two
/// handles on one thread keep each other in the epoch until one is dropped.
///
/// # Examples
///
/// Ten requests from one client in a row, through one handle, at five a second:
///
/// ```
/// use atomic_limiter::keyed::{KeyHasher, LockFreeStore};
/// use atomic_limiter::{Gcra, KeyQuotas, Keyed, ManualClock, Quota};
///
/// let clock = ManualClock::new();
/// let keyed = Keyed::with_store(
///     LockFreeStore::with_hasher(KeyHasher::new()),
///     100_000,
///     KeyQuotas::Every(Quota::per_second(5)),
///     move |q| Gcra::with_clock(q, clock.clone()),
/// );
/// let mut pinned = keyed.pinned();
/// let admitted = (0..10).filter(|_| pinned.check_key(&"10.0.0.7").is_allowed()).count();
/// assert_eq!(admitted, 5);
/// ```
///
/// A handle stays on the thread that made it:
///
/// ```compile_fail,E0277
/// use atomic_limiter::keyed::{KeyHasher, LockFreeStore};
/// use atomic_limiter::{Gcra, KeyQuotas, Keyed, Quota};
///
/// let keyed = Keyed::with_store(
///     LockFreeStore::with_hasher(KeyHasher::new()),
///     100,
///     KeyQuotas::Every(Quota::per_second(5)),
///     Gcra::new,
/// );
/// let mut pinned = keyed.pinned();
/// assert!(pinned.check_key(&1_u64).is_allowed());
/// std::thread::scope(|s| {
///     s.spawn(move || pinned.check_key(&1_u64));
/// });
/// ```
pub struct Pinned<'a, K, L, S> {
    keyed: &'a Keyed<K, L, LockFreeStore<K, KeyEntry<L>, S>>,
    pin: HeldPin<'a, K, KeyEntry<L>, S>,
    /// Checks made on the current entry into the epoch.
    checks: u32,
}

impl<K, L, S> core::fmt::Debug for Pinned<'_, K, L, S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Pinned")
            .field("checks", &self.checks)
            .finish_non_exhaustive()
    }
}

impl<K, L, S> Keyed<K, L, LockFreeStore<K, KeyEntry<L>, S>>
where
    K: Hash + Eq + Clone,
    L: KeyedLimiter,
    S: BuildHasher,
{
    /// A handle for many checks in a row on this thread, each as [`Keyed::check_key`] would make
    /// it, entering the map's epoch once for them all ([`Pinned`] says what it holds meanwhile).
    pub fn pinned(&self) -> Pinned<'_, K, L, S> {
        Pinned {
            keyed: self,
            pin: self.store.held_pin(),
            checks: 0,
        }
    }
}

impl<K, L, S> Pinned<'_, K, L, S>
where
    K: Hash + Eq + Clone,
    L: KeyedLimiter,
    S: BuildHasher,
{
    /// [`Keyed::check_key`].
    #[inline]
    pub fn check_key<Q>(&mut self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.count_check();
        self.keyed
            .check_key_via(&self.pin, key, 1, |_, _| None, one_token)
    }

    /// [`Keyed::check_key_n`].
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] if `n` exceeds the key's burst (the key is not added).
    #[inline]
    pub fn check_key_n<Q>(&mut self, key: &Q, n: u32) -> Result<Decision, InsufficientCapacity>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.count_check();
        self.keyed
            .check_key_via(&self.pin, key, n, |_, _| None, |answer| answer)
    }

    /// Counts a check, and every [`RENEW_AFTER`] checks leaves the epoch and enters it again.
    #[inline(always)]
    fn count_check(&mut self) {
        self.checks += 1;
        if self.checks >= RENEW_AFTER {
            self.checks = 0;
            self.pin.renew();
        }
    }
}
