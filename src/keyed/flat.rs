//! [`FlatStore`]: the default store. One open-addressed table whose slots hold each key, its value
//! and its retired flag in place, so that a lookup is a probe of adjacent slots: no lock, no
//! pointer to follow, and nothing written that another thread reads.
//!
//! # Implementation details
//!
//! A slot's tag says what the slot holds (the table in `slots`). Tags sit apart from the slots,
//! eight to a word, so that a probe reads a word of tags (`Acquire`) and then only the slot whose
//! tag matches: its key and the value the tag published. Every change runs under the writer's
//! lock, and stores a whole word of tags (`Release`):
//!
//! - an insertion writes the key, the value and a cleared flag into an `EMPTY` or `FREED` slot
//!   on the key's probe path, then publishes the tag;
//! - a removal (or a replacement, which removes and inserts) retires the value through the
//!   caller's `f` ([`KeyedStore::change`]), marks the slot `DEAD`, and drops its key and value
//!   only after a grace period ([`crate::reclaim`]): once every check section open when it was
//!   marked has ended, it marks the slot `FREED`;
//! - when the slots ever taken would pass seven eighths of the table, the live entries are
//!   copied to the smallest table that holds them in three quarters of its slots. Every key is
//!   first hashed and cloned into a `RESERVED` slot of the new table, so that a caller's `Hash`
//!   or `Clone` that panics leaves the store as it was. Then each entry is
//!   [relocated](Relocate): retired, then copied with its last state. The new table is linked
//!   from the old one (`next`) before the entries are relocated, published (`Release`) after,
//!   and the old one is freed after a grace period. A check that finds its entry retired follows the
//!   link to the copy, or looks the key up again until the copy is made.
//!
//! A probe ends at an `EMPTY` slot, and at least an eighth of every table is `EMPTY`, so every
//! probe ends. A key is never in two `LIVE` slots of the table a lookup reads: a replacement marks
//! the old slot `DEAD` before it publishes the new one.
#![allow(unsafe_code)]

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::borrow::Borrow;
use core::hash::{BuildHasher, Hash};
use core::marker::PhantomData;
use core::mem::take;

use self::slots::{DEAD, FREED, LIVE, Slot, Staged, Table, live_tag};
use super::KeyHasher;
use super::store::{Change, KeyedStore, Relocate, Retired};
use crate::reclaim::{self, Grace};
use crate::sync::{AtomicPtr, Mutex, MutexGuard, Ordering};

mod slots;

/// Removed slots noted by one grace period: one system call covers this many removals.
const BATCH: usize = 32;
/// The smallest table: 128 cache lines, so that a few hot keys checked on different cores seldom
/// share a line or neighbour one (a lookup sends for the next line too); `docs/design.md` has
/// the figures. Under loom, small enough that a model grows it after three keys; under Miri,
/// after 15.
#[cfg(not(any(atomic_limiter_loom, miri)))]
pub(super) const MIN_SLOTS: usize = 256;
/// See the first arm.
#[cfg(all(miri, not(atomic_limiter_loom)))]
pub(super) const MIN_SLOTS: usize = 16;
/// See the first arm.
#[cfg(atomic_limiter_loom)]
pub(super) const MIN_SLOTS: usize = 4;

/// The default [`KeyedStore`]: an open-addressed table of slots holding each key, its value and
/// its [`Retired`] flag in place. A lookup hashes the key and reads the tags of adjacent slots, a
/// word of eight at a time, until it finds the key's or an empty slot's: it takes no lock, reads
/// no slot but the key's (and those of the one live key in 128 it passes whose tag matches by
/// chance), and writes only its own thread's mark (which a change reads to know when memory it
/// unlinked may be freed). Changes (new keys, removals, quota changes) take the store's lock, as
/// they take the table's index lock anyway.
///
/// It grows by copying the live entries to a larger table when the slots ever taken would pass
/// seven eighths of the table (a new key's latency, once per doubling; checks meanwhile go on,
/// on each entry's copy once it is made), and a removed key's memory is freed in batches once
/// no check can still be reading it. A table holds at most 8/3 slots per live key (and at least
/// 256 slots in all), each slot the key and the entry (16 bytes), and a byte of tag apart.
///
/// ```
/// use atomic_limiter::keyed::{FlatStore, KeyHasher};
/// use atomic_limiter::{Gcra, KeyQuotas, Keyed, ManualClock, Quota};
///
/// let clock = ManualClock::new();
/// let keyed = Keyed::with_store(
///     FlatStore::with_hasher(KeyHasher::new()),
///     100_000,
///     KeyQuotas::Every(Quota::per_second(5)),
///     move |q| Gcra::with_clock(q, clock.clone()),
/// );
/// assert_eq!((0..10).filter(|_| keyed.check_key(&"10.0.0.7").is_allowed()).count(), 5);
/// ```
pub struct FlatStore<K, V, S = KeyHasher> {
    /// The table lookups read; replaced only under `writer`.
    table: AtomicPtr<Table<K, V>>,
    writer: Mutex<Writer<K, V>>,
    hasher: S,
    /// For the loom models' teeth: growth copies entries without retiring them.
    #[cfg(atomic_limiter_loom)]
    broken: bool,
    /// The slots' cells make the store `!Sync` unless `K` and `V` allow it (below).
    _slots: PhantomData<Table<K, V>>,
}

