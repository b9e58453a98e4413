//! The flat store's slots and tables: a slot's tag, its cells and how they are published, and a
//! table being built.
//!
//! A slot's tag (`u32`):
//!
//! | tag | meaning | key and value |
//! |---|---|---|
//! | [`EMPTY`] (0) | never taken in this table; ends a probe | not there |
//! | [`DEAD`] (1) | removed or moved away; a check may still be reading it | still there |
//! | [`FREED`] (2) | removed, and every check that could read it has ended | dropped; the slot may be taken again |
//! | [`RESERVED`] (3) | in a table being built: taken, not yet live | the key only |
//! | [`LIVE`] (bit 31) `\|` the top 31 bits of the key's hash | the key's | there |

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::borrow::Borrow;
use core::mem::{MaybeUninit, take};

use crate::keyed::store::Retired;
use crate::sync::{AtomicPtr, AtomicU32, Ordering, UnsafeCell};

/// A slot never taken in its table.
pub(super) const EMPTY: u32 = 0;
/// A slot whose key was removed or moved away; its key and value stay until a grace period ends.
pub(super) const DEAD: u32 = 1;
/// A removed slot whose key and value were dropped; it may be taken again.
pub(super) const FREED: u32 = 2;
/// A slot of a table being built that holds its key, its value not yet copied: taken, but never
/// read as live. Dropped without its value if the build is abandoned.
pub(super) const RESERVED: u32 = 3;
/// The bit of a live slot's tag; the other 31 bits are the top of the key's hash (its low bits
/// place it), so that a probe compares keys only when 31 more bits agree.
pub(super) const LIVE: u32 = 1 << 31;

/// The tag of a live slot holding a key of hash `hash`.
#[inline(always)]
pub(super) fn live_tag(hash: u64) -> u32 {
    (hash >> 32) as u32 | LIVE
}

/// One table: a power-of-two number of slots.
pub(super) struct Table<K, V> {
    pub(super) slots: Box<[Slot<K, V>]>,
    /// The table a growth is copying this one's entries to, once it has begun: a lookup that
    /// finds its entry here retired looks for the copy there, instead of waiting for the whole
    /// copy to be published.
    pub(super) next: AtomicPtr<Table<K, V>>,
}

/// One key's place. Aligned so that a slot of a `u64` key and its entry (32 bytes) never
/// straddles two cache lines.
#[repr(align(32))]
pub(super) struct Slot<K, V> {
    pub(super) tag: AtomicU32,
    pub(super) key: UnsafeCell<MaybeUninit<K>>,
    pub(super) value: UnsafeCell<MaybeUninit<V>>,
    pub(super) retired: Retired,
}

impl<K, V> Slot<K, V> {
    pub(super) fn empty() -> Slot<K, V> {
        Slot {
            tag: AtomicU32::new(EMPTY),
            key: UnsafeCell::new(MaybeUninit::uninit()),
            value: UnsafeCell::new(MaybeUninit::uninit()),
            retired: Retired::new(),
        }
    }

    /// The key.
    ///
    /// # Safety
    ///
    /// The slot's tag was read `LIVE` or `DEAD` (with `Acquire`, or under the writer's lock),
    /// and the slot is not freed before the reference is dropped: the caller is in a check
    /// section opened before it read the table's pointer, or holds the writer's lock.
    #[inline(always)]
    pub(super) unsafe fn key(&self) -> &K {
        // SAFETY: written before the tag was published, dropped only after a grace period that
        // the caller's section or lock holds off.
        self.key.with(|k| unsafe { (*k).assume_init_ref() })
    }

    /// The value, as [`Slot::key`].
    ///
    /// # Safety
    ///
    /// As [`Slot::key`].
    #[inline(always)]
    pub(super) unsafe fn value(&self) -> &V {
        // SAFETY: as in `key`.
        self.value.with(|v| unsafe { (*v).assume_init_ref() })
    }

    /// Writes a key and a value into a slot no lookup reads, and publishes them under `tag`.
    ///
    /// # Safety
    ///
    /// The slot is `EMPTY` or `FREED`, the caller holds the writer's lock (or owns a table not
    /// yet published), and no reference to its old key or value is alive.
    pub(super) unsafe fn fill(&self, tag: u32, key: K, value: V) {
        // SAFETY: no lookup reads the cells of an `EMPTY` or `FREED` slot, and no other writer
        // runs: this write races with nothing.
        self.key.with_mut(|k| unsafe { (*k).write(key) });
        // SAFETY: as above.
        unsafe { self.publish(tag, value) };
    }

    /// Writes a key into an `EMPTY` slot of a table no lookup can reach yet, and marks it
    /// `RESERVED`.
    ///
    /// # Safety
    ///
    /// As [`Slot::fill`], on a table not yet linked from the published one.
    pub(super) unsafe fn reserve(&self, key: K) {
        // SAFETY: as in `fill`.
        self.key.with_mut(|k| unsafe { (*k).write(key) });
        // Relaxed: the table is published later with Release.
        self.tag.store(RESERVED, Ordering::Relaxed);
    }

    /// Writes the value into a slot whose key is written (`fill`, or `RESERVED`), and publishes
    /// both under `tag`.
    ///
    /// # Safety
    ///
    /// The slot's key is written, no lookup reads its value cell (its tag is not live), and the
    /// caller holds the writer's lock.
    pub(super) unsafe fn publish(&self, tag: u32, value: V) {
        // SAFETY: no lookup reads the value of a slot whose tag is not live, and no other writer
        // runs.
        self.value.with_mut(|v| unsafe { (*v).write(value) });
        // Relaxed: published with the tag below.
        self.retired.flag().store(false, Ordering::Relaxed);
        // Release: the key, the value and the cleared flag before the tag that makes lookups read
        // them.
        self.tag.store(tag, Ordering::Release);
    }

