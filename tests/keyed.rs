//! Keyed limiters on the default store (`FlatStore`): bounded memory under floods, eviction that
//! never over-admits, racing inserts. `keyed_dashmap.rs` runs the same tests on dashmap.

use atomic_limiter::keyed::FlatStore;

/// The store these tests run on.
type Store<K, V> = FlatStore<K, V, KeyHasher>;

fn store<K: std::hash::Hash + Eq + Clone, V>() -> Store<K, V> {
    FlatStore::with_hasher(KeyHasher::new())
}

include!("keyed_body/mod.rs");
