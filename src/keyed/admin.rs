//! A key administered and charged on a GCRA table: [`Keyed::charge_key`] and its [`KeyCharge`],
//! and an operator's [`Keyed::reset`], [`Keyed::remove`], [`Keyed::penalize`] and
//! [`Keyed::block`].
//!
//! Each is one step through the key's word's compare-and-swap, as a check is (the shell's charge
//! and settlement, `limiter::charge`, and GCRA's own changes, `gcra::admin`), so it is safe beside
//! checks of the same key; on an entry that a change of the
//! table's took out of use (retired) the step stands aside and the key is looked up again, as a
//! check does. A key that is not held is a full bucket: a charge, a penalty or a block inserts it
//! (taking a place, or answering that the table is full), a reset or a removal has nothing to do.

use alloc::borrow::ToOwned;
use core::borrow::Borrow;
use core::hash::Hash;
use core::time::Duration;
use std::sync::PoisonError;

use super::entry::KeyEntry;
use super::store::{Change, KeyedStore, Retired};
use super::table::Keyed;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::gcra::Gcra;
use crate::limiter::charge::Mark;
use crate::limiter::retire::{is_retired, retire_word};
use crate::quota::InsufficientCapacity;
use crate::sync::{Arc, Backoff, Ordering};

/// An admission of a key on an estimate, to be settled at the actual cost: from
/// [`Keyed::charge_key`]. It settles as a [`Charge`](crate::Charge) on a [`Gcra`] does, on the key that was
/// charged, once (`settle` consumes it); dropped, it stands at the estimate. A surplus comes back
/// only while the charge is the key's latest change.
///
/// A key moved to another quota since the charge (a quota function's change) gets no surplus
/// back (the span it was charged in is not the new quota's), but still owes any excess, in
/// tokens of its new quota. A key evicted since (its bucket was full again) has nothing left to
/// give back, and owes an excess as a fresh key.
///
/// # Examples
///
/// A charge settles on its own key, once:
///
/// ```
/// use atomic_limiter::{Keyed, ManualClock, Quota};
///
/// let table = Keyed::gcra_with_clock(Quota::per_second(10), 100, ManualClock::new());
/// let a = table.charge_key("a", 6).unwrap();
/// let _ = table.check_key_n("b", 4).unwrap();
/// a.settle(2);
/// assert_eq!(table.check_key_n("a", 0).unwrap().remaining(), 8);
/// assert_eq!(table.check_key_n("b", 0).unwrap().remaining(), 6);
/// ```
#[derive(Debug)]
#[must_use = "a charge is settled at its estimate when dropped: settle it at the actual cost"]
pub struct KeyCharge<'a, K, C: Clock, M> {
    table: &'a Keyed<K, Gcra<C>, M>,
    key: K,
    decision: Decision,
    /// The limiter the charge was made on, and what it left.
    charged: Option<(Arc<Gcra<C>>, Mark)>,
}

impl<K, C, M> KeyCharge<'_, K, C, M>
where
    K: Hash + Eq + Clone,
    C: Clock + Send + Sync,
    M: KeyedStore<K, KeyEntry<Gcra<C>>>,
{
    /// The decision the charge was made with.
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// Whether the estimate was admitted.
    pub fn is_allowed(&self) -> bool {
        self.decision.is_allowed()
    }

    /// Settles the charge at `actual` tokens; nothing for a refused one.
    pub fn settle(self, actual: u32) {
        let Some((limiter, mark)) = self.charged else {
            return;
        };
        let t = self.table;
        let owed_more = actual.saturating_sub(mark.taken);
        // A missing key with nothing owed has nothing to give back; a full table refuses debt it
        // cannot file (the key's next check is refused there too, until a place frees).
        let _ = t.on_key(&self.key, owed_more > 0, |l, e, gate| {
            if Arc::ptr_eq(&e.limiter, &limiter) {
                l.settle_on(&e.state.0, mark, actual, gate)
            } else {
                l.adjust_on(&e.state.0, owe_tokens(l, owed_more), gate)
                    .map(|_| ())
            }
        });
        t.count_admin("settle");
    }
}

/// The change that owes `n` more tokens of `l`'s quota.
fn owe_tokens<C: Clock>(l: &Gcra<C>, n: u32) -> impl Fn(u64, u64) -> Option<u64> + '_ {
    move |tat, now| l.owe_step(tat, now, n)
}

