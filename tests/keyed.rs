//! Keyed limiters on dashmap (the default store): bounded memory under
//! floods, eviction that never over-admits, racing inserts.

use dashmap::DashMap;

/// The store these tests run on.
type Store<K, V> = DashMap<K, V, KeyHasher>;

fn store<K: std::hash::Hash + Eq + Clone, V>() -> Store<K, V> {
    DashMap::with_hasher(KeyHasher::new())
}

include!("keyed_body/mod.rs");
