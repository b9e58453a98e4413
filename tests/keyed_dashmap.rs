//! Keyed limiters on dashmap: every test `tests/keyed.rs` runs on the default store.

use dashmap::DashMap;

/// The store these tests run on.
type Store<K, V> = DashMap<K, V, KeyHasher>;

fn store<K: std::hash::Hash + Eq + Clone, V>() -> Store<K, V> {
    DashMap::with_hasher(KeyHasher::new())
}

include!("keyed_body/mod.rs");