impl<K, C, M> Keyed<K, Gcra<C>, M>
where
    K: Hash + Eq + Clone,
    C: Clock + Send + Sync,
    M: KeyedStore<K, KeyEntry<Gcra<C>>>,
{
    /// Admits `estimate` tokens for `key`, all or nothing, as
    /// [`check_key_n`](Keyed::check_key_n) does, and returns a [`KeyCharge`] to settle at the
    /// actual cost. A full table's refusal settles nothing.
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] if `estimate` exceeds the key's burst.
    ///
    /// # Examples
    ///
    /// Tokens per minute per API key, charged on an estimate and settled at the actual count:
    ///
    /// ```
    /// use atomic_limiter::{Keyed, ManualClock, Quota};
    ///
    /// let tokens = Keyed::gcra_with_clock(Quota::per_minute(10_000), 1_000, ManualClock::new());
    /// let charge = tokens.charge_key("team-a", 2_000).unwrap();
    /// assert!(charge.is_allowed());
    /// charge.settle(350);
    /// assert_eq!(tokens.check_key_n("team-a", 0).unwrap().remaining(), 9_650);
    /// ```
    pub fn charge_key<Q>(
        &self,
        key: &Q,
        estimate: u32,
    ) -> Result<KeyCharge<'_, K, C, M>, InsufficientCapacity>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let mut burst = None;
        let answer = self.on_key(key, true, |l, e, gate| {
            let b = l.quota().burst();
            if estimate > b {
                burst = Some(b);
                return Some(None);
            }
            let (decision, mark) = l.charge_on(&e.state.0, estimate, gate)?;
            Some(Some((decision, mark.map(|m| (e.limiter.clone(), m)))))
        });
        if let Some(burst) = burst {
            return Err(InsufficientCapacity {
                requested: estimate,
                burst,
            });
        }
        let (decision, charged) = match answer {
            Ok(Some(Some(charged))) => charged,
            Ok(_) => (Decision::never(0), None),
            Err(full) => (full, None),
        };
        Ok(KeyCharge {
            table: self,
            key: key.to_owned(),
            decision,
            charged,
        })
    }

    /// Takes `n` more tokens from `key` at once, going into debt past its burst (up to
    /// [`Gcra::debt_horizon`]): a penalty for abuse. Returns what a peek at the key answers after
    /// it, or a full table's refusal when the key is not held and no place is free.
    ///
    /// # Examples
    ///
    /// ```
    /// use atomic_limiter::{Keyed, ManualClock, Quota};
    /// use std::time::Duration;
    ///
    /// let per_user = Keyed::gcra_with_clock(Quota::per_second(10), 1_000, ManualClock::new());
    /// per_user.penalize("mallory", 30);
    /// assert_eq!(per_user.check_key("mallory").retry_after(), Duration::from_millis(2_100));
    /// ```
    pub fn penalize<Q>(&self, key: &Q, n: u32) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let answer = self.on_key(key, true, |l, e, gate| {
            l.adjust_on(&e.state.0, owe_tokens(l, n), gate)
        });
        self.count_admin("penalize");
        flatten(answer)
    }

    /// Refuses `key` for `duration` from now (at most [`Gcra::debt_horizon`]), with that
    /// retry-after for one token; a key that already owes more is left as it is. Returns what a
    /// peek answers after it, or a full table's refusal.
    ///
    /// # Examples
    ///
    /// An abuser blocked for an hour:
    ///
    /// ```
    /// use atomic_limiter::{Keyed, ManualClock, Quota};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let per_ip = Keyed::gcra_with_clock(Quota::per_second(5), 1_000, clock.clone());
    /// per_ip.block("203.0.113.9", Duration::from_secs(3600));
    /// assert_eq!(per_ip.check_key("203.0.113.9").retry_after(), Duration::from_secs(3600));
    /// clock.advance(Duration::from_secs(3600));
    /// assert!(per_ip.check_key("203.0.113.9").is_allowed());
    /// ```
    pub fn block<Q>(&self, key: &Q, duration: Duration) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let answer = self.on_key(key, true, |l, e, gate| {
            l.adjust_on(
                &e.state.0,
                |tat, now| l.block_step(tat, now, duration),
                gate,
            )
        });
        self.count_admin("block");
        flatten(answer)
    }

    /// Makes `key` full again, keeping its place; whether it was held. (A full bucket is a fresh
    /// one: [`Keyed::remove`] does the same and frees the place.) To read a key's state without
    /// taking anything, peek: `check_key_n(key, 0)`.
    ///
    /// # Examples
    ///
    /// ```
    /// use atomic_limiter::{Keyed, ManualClock, Quota};
    ///
    /// let per_user = Keyed::gcra_with_clock(Quota::per_second(2), 1_000, ManualClock::new());
    /// assert!(per_user.check_key_n("alice", 2).unwrap().is_allowed());
    /// assert!(per_user.reset("alice"));
    /// assert_eq!(per_user.check_key_n("alice", 0).unwrap().remaining(), 2);
    /// ```
    pub fn reset<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let answer = self.on_key(key, false, |l, e, gate| {
            l.adjust_on(&e.state.0, crate::gcra::math::reset, gate)
        });
        self.count_admin("reset");
        matches!(answer, Ok(Some(_)))
    }

    /// Forgets `key` and frees its place; whether it was held. Its next request is a fresh
    /// bucket's.
    ///
    /// # Examples
    ///
    /// ```
    /// use atomic_limiter::{Keyed, ManualClock, Quota};
    ///
    /// let per_user = Keyed::gcra_with_clock(Quota::per_second(2), 1_000, ManualClock::new());
    /// let _ = per_user.check_key("alice");
    /// assert!(per_user.remove("alice"));
    /// assert!(per_user.is_empty());
    /// ```
    pub fn remove<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let key: K = key.to_owned();
        // Held throughout, as every change that removes keys holds it.
        let _due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
        let removed = self.store.change(&key, |e, retired| {
            // Checks beside the change see the entry retired and look the key up again.
            if let Some(retired) = retired {
                retire_word(&e.state.0, retired.flag());
            }
            (Change::Remove, e.limiter.quota())
        });
        if let Some(quota) = &removed {
            // Relaxed: as in `take_place`; the stale index entry is dropped when it comes up.
            self.count.fetch_sub(1, Ordering::Relaxed);
            self.forget_unused(quota);
        }
        self.count_admin("remove");
        removed.is_some()
    }

    /// Runs `op` on `key`'s entry (its limiter, the entry, and the gate that says whether the
    /// entry was retired), inserting a fresh one first when `insert` and it is not held. `op`
    /// answers `None` when the gate stopped it: the key is looked up again. `Ok(None)` when the
    /// key is not held and `insert` is false; `Err` with a full table's refusal.
    pub(super) fn on_key<Q, R>(
        &self,
        key: &Q,
        insert: bool,
        mut op: impl FnMut(&Gcra<C>, &KeyEntry<Gcra<C>>, &dyn Fn() -> bool) -> Option<R>,
    ) -> Result<Option<R>, Decision>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let backoff = Backoff::new();
        loop {
            let seen = self.store.with_existing(key, |e, retired| {
                let gate = || retired.is_some_and(|r: &Retired| is_retired(r.flag()));
                op(&e.limiter, e, &gate)
            });
            match seen {
                Some(Some(answer)) => return Ok(Some(answer)),
                // Retired: the change replaces or removes the entry next.
                Some(None) => backoff.snooze(),
                None if !insert => return Ok(None),
                None => self.insert_fresh(key)?,
            }
        }
    }

    /// Inserts a fresh (full) entry for `key` if it is not held, taking a place as a new key's
    /// first check does; a full table's refusal if none is free.
    fn insert_fresh<Q>(&self, key: &Q) -> Result<(), Decision>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let mut owned: Option<K> = None;
        let quota = self.quota_for_new(key, &mut owned);
        // Every insertion runs under the index's lock (see `check_new`).
        let due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
        if self.store.with_existing(key, |_, _| ()).is_some() {
            return Ok(());
        }
        // Full now: filed at now; a change that owes more is found still owing when the index
        // comes to it, and filed again.
        self.insert_new(due, key, owned, quota, true, |_, _, now| ((), now))
    }
}

/// An administrative change's answer: the peek after it, a full table's refusal, or (the gate
/// never stopping a change for good) a refusal that never passes.
fn flatten(answer: Result<Option<Decision>, Decision>) -> Decision {
    match answer {
        Ok(Some(d)) | Err(d) => d,
        Ok(None) => Decision::never(0),
    }
}