// SAFETY: keys and values are shared between threads (read by lookups on any thread, written
// under the writer's lock, dropped by whichever thread frees them): `Send + Sync` for both suffice,
// as for a `Mutex<HashMap<K, V>>` read through shared references.
unsafe impl<K: Send + Sync, V: Send + Sync, S: Send + Sync> Sync for FlatStore<K, V, S> {}
// SAFETY: as above.
unsafe impl<K: Send + Sync, V: Send + Sync, S: Send> Send for FlatStore<K, V, S> {}

/// What only changes touch, under the store's lock.
struct Writer<K, V> {
    /// Live slots in the current table.
    live: usize,
    /// Slots of the current table not `EMPTY`.
    taken: usize,
    /// Slots of the current table marked `DEAD` and not yet noted by a grace period.
    removed: Vec<usize>,
    /// Slots of the current table marked `DEAD`, freed once their grace period has passed.
    waiting: Vec<(Vec<usize>, Option<Grace>)>,
    /// Tables no longer published, freed once their grace period has passed.
    old: Vec<(*mut Table<K, V>, Option<Grace>)>,
}

/// Whether `grace` has passed, taking one now if none was taken yet (the kernel refused its
/// barrier earlier): nothing is freed on a grace period not yet taken.
fn passed(grace: &mut Option<Grace>) -> bool {
    match grace {
        Some(grace) => grace.passed(),
        None => {
            *grace = reclaim::grace();
            false
        }
    }
}

/// Aborts the process if dropped: forgotten at the end of a section that must not unwind.
struct AbortOnUnwind;

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        std::process::abort();
    }
}

impl<K, V, S> FlatStore<K, V, S> {
    /// An empty store hashing with `hasher`.
    pub fn with_hasher(hasher: S) -> Self {
        // Decided before the first check: which fence the check sections take.
        reclaim::prepare();
        FlatStore {
            table: AtomicPtr::new(Table::with_slots(MIN_SLOTS)),
            writer: Mutex::new(Writer {
                live: 0,
                taken: 0,
                removed: Vec::new(),
                waiting: Vec::new(),
                old: Vec::new(),
            }),
            hasher,
            #[cfg(atomic_limiter_loom)]
            broken: false,
            _slots: PhantomData,
        }
    }

    /// For the loom models' teeth: a store whose growth copies entries without retiring them, so
    /// that a check on an entry after its copy was made is lost.
    #[cfg(atomic_limiter_loom)]
    pub(crate) fn loom_broken(mut self) -> Self {
        self.broken = true;
        self
    }

    fn lock(&self) -> MutexGuard<'_, Writer<K, V>> {
        // A panic under the lock leaves every table whole: each change publishes last.
        self.writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The current table, for a writer.
    fn current(&self, _w: &Writer<K, V>) -> &Table<K, V> {
        // Relaxed: only writers store the pointer, under the lock the caller holds.
        let table = self.table.load(Ordering::Relaxed);
        // SAFETY: the current table is freed only after it is replaced, under the same lock.
        unsafe { &*table }
    }

    /// Frees what no check can read any more: removed slots and old tables whose grace period
    /// has passed. Takes a grace period for the removed slots once a batch has gathered, or at
    /// once if `now`.
    fn tidy(&self, w: &mut Writer<K, V>, now: bool) {
        if w.removed.len() >= BATCH || (now && !w.removed.is_empty()) {
            let removed = take(&mut w.removed);
            w.waiting.push((removed, reclaim::grace()));
        }
        let table = self.current(w);
        w.waiting.retain_mut(|(slots, grace)| {
            if !passed(grace) {
                return true;
            }
            for &i in slots.iter() {
                let slot = table.at(i);
                // SAFETY: `DEAD` (marked so when it was pushed; only a rebuild, which empties
                // this list, changes it since) and its grace period has passed.
                unsafe { slot.drop_contents() };
                // No lookup reads a `FREED` slot's cells; the insertion that takes it again
                // publishes them anew.
                table.set_tag(i, FREED);
            }
            false
        });
        w.old.retain_mut(|(table, grace)| {
            if !passed(grace) {
                return true;
            }
            // SAFETY: unpublished, its grace period passed: no lookup can reach it.
            drop(unsafe { Box::from_raw(*table) });
            false
        });
    }
}

