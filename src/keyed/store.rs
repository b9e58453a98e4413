use core::borrow::Borrow;
#[cfg(feature = "papaya")]
use core::cell::Cell;
use core::hash::{BuildHasher, Hash};
#[cfg(feature = "papaya")]
use core::ptr::NonNull;

use alloc::vec::Vec;
use dashmap::DashMap;
use dashmap::mapref::entry::Entry;

use crate::sync::AtomicBool;
#[cfg(feature = "papaya")]
use crate::sync::Ordering;

/// The map a [`Keyed`](crate::Keyed) limiter keeps its keys in: [`DashMap`] by default, whose
/// lookups take a shard's read lock and whose changes hold the entry exclusively; or
/// `LockFreeStore` (the `papaya` feature), whose lookups take no lock and run beside changes.
/// The loom models put a map loom can see in their place.
///
/// A store of the second kind keeps a [`Retired`] flag beside each value and hands it to the
/// table with the value. Before the table moves or removes an entry whose checks may still be
/// running, it retires the entry: it sets the flag and changes the entry's state word, so that a
/// check that read the word before fails its compare-and-swap and, like every check after, finds
/// the flag set and looks the key up again (`docs/design.md` has the argument).
pub trait KeyedStore<K, V> {
    /// Runs `f` on the key's value if it is there: the hot path, one lookup, no allocation. The
    /// key may be given in any form the stored key borrows as (`&str` for `String` keys). `f` is
    /// given the entry's [`Retired`] flag where checks run beside changes, `None` where a change
    /// holds the entry exclusively.
    fn with_existing<Q, R>(&self, key: &Q, f: impl FnOnce(&V, Option<&Retired>) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized;

    /// [`KeyedStore::with_existing`], with `first` run before the lookup reads the key's slot and
    /// its answer handed to `f`: a store that can send for the slot's cache line first (the
    /// default store does) overlaps that wait with `first`, a check's clock read. `first` runs
    /// whether or not the key is there. The provided method runs `first`, then looks up.
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
        let t = first();
        self.with_existing(key, |v, retired| f(v, retired, t))
    }

    /// Runs `f` on the key's value, inserting `make()` first if it is absent, such that racing
    /// threads all see the one value that was inserted. Returns whether this call inserted it.
    fn with_inserted<R>(
        &self,
        key: K,
        make: impl FnOnce() -> V,
        f: impl FnOnce(&V, Option<&Retired>) -> R,
    ) -> (R, bool);

    /// Runs `f` on the key's value, if it is there, and makes the [`Change`] it answers. A store
    /// whose changes hold the entry exclusively runs `f` so, with no flag: no check decides on the
    /// entry meanwhile. A store whose checks run beside changes passes the entry's flag; `f`
    /// retires the entry (through its state word) before it reads a state it will move, and never
    /// answers [`Change::Keep`] for an entry it retired.
    fn change<R>(
        &self,
        key: &K,
        f: impl FnOnce(&V, Option<&Retired>) -> (Change<V>, R),
    ) -> Option<R>;

    /// The keys held, for a pass that changes each in turn.
    fn keys(&self) -> Vec<K>;

    /// Frees memory left by removed entries, if the map can.
    fn shrink_to_fit(&self) {}
}

/// A key's lookup, as a check makes it: through the store, which pins what it needs for the one
/// lookup ([`PerLookup`]), or through a pin held across checks ([`HeldPin`]).
pub(crate) trait Lookup<K, V> {
    /// [`KeyedStore::with_existing_after`].
    fn look_up_after<Q, T, R>(
        &self,
        key: &Q,
        first: impl FnOnce() -> T,
        f: impl FnOnce(&V, Option<&Retired>, T) -> R,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized;

    /// [`KeyedStore::with_existing`].
    #[inline(always)]
    fn look_up<Q, R>(&self, key: &Q, f: impl FnOnce(&V, Option<&Retired>) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.look_up_after(key, || (), |v, retired, ()| f(v, retired))
    }
}

/// A store's own lookups, each pinning what it needs for itself.
pub(crate) struct PerLookup<'a, M>(pub(crate) &'a M);

