//! Keyed limiters on the lock-free store: every test `tests/keyed.rs` runs on dashmap, with checks
//! that run beside the changes that retire their entries.

use atomic_limiter::keyed::LockFreeStore;

/// The store these tests run on.
type Store<K, V> = LockFreeStore<K, V, KeyHasher>;

fn store<K: std::hash::Hash + Eq + Clone, V>() -> Store<K, V> {
    LockFreeStore::with_hasher(KeyHasher::new())
}

include!("keyed_body/mod.rs");