impl<K: Hash + Eq + Clone, V: Relocate, S: BuildHasher> FlatStore<K, V, S> {
    /// Copies the live entries to the smallest table that holds `live` keys in three quarters of
    /// its slots, publishes it, and leaves the old one to be freed after a grace period.
    ///
    /// The caller's code (`Hash` and `Clone` of the keys) runs first, before any entry is
    /// retired: if it panics, the store is left as it was and the new table is freed.
    fn rebuild(&self, w: &mut Writer<K, V>, live: usize) {
        let old_ptr = self.table.load(Ordering::Relaxed);
        let old = self.current(w);
        let slots = (live / 3)
            .saturating_mul(4)
            .saturating_add(4)
            .max(MIN_SLOTS)
            .checked_next_power_of_two()
            .unwrap_or(usize::MAX / 2 + 1);
        let mut staged = Staged {
            table: Table::with_slots(slots),
            placed: Vec::with_capacity(w.live),
        };
        // SAFETY: owned by `staged` until published below; freed only after it is unpublished,
        // by a later growth under this lock.
        let new = unsafe { &*staged.table };
        for (j, slot) in old.slots.iter().enumerate() {
            if old.tag(j) & LIVE == 0 {
                continue;
            }
            // SAFETY: live, under the writer's lock.
            let key = unsafe { slot.key() };
            let (i, _) = new.vacancy(self.hash(key));
            // SAFETY: an `EMPTY` slot of a table no lookup can reach yet.
            unsafe { new.reserve(i, key.clone()) };
            staged.placed.push(i);
        }
        let (next, placed) = staged.disarm();
        let copied = placed.len();
        // Release: the new table's reserved slots before a lookup that reads the pointer can
        // probe them; each copy is published by its own tag.
        old.next.store(next, Ordering::Release);
        // From here only the store's own code runs, and an entry once retired cannot be given
        // back: a panic (a `Relocate` that breaks its contract) aborts rather than leave a key
        // in two tables.
        let abort = AbortOnUnwind;
        let mut placed = placed.into_iter();
        for (j, slot) in old.slots.iter().enumerate() {
            // No tag changed since the pass above: the writer's lock is held.
            let tag = old.tag(j);
            if tag & LIVE == 0 {
                continue;
            }
            // SAFETY: live, under the writer's lock.
            let value = unsafe { slot.value() };
            #[cfg(not(atomic_limiter_loom))]
            let moved = value.relocate(&slot.retired);
            #[cfg(atomic_limiter_loom)]
            let moved = if self.broken {
                value.loom_copy_in_use()
            } else {
                value.relocate(&slot.retired)
            };
            let i = placed.next().expect("a slot reserved for every live entry");
            // SAFETY: reserved for this key above, under the writer's lock: lookups through
            // `old.next` read its value only once its tag is published.
            unsafe { new.publish(i, tag, moved) };
        }
        core::mem::forget(abort);
        // Release: the new table's slots before the pointer that makes lookups read them.
        self.table.store(next, Ordering::Release);
        // The old table's removed slots go with it.
        w.removed.clear();
        w.waiting.clear();
        w.old.push((old_ptr, reclaim::grace()));
        w.live = copied;
        w.taken = copied;
    }

    /// Inserts `key` (absent) with `value` under the writer's lock; the slot it took.
    fn insert(&self, w: &mut Writer<K, V>, hash: u64, key: K, value: V) -> &Slot<K, V> {
        self.tidy(w, false);
        let table = self.current(w);
        // Keep an eighth of the table `EMPTY`, so that every probe ends soon.
        if (w.taken + 1) * 8 > table.slots.len() * 7 {
            self.rebuild(w, w.live + 1);
        }
        let table = self.current(w);
        let (i, empty) = table.vacancy(hash);
        // SAFETY: `EMPTY` or `FREED`, under the writer's lock; a `FREED` slot's grace passed.
        unsafe { table.fill(i, live_tag(hash), key, value) };
        w.live += 1;
        w.taken += usize::from(empty);
        table.at(i)
    }

    /// Marks the live slot `i` of the current table `DEAD`, its key and value to be dropped
    /// after a grace period.
    fn remove_at(&self, w: &mut Writer<K, V>, i: usize) {
        // A lookup that reads `DEAD` reads nothing more of the slot; one that read the tag
        // before reads the value retired (`KeyedStore::change`).
        self.current(w).set_tag(i, DEAD);
        w.live -= 1;
        w.removed.push(i);
    }

    #[inline(always)]
    fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key)
    }
}

