//! A key's first entry: a place under the cap, a fresh limiter filed in the eviction index,
//! and the first check on it ([`Keyed::check_new`]); a change that inserts a key it does not find
//! (`admin`) takes the same path ([`Keyed::insert_new`]).

use alloc::borrow::ToOwned;
use core::borrow::Borrow;
use core::hash::Hash;
use std::sync::PoisonError;

use super::due::{DueQueue, NoRoom};
use super::entry::{KeyEntry, duration_ns};
use super::store::{KeyedStore, Retired};
use super::table::Keyed;
use crate::decision::{Decision, Detail};
use crate::limiter::shared::KeyedLimiter;
use crate::quota::{InsufficientCapacity, Quota};
use crate::sync::{AtomicUsize, MutexGuard, Ordering};

/// The refusal of a new key at the cap: `no_room` says when the soonest held bucket is full again
/// (measured from the held key's own rounded reset, so resolution 1).
fn table_full(no_room: NoRoom, quota: &Quota) -> Decision {
    Decision::new(
        false,
        1,
        Detail::TableFull {
            retry_ns: no_room.unwrap_or(1),
            limit: quota.burst(),
        },
    )
}

/// A place taken under the cap for a key not yet held: given back when dropped, as by an
/// insertion that lost its race or unwound (a caller's `Clone` or `Hash` of the key panicked), so
/// that a panic never shrinks the cap.
struct Place<'a>(&'a AtomicUsize);

impl Place<'_> {
    /// The key is held: the place stays taken.
    fn keep(self) {
        core::mem::forget(self);
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        // Relaxed: as in `take_place`.
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<K: Hash + Eq + Clone, L: KeyedLimiter, M: KeyedStore<K, KeyEntry<L>>> Keyed<K, L, M> {
    /// A key not (or no longer) held: take a place, insert a fresh limiter, check it. `serialised`
    /// is false only in a loom model's broken twin.
    #[cold]
    #[inline(never)]
    pub(super) fn check_new<Q>(
        &self,
        key: &Q,
        n: u32,
        serialised: bool,
    ) -> Result<Decision, InsufficientCapacity>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // The key as stored is made from a borrowed form (`&str`) only when needed: by a quota
        // function (which takes the stored form), else once the key has a place.
        let mut owned: Option<K> = None;
        let quota = self.quota_for_new(key, &mut owned);
        InsufficientCapacity::check(n, quota.burst())?;
        if n == 0 {
            // A peek at a key not held: a fresh bucket is full. Nothing is inserted.
            return Ok(Decision::new(
                true,
                1,
                Detail::Eager {
                    remaining: quota.burst(),
                    retry_ns: 0,
                    reset_ns: 0,
                    limit: quota.burst(),
                },
            ));
        }
        // Every insertion runs under the index's lock, from taking a place to filing the key. So a
        // thread that finds the table full cannot have raced an insertion of its own key: it looks
        // again under the lock, and finds the key there or is the one to insert it.
        let due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
        if serialised {
            // Under the index's lock no entry is retired: every change that retires one
            // replaces or removes it before letting go.
            if let Some(answer) = self
                .store
                .with_existing(key, |e, retired| e.check(n, retired))
            {
                return answer.unwrap_or_else(|| Ok(Decision::never(0)));
            }
        }
        let answer = self.insert_new(due, key, owned, quota, serialised, |e, retired, before| {
            let answer = e.check(n, retired);
            // Full again at the latest when this first check's debt is paid; re-filed if used.
            let at = answer
                .unwrap_or_else(|| Ok(Decision::never(0)))
                .map_or(before, |d| {
                    before.saturating_add(duration_ns(d.reset_after()))
                });
            (answer, at)
        });
        match answer {
            // A fresh entry is not retired (see above); were it to be, the check refuses.
            Ok(answer) => answer.unwrap_or_else(|| Ok(Decision::never(0))),
            Err(full) => Ok(full),
        }
    }

    /// Gives `key` (`owned`, if made already) a place and a fresh entry under `quota`, and runs `f`
    /// on the entry inserted with a reading taken before it; a full table's refusal if no place is
    /// free. `due` is the index's lock, taken by the caller before it last looked for the key.
    /// `f` answers with the instant the key is filed at (when it is full again). Unless
    /// `serialised`, the lock is let go before the insertion (the loom twin's unserialised
    /// insertions): another thread may then insert the key first, `f` runs on its entry, and the
    /// place goes back.
    pub(super) fn insert_new<Q, R>(
        &self,
        mut due: MutexGuard<'_, DueQueue<K>>,
        key: &Q,
        owned: Option<K>,
        quota: Quota,
        serialised: bool,
        f: impl FnOnce(&KeyEntry<L>, Option<&Retired>, u64) -> (R, u64),
    ) -> Result<R, Decision>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if let Err(no_room) = self.take_place(&mut due) {
            return Err(table_full(no_room, &quota));
        }
        // Given back unless the key ends up held (the caller's `Clone` or `Hash` of it may panic).
        let place = Place(&self.count);
        let due = serialised.then_some(due);
        // Only now, with a place, is anything allocated for the key.
        let key: K = owned.unwrap_or_else(|| key.to_owned());
        let limiter = self.limiter_for(quota);
        // Read before `f` reads its own, so the instant filed is a lower bound.
        let before = limiter.now_ns();
        let ((answer, at), inserted) = self.store.with_inserted(
            key.clone(),
            || KeyEntry {
                state: limiter.fresh_state(),
                limiter: limiter.clone(),
            },
            |e, retired| f(e, retired, before),
        );
        if inserted {
            place.keep();
            due.unwrap_or_else(|| self.due.lock().unwrap_or_else(PoisonError::into_inner))
                .push(key, at);
        } else {
            // Another thread inserted the key first, which only the loom twin's unserialised
            // insertions let happen: give the place back, and the limiter made for it (forgotten
            // if no held key uses it).
            drop(place);
            drop(limiter);
            self.forget_unused(&quota);
        }
        Ok(answer)
    }

    /// The quota a key not held gets: the table's, or the quota function's (which takes the
    /// stored form of the key, made into `owned` for it).
    pub(super) fn quota_for_new<Q>(&self, key: &Q, owned: &mut Option<K>) -> Quota
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.quota_by(|quota_for| quota_for(owned.insert(key.to_owned())))
    }
}
