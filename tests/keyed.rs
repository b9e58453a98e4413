//! Keyed limiters on dashmap (the default store): bounded memory under floods, eviction that never
//! over-admits, racing inserts.

use atomic_limiter::keyed::{Change, KeyEntry, KeyHasher, KeyedLimiter, KeyedStore, Retired};
use atomic_limiter::{
    Clock, Decision, Gcra, InsufficientCapacity, KeyQuotas, Keyed, ManualClock, Quota, RateLimiter,
    TokenBucket,
};
use dashmap::DashMap;
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Barrier;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::thread;
use std::time::Duration;

/// The store these tests run on.
type Store<K, V> = DashMap<K, V, KeyHasher>;

fn store<K: std::hash::Hash + Eq + Clone, V>() -> Store<K, V> {
    DashMap::with_hasher(KeyHasher::new())
}

include!("keyed_body/mod.rs");