    /// Drops the key and the value of a slot that holds them.
    ///
    /// # Safety
    ///
    /// The slot is `LIVE` or `DEAD`, and nothing can read it any more (its grace period passed,
    /// or its table is being freed).
    pub(super) unsafe fn drop_contents(&self) {
        // SAFETY: initialised (the tag says so) and unreachable (the caller says so).
        self.key.with_mut(|k| unsafe { (*k).assume_init_drop() });
        // SAFETY: as above.
        self.value.with_mut(|v| unsafe { (*v).assume_init_drop() });
    }
}

impl<K, V> Table<K, V> {
    pub(super) fn with_slots(slots: usize) -> *mut Table<K, V> {
        debug_assert!(slots.is_power_of_two());
        let slots = (0..slots).map(|_| Slot::empty()).collect();
        Box::into_raw(Box::new(Table {
            slots,
            next: AtomicPtr::new(core::ptr::null_mut()),
        }))
    }

    #[inline(always)]
    pub(super) fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// The slot at `i`, taken modulo the table's size.
    #[inline(always)]
    pub(super) fn at(&self, i: usize) -> &Slot<K, V> {
        // SAFETY: masked to the table's power-of-two size.
        unsafe { self.slots.get_unchecked(i & self.mask()) }
    }

    /// Sends for the cache lines of `hash`'s first two slots (the second is on the next line
    /// when the first ends its own), so that the caller's work before its probe, a clock read,
    /// overlaps the wait: written one after the other, the two waited in turn (`docs/design.md`,
    /// section 6.2, has the figures). A hint only, compiled where it is a plain instruction
    /// (x86-64).
    #[inline(always)]
    pub(super) fn prefetch(&self, hash: u64) {
        #[cfg(all(target_arch = "x86_64", not(miri), not(atomic_limiter_loom)))]
        {
            use core::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            let first: *const Slot<K, V> = self.at(hash as usize);
            // Past the table's end for its last slot: a hint's address is never read.
            let second = first.wrapping_add(1);
            // SAFETY: a prefetch reads nothing the program can see and faults on no address;
            // SSE, which it needs, is part of every x86-64 target.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(first.cast());
                _mm_prefetch::<_MM_HINT_T0>(second.cast());
            }
        }
        #[cfg(not(all(target_arch = "x86_64", not(miri), not(atomic_limiter_loom))))]
        let _ = hash;
    }

    /// The index of `key`'s live slot, if it has one.
    #[inline(always)]
    pub(super) fn find<Q>(&self, hash: u64, key: &Q) -> Option<usize>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let want = live_tag(hash);
        // Truncated on 32-bit targets: an index needs only the low bits.
        let mut i = hash as usize & self.mask();
        // Every probe ends at an `EMPTY` slot: at least an eighth of every table is.
        loop {
            // SAFETY: masked to the table's power-of-two size.
            let slot = unsafe { self.slots.get_unchecked(i) };
            // Acquire: pairs with the Release that published the slot: its key and value.
            let tag = slot.tag.load(Ordering::Acquire);
            // SAFETY: the tag was read live with Acquire; the caller keeps the table alive.
            if tag == want && unsafe { slot.key() }.borrow() == key {
                return Some(i);
            }
            if tag == EMPTY {
                return None;
            }
            i = (i + 1) & self.mask();
        }
    }

    /// The first slot on `hash`'s probe path that an insertion may take (`EMPTY` or `FREED`),
    /// and whether it was `EMPTY`. Called under the writer's lock, on a table with an `EMPTY`
    /// slot.
    pub(super) fn vacancy(&self, hash: u64) -> (usize, bool) {
        let mut i = hash as usize;
        loop {
            // Relaxed: only writers change a tag to `EMPTY` or `FREED`, under the lock held here.
            match self.at(i).tag.load(Ordering::Relaxed) {
                EMPTY => return (i & self.mask(), true),
                FREED => return (i & self.mask(), false),
                _ => i = i.wrapping_add(1),
            }
        }
    }
}

impl<K, V> Drop for Table<K, V> {
    fn drop(&mut self) {
        for slot in self.slots.iter() {
            // Relaxed: the table is unreachable; its last writer synchronised with this thread.
            let tag = slot.tag.load(Ordering::Relaxed);
            if tag == DEAD || tag & LIVE != 0 {
                // SAFETY: `LIVE` or `DEAD`, and the table is being freed.
                unsafe { slot.drop_contents() };
            }
        }
    }
}

/// A table being built, not yet reachable by any lookup, and the slots whose keys it holds:
/// freed with those keys if the build is abandoned (a caller's `Hash` or `Clone` panicked).
pub(super) struct Staged<K, V> {
    pub(super) table: *mut Table<K, V>,
    pub(super) placed: Vec<usize>,
}

impl<K, V> Staged<K, V> {
    /// The table and the slots reserved in it, no longer freed here.
    pub(super) fn disarm(self) -> (*mut Table<K, V>, Vec<usize>) {
        let mut this = core::mem::ManuallyDrop::new(self);
        (this.table, take(&mut this.placed))
    }
}

impl<K, V> Drop for Staged<K, V> {
    fn drop(&mut self) {
        // SAFETY: owned here and unreachable by lookups (`disarm` was not called).
        let table = unsafe { Box::from_raw(self.table) };
        for &i in &self.placed {
            // SAFETY: `RESERVED` (its key written, its value not) and unreachable.
            table
                .at(i)
                .key
                .with_mut(|k| unsafe { (*k).assume_init_drop() });
        }
        // The table's drop skips `RESERVED` slots.
        drop(table);
    }
}
