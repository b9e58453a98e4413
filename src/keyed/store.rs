use core::borrow::Borrow;
use core::hash::{BuildHasher, Hash};

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;

/// The map a [`Keyed`](crate::Keyed) limiter keeps its keys in: [`DashMap`] by default; the loom
/// models put a map loom can see in its place (dashmap's locks are invisible to loom).
pub trait KeyedStore<K, V> {
    /// Runs `f` on the key's value if it is there: the hot path, one lookup, no allocation. The
    /// key may be given in any form the stored key borrows as (`&str` for `String` keys).
    fn with_existing<Q, R>(&self, key: &Q, f: impl FnOnce(&V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized;

    /// Runs `f` on the key's value with the key held exclusively (no check on it can run
    /// meanwhile), if it is there.
    fn with_existing_mut<R>(&self, key: &K, f: impl FnOnce(&mut V) -> R) -> Option<R>;

    /// Runs `f` on the key's value, inserting `make()` first if it is absent, such that racing
    /// threads all see the one value that was inserted. Returns whether this call inserted it.
    fn with_inserted<R>(
        &self,
        key: K,
        make: impl FnOnce() -> V,
        f: impl FnOnce(&V) -> R,
    ) -> (R, bool);

    /// Runs `f` on every value, each with its key held exclusively (no check on it can run
    /// meanwhile).
    fn update_all(&self, f: impl FnMut(&K, &mut V));

    /// Removes every entry for which `remove` says so (decided with the entry locked against
    /// concurrent checks).
    fn remove_where(&self, remove: impl FnMut(&K, &V) -> bool);

    /// Removes the key's entry if `remove` says so, decided with the entry locked against
    /// concurrent checks; returns whether it was removed.
    fn remove_if(&self, key: &K, remove: impl FnOnce(&V) -> bool) -> bool;

    /// Frees memory left by removed entries, if the map can.
    fn shrink_to_fit(&self) {}
}

impl<K: Eq + Hash, V, S: BuildHasher + Clone> KeyedStore<K, V> for DashMap<K, V, S> {
    #[inline]
    fn with_existing<Q, R>(&self, key: &Q, f: impl FnOnce(&V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get(key).map(|v| f(&v))
    }

    fn with_existing_mut<R>(&self, key: &K, f: impl FnOnce(&mut V) -> R) -> Option<R> {
        // The shard's write lock is held while `f` runs.
        self.get_mut(key).map(|mut v| f(&mut v))
    }

    fn with_inserted<R>(
        &self,
        key: K,
        make: impl FnOnce() -> V,
        f: impl FnOnce(&V) -> R,
    ) -> (R, bool) {
        // The shard's write lock is held from the lookup to the insertion, so only one thread
        // inserts; then the guard is downgraded so checks on the shard's other keys can go on.
        match self.entry(key) {
            Entry::Occupied(o) => (f(&o.into_ref().downgrade()), false),
            Entry::Vacant(v) => (f(&v.insert(make()).downgrade()), true),
        }
    }

    fn update_all(&self, mut f: impl FnMut(&K, &mut V)) {
        // Each shard's write lock is held while its values are changed.
        self.retain(|k, v| {
            f(k, v);
            true
        });
    }

    fn remove_where(&self, mut remove: impl FnMut(&K, &V) -> bool) {
        self.retain(|k, v| !remove(k, v));
    }

    fn remove_if(&self, key: &K, remove: impl FnOnce(&V) -> bool) -> bool {
        // The shard's write lock is held while `remove` decides.
        DashMap::remove_if(self, key, |_, v| remove(v)).is_some()
    }

    fn shrink_to_fit(&self) {
        DashMap::shrink_to_fit(self);
    }
}