impl<K, V, S> Drop for FlatStore<K, V, S> {
    fn drop(&mut self) {
        let w = self
            .writer
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (table, _) in w.old.drain(..) {
            // SAFETY: no lookup runs on a store being dropped.
            drop(unsafe { Box::from_raw(table) });
        }
        // Relaxed: exclusive access.
        let table = self.table.load(Ordering::Relaxed);
        // SAFETY: as above; the slots `DEAD` in `removed` and `waiting` are dropped with it.
        drop(unsafe { Box::from_raw(table) });
    }
}

impl<K: Hash + Eq + Clone, V: Relocate, S: BuildHasher> KeyedStore<K, V> for FlatStore<K, V, S> {
    #[inline(always)]
    fn with_existing<Q, R>(&self, key: &Q, f: impl FnOnce(&V, Option<&Retired>) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.with_existing_after(key, || (), |v, retired, ()| f(v, retired))
    }

    #[inline(always)]
    fn with_existing_after<Q, T, R>(
        &self,
        key: &Q,
        first: impl FnOnce() -> T,
        f: impl FnOnce(&V, Option<&Retired>, T) -> R,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hash(key);
        // Opened before the table's pointer is read: a table or slot unlinked after this is
        // freed only once the section has closed.
        let _section = reclaim::enter();
        // Acquire: pairs with the Release that published the table: its slots as filled.
        // SAFETY: a table is freed only after a grace period that this open section holds off.
        let mut table = unsafe { &*self.table.load(Ordering::Acquire) };
        table.prefetch(hash);
        let t = first();
        let mut slot = table.at(table.find(hash, key)?);
        // Relaxed: a hint, as in `fill`'s readers: what decides is the check's own reading of
        // the flag, ordered by the entry's state word.
        while slot.retired.flag().load(Ordering::Relaxed) {
            // A growth is copying the table: the copy, if made yet. Acquire: pairs with the
            // Release that set the pointer (the new table's empty slots).
            let next = table.next.load(Ordering::Acquire);
            if next.is_null() {
                break;
            }
            // SAFETY: a table a growth copies to is published before the old one is unlinked,
            // and freed only after a grace period that this section holds off.
            table = unsafe { &*next };
            match table.find(hash, key) {
                Some(i) => slot = table.at(i),
                // Not copied yet: the check finds the old entry retired and looks again.
                None => break,
            }
        }
        // SAFETY: found live; the section keeps the slot's contents until it closes.
        Some(f(unsafe { slot.value() }, Some(&slot.retired), t))
    }

    fn with_inserted<R>(
        &self,
        key: K,
        make: impl FnOnce() -> V,
        f: impl FnOnce(&V, Option<&Retired>) -> R,
    ) -> (R, bool) {
        let hash = self.hash(&key);
        let mut w = self.lock();
        let table = self.current(&w);
        if let Some(i) = table.find(hash, &key) {
            let slot = table.at(i);
            // SAFETY: live, under the writer's lock (nothing is freed while it is held).
            return (f(unsafe { slot.value() }, Some(&slot.retired)), false);
        }
        let slot = self.insert(&mut w, hash, key, make());
        // SAFETY: just filled, under the writer's lock.
        (f(unsafe { slot.value() }, Some(&slot.retired)), true)
    }

    fn change<R>(
        &self,
        key: &K,
        f: impl FnOnce(&V, Option<&Retired>) -> (Change<V>, R),
    ) -> Option<R> {
        let hash = self.hash(key);
        let mut w = self.lock();
        let table = self.current(&w);
        let i = table.find(hash, key)?;
        let slot = table.at(i);
        // SAFETY: live, under the writer's lock.
        let (change, answer) = f(unsafe { slot.value() }, Some(&slot.retired));
        match change {
            Change::Keep => {}
            Change::Replace(value) => {
                // `f` retired the old value. Marked dead before the new slot is published, so
                // that no lookup finds the key twice.
                self.remove_at(&mut w, i);
                self.insert(&mut w, hash, key.clone(), value);
            }
            Change::Remove => {
                self.remove_at(&mut w, i);
                self.tidy(&mut w, false);
            }
        }
        Some(answer)
    }

    fn keys(&self) -> Vec<K> {
        let w = self.lock();
        let table = self.current(&w);
        (0..table.slots.len())
            .filter(|&i| table.tag(i) & LIVE != 0)
            // SAFETY: live, under the writer's lock.
            .map(|i| unsafe { table.at(i).key() }.clone())
            .collect()
    }

    fn shrink_to_fit(&self) {
        let mut w = self.lock();
        let slots = self.current(&w).slots.len();
        if slots > MIN_SLOTS && w.live * 8 < slots {
            let live = w.live;
            self.rebuild(&mut w, live);
        }
        self.tidy(&mut w, true);
    }
}

impl<K, V, S> core::fmt::Debug for FlatStore<K, V, S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let w = self.lock();
        f.debug_struct("FlatStore")
            .field("len", &w.live)
            .field("slots", &self.current(&w).slots.len())
            .finish_non_exhaustive()
    }
}