impl<K, V, M: KeyedStore<K, V>> Lookup<K, V> for PerLookup<'_, M> {
    #[inline(always)]
    fn look_up_after<Q, T, R>(
        &self,
        key: &Q,
        first: impl FnOnce() -> T,
        f: impl FnOnce(&V, Option<&Retired>, T) -> R,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.0.with_existing_after(key, first, f)
    }
}

/// What [`KeyedStore::change`] makes of an entry.
#[derive(Debug)]
pub enum Change<V> {
    /// Leave it as it is.
    Keep,
    /// Put this value in its place.
    Replace(V),
    /// Remove the key.
    Remove,
}

/// An entry's retired flag, in a store whose checks run beside changes ([`KeyedStore`]): set
/// once, when the table is about to move or remove the entry; a check that finds it set looks the
/// key up again.
#[derive(Debug)]
pub struct Retired(AtomicBool);

impl Default for Retired {
    fn default() -> Retired {
        Retired::new()
    }
}

impl Retired {
    /// A flag not set.
    pub fn new() -> Retired {
        Retired(AtomicBool::new(false))
    }

    pub(crate) fn flag(&self) -> &AtomicBool {
        &self.0
    }
}

/// A value that a store may move while checks run on it, as [`FlatStore`](crate::keyed::FlatStore)
/// does when it grows or packs its table: the copy takes the value's state as it stands once the
/// original is retired, so that no admission made on the original is lost and none is made on it
/// after.
pub trait Relocate {
    /// Retires this value (its flag `retired` set and its state word changed, so that a check
    /// that read the word before fails, and every check after looks the key up again) and
    /// returns a copy that carries its last state.
    ///
    /// It must not panic: a store cannot give back an entry once retired, so
    /// [`FlatStore`](crate::keyed::FlatStore) aborts the process if this unwinds.
    fn relocate(&self, retired: &Retired) -> Self;

    /// For the loom models' teeth: a copy of the value's state as it stands, the original left
    /// in use (a check on it after the copy is lost to the copy).
    #[cfg(atomic_limiter_loom)]
    #[doc(hidden)]
    fn loom_copy_in_use(&self) -> Self;
}

impl<K: Eq + Hash + Clone, V, S: BuildHasher + Clone> KeyedStore<K, V> for DashMap<K, V, S> {
    #[inline(always)]
    fn with_existing<Q, R>(&self, key: &Q, f: impl FnOnce(&V, Option<&Retired>) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get(key).map(|v| f(&v, None))
    }

    fn with_inserted<R>(
        &self,
        key: K,
        make: impl FnOnce() -> V,
        f: impl FnOnce(&V, Option<&Retired>) -> R,
    ) -> (R, bool) {
        // The shard's write lock is held from the lookup to the insertion, so only one thread
        // inserts; then the guard is downgraded so checks on the shard's other keys can go on.
        match self.entry(key) {
            Entry::Occupied(o) => (f(&o.into_ref().downgrade(), None), false),
            Entry::Vacant(v) => (f(&v.insert(make()).downgrade(), None), true),
        }
    }

    fn change<R>(
        &self,
        key: &K,
        f: impl FnOnce(&V, Option<&Retired>) -> (Change<V>, R),
    ) -> Option<R> {
        // The shard's write lock is held while `f` decides and its change is made.
        match self.entry(key.clone()) {
            Entry::Vacant(_) => None,
            Entry::Occupied(mut o) => {
                let (change, answer) = f(o.get(), None);
                match change {
                    Change::Keep => {}
                    Change::Replace(v) => *o.get_mut() = v,
                    Change::Remove => {
                        o.remove();
                    }
                }
                Some(answer)
            }
        }
    }

    fn keys(&self) -> Vec<K> {
        self.iter().map(|e| e.key().clone()).collect()
    }

    fn shrink_to_fit(&self) {
        DashMap::shrink_to_fit(self);
    }
}

