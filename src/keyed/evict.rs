//! Bounded memory: a place taken per new key, and the full buckets evicted at the cap.

use super::entry::KeyEntry;
use super::quotas::Quotas;
use super::store::{Change, KeyedStore, Retired};
use super::table::Keyed;
use crate::limiter::shared::KeyedLimiter;
use core::hash::Hash;

use crate::keyed::due::{DueQueue, Front, NoRoom};
use crate::limiter::shared::engine::KeyState;
use crate::quota::Quota;
use crate::state_cell::StateCell;
use crate::sync::{Arc, Ordering};
use std::sync::PoisonError;

impl<K: Hash + Eq + Clone, L: KeyedLimiter, M: KeyedStore<K, KeyEntry<L>>> Keyed<K, L, M> {
    /// Takes a place for a new key, evicting a full bucket when at the cap. `Err` tells when the
    /// soonest held bucket is full again, in ns from now.
    pub(super) fn take_place(&self, due: &mut DueQueue<K>) -> Result<(), NoRoom> {
        loop {
            // Relaxed: the count's RMWs alone keep it exact; it guards no other memory. Never
            // above the cap, even for a moment.
            if self
                .count
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                    (c < self.max_keys).then_some(c + 1)
                })
                .is_ok()
            {
                return Ok(());
            }
            self.evict_one(due)?;
        }
    }

    /// Evicts the held key whose bucket is full soonest, if it is full now.
    pub(super) fn evict_one(&self, due: &mut DueQueue<K>) -> Result<(), NoRoom> {
        due.evict_one(
            |key| match self.store.change(key, |e, retired| evict(e, retired)) {
                None => Front::Gone,
                Some(Evict::Removed(quota)) => {
                    // Relaxed: as in `take_place`.
                    self.count.fetch_sub(1, Ordering::Relaxed);
                    self.forget_unused(&quota);
                    Front::Evicted
                }
                Some(Evict::Held { at, wait }) => Front::FullAt { at, wait },
            },
        )
    }

    /// Drops the keys whose bucket is full again (they lose nothing: a full bucket is a fresh one);
    /// returns how many.
    pub fn retain_recent(&self) -> usize {
        // Held throughout, as every change that removes keys holds it.
        let mut due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
        let mut removed = 0;
        for key in self.store.keys() {
            if let Some(Evict::Removed(_)) = self.store.change(&key, |e, retired| evict(e, retired))
            {
                removed += 1;
            }
        }
        // Relaxed: as in `take_place`.
        self.count.fetch_sub(removed, Ordering::Relaxed);
        if let Quotas::PerKey { by_quota, .. } = &self.quotas {
            by_quota.retain(|_, limiter| Arc::strong_count(limiter) > 1);
        }
        due.retain(|key| self.store.with_existing(key, |_, _| ()).is_some());
        removed
    }

    /// [`Keyed::retain_recent`], then gives the freed memory back.
    pub fn shrink(&self) -> usize {
        let removed = self.retain_recent();
        self.store.shrink_to_fit();
        if let Quotas::PerKey { by_quota, .. } = &self.quotas {
            by_quota.shrink_to_fit();
        }
        self.due
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .shrink_to_fit();
        removed
    }
}

/// What an eviction made of a held key.
pub(super) enum Evict {
    /// Removed: its bucket was full (the quota it was on).
    Removed(Quota),
    /// Kept: full again at the instant `at`, `wait` ns from now.
    Held { at: u64, wait: u64 },
}

impl Evict {
    /// `e` as it stands: full again at `at`, `wait` ns from now (0: full now).
    pub(super) fn held<L: KeyedLimiter>(e: &KeyEntry<L>) -> Evict {
        // Read before the peek reads its own: `at` is not later than the instant the bucket is
        // full, and `wait` from now is not shorter.
        let t = e.limiter.now_ns();
        let wait = e.reset_ns();
        Evict::Held {
            at: t.saturating_add(wait),
            wait,
        }
    }
}

/// The change that evicts `e` if its bucket is full now. Where checks run beside the change, the
/// entry is retired and the last word looked at again: a check that took a token after the first
/// look keeps the key (put back with that word), so an eviction never forgets an admission.
pub(super) fn evict<L: KeyedLimiter>(
    e: &KeyEntry<L>,
    retired: Option<&Retired>,
) -> (Change<KeyEntry<L>>, Evict) {
    let quota = e.limiter.quota();
    match Evict::held(e) {
        Evict::Held { wait: 0, .. } if retired.is_none() => {
            // Decided with the entry held exclusively: nobody drained it in between.
            (Change::Remove, Evict::Removed(quota))
        }
        Evict::Held { wait: 0, .. } => {
            let last = KeyEntry {
                state: KeyState(StateCell::new(e.retire(retired))),
                limiter: e.limiter.clone(),
            };
            match Evict::held(&last) {
                Evict::Held { wait: 0, .. } => (Change::Remove, Evict::Removed(quota)),
                held => (Change::Replace(last), held),
            }
        }
        held => (Change::Keep, held),
    }
}