/// A [`KeyedStore`] whose lookups take no lock: papaya's concurrent map, each value beside its
/// [`Retired`] flag. Lookups never write to memory another thread reads, so checks on different
/// keys do not contend on a shard's lock word; each lookup enters papaya's epoch (a thread-local
/// write) for the duration of the check.
///
/// A removed or replaced entry is freed once no lookup that could still see it is running: the
/// memory it pins is bounded by the entries removed during one check. Measured against dashmap
/// on two cores (`docs/benchmarks.md`), it is slower: each entry is its own allocation, one more
/// dependent load per lookup, which over 100 000 keys visited in an order of their own is a
/// cache miss (about twice dashmap's time a check); at one key the two take the same time. Its
/// lookups write nothing other threads read, where dashmap's read lock writes its shard's lock
/// word: with many cores checking distinct keys, measure both.
///
/// ```
/// use atomic_limiter::keyed::{KeyHasher, LockFreeStore};
/// use atomic_limiter::{Gcra, KeyQuotas, Keyed, ManualClock, Quota};
///
/// let clock = ManualClock::new();
/// let keyed = Keyed::with_store(
///     LockFreeStore::with_hasher(KeyHasher::new()),
///     100_000,
///     KeyQuotas::Every(Quota::per_second(5)),
///     move |q| Gcra::with_clock(q, clock.clone()),
/// );
/// assert_eq!((0..10).filter(|_| keyed.check_key(&"10.0.0.7").is_allowed()).count(), 5);
/// ```
#[cfg(feature = "papaya")]
pub struct LockFreeStore<K, V, S = crate::keyed::KeyHasher> {
    map: papaya::HashMap<K, Slot<V>, S>,
}

/// A value and its flag.
#[cfg(feature = "papaya")]
struct Slot<V> {
    value: V,
    retired: Retired,
}

#[cfg(feature = "papaya")]
impl<V> Slot<V> {
    fn new(value: V) -> Slot<V> {
        Slot {
            value,
            retired: Retired::new(),
        }
    }
}

#[cfg(feature = "papaya")]
impl<K: Hash + Eq, V, S: BuildHasher> LockFreeStore<K, V, S> {
    /// An empty store hashing with `hasher`.
    ///
    /// The map grows by blocking resizes: the insertion that fills it copies every entry to the
    /// new table before it goes on (a new key's latency, once per doubling, as dashmap's shards
    /// do). papaya's default copies a few entries per later write, and until the copy is done a
    /// lookup may search both tables; a keyed table writes only for new keys, so a copy could
    /// linger long after the table stopped growing.
    pub fn with_hasher(hasher: S) -> Self {
        LockFreeStore {
            map: papaya::HashMap::builder()
                .hasher(hasher)
                .resize_mode(papaya::ResizeMode::Blocking)
                .build(),
        }
    }
}

/// A [`LockFreeStore`]'s map entered once for many lookups on one thread: each lookup then
/// skips entering and leaving papaya's epoch. While it is held, what the table removes or
/// replaces is kept, not freed; [`HeldPin::renew`] lets go of it.
///
/// It remembers the key it found last and that key's slot, so that a run of lookups of one key
/// (a client's burst, a flood from one address) skips the hash and the probe. A slot not retired
/// is the key's own: the table retires a slot before it moves or removes it, and a retired slot
/// stays retired.
#[cfg(feature = "papaya")]
pub(crate) struct HeldPin<'a, K, V, S> {
    map: &'a papaya::HashMap<K, Slot<V>, S>,
    guard: papaya::LocalGuard<'a>,
    /// The key found last and its slot, both read from the map through `guard`; cleared when
    /// the guard is refreshed.
    last: Cell<Option<Found<K, V>>>,
}

/// A key in the map and its slot, as a [`HeldPin`] remembers them.
#[cfg(feature = "papaya")]
type Found<K, V> = (NonNull<K>, NonNull<Slot<V>>);

#[cfg(feature = "papaya")]
impl<K: Hash + Eq, V, S: BuildHasher> LockFreeStore<K, V, S> {
    /// The map, entered until the pin is dropped.
    pub(crate) fn held_pin(&self) -> HeldPin<'_, K, V, S> {
        HeldPin {
            map: &self.map,
            guard: self.map.guard(),
            last: Cell::new(None),
        }
    }
}

#[cfg(feature = "papaya")]
impl<K, V, S> HeldPin<'_, K, V, S> {
    /// Leaves the epoch and enters it again, so that what was removed before now can be freed
    /// (unless another pin on this thread still holds it). The slot remembered may be freed
    /// then, so it is forgotten first.
    #[inline]
    pub(crate) fn renew(&mut self) {
        self.last.set(None);
        papaya::Guard::refresh(&mut self.guard);
    }
}

#[cfg(feature = "papaya")]
impl<K: Hash + Eq, V, S: BuildHasher> Lookup<K, V> for HeldPin<'_, K, V, S> {
    #[inline(always)]
    #[allow(unsafe_code)]
    fn look_up_after<Q, T, R>(
        &self,
        key: &Q,
        first: impl FnOnce() -> T,
        f: impl FnOnce(&V, Option<&Retired>, T) -> R,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let t = first();
        let last = self.last.get().and_then(|(k, s)| {
            // SAFETY: both were read from the map through `self.guard`, which has not left its
            // epoch since (`renew` forgets them first) and is dropped only with `self`: papaya
            // frees nothing a guard read before it leaves.
            let (k, s) = unsafe { (k.as_ref(), s.as_ref()) };
            // Relaxed: a hint only, to look a moved key up again at once; whether the slot was
            // still the key's is decided by the check's compare-and-swap on its state word,
            // which retiring the slot changes, as for a slot just found.
            (k.borrow() == key && !s.retired.flag().load(Ordering::Relaxed)).then_some(s)
        });
        let s = match last {
            Some(s) => s,
            None => {
                // The held guard keeps the slot alive while `f` runs, as the store's own pin
                // does.
                let (k, s) = self.map.get_key_value(key, &self.guard)?;
                self.last.set(Some((NonNull::from(k), NonNull::from(s))));
                s
            }
        };
        Some(f(&s.value, Some(&s.retired), t))
    }
}

#[cfg(feature = "papaya")]
impl<K: Hash + Eq, V, S: BuildHasher> core::fmt::Debug for LockFreeStore<K, V, S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("LockFreeStore")
            .field("len", &self.map.len())
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "papaya")]
impl<K: Hash + Eq + Clone, V, S: BuildHasher> KeyedStore<K, V> for LockFreeStore<K, V, S> {
    #[inline]
    fn with_existing<Q, R>(&self, key: &Q, f: impl FnOnce(&V, Option<&Retired>) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        // The guard keeps the slot alive while `f` runs, even if the table removes it meanwhile.
        let map = self.map.pin();
        map.get(key).map(|s| f(&s.value, Some(&s.retired)))
    }

    fn with_inserted<R>(
        &self,
        key: K,
        make: impl FnOnce() -> V,
        f: impl FnOnce(&V, Option<&Retired>) -> R,
    ) -> (R, bool) {
        let map = self.map.pin();
        match map.try_insert(key, Slot::new(make())) {
            Ok(s) => (f(&s.value, Some(&s.retired)), true),
            Err(taken) => (f(&taken.current.value, Some(&taken.current.retired)), false),
        }
    }

    fn change<R>(
        &self,
        key: &K,
        f: impl FnOnce(&V, Option<&Retired>) -> (Change<V>, R),
    ) -> Option<R> {
        let map = self.map.pin();
        let slot = map.get(key)?;
        let (change, answer) = f(&slot.value, Some(&slot.retired));
        match change {
            Change::Keep => {}
            // The table serialises its changes: nothing else replaces or removes the key
            // between the lookup and this.
            Change::Replace(v) => {
                map.insert(key.clone(), Slot::new(v));
            }
            Change::Remove => {
                map.remove(key);
            }
        }
        Some(answer)
    }

    fn keys(&self) -> Vec<K> {
        self.map.pin().keys().cloned().collect()
    }
}
