//! The flat store's slots and tables: a slot's tag, its cells and how they are published, and a
//! table being built.
//!
//! A slot's tag is one byte, kept apart from the slot in the table's array of tags, eight to a
//! word, so that a probe reads a word or two of tags (a table of 100 000 keys has 128 KiB of
//! them, which stay in a core's own cache), tells in a few instructions which of eight slots
//! match and where the probe ends, and then reads the one slot whose tag matches:
//!
//! | tag | meaning | key and value |
//! |---|---|---|
//! | [`EMPTY`] (0) | never taken in this table; ends a probe | not there |
//! | [`DEAD`] (1) | removed or moved away; a check may still be reading it | still there |
//! | [`FREED`] (2) | removed, and every check that could read it has ended | dropped; the slot may be taken again |
//! | [`RESERVED`] (3) | in a table being built: taken, not yet live | the key only |
//! | [`LIVE`] (bit 7) `\|` the top 7 bits of the key's hash | the key's | there |

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::borrow::Borrow;
use core::mem::{MaybeUninit, take};

use crate::keyed::store::Retired;
use crate::sync::{AtomicPtr, AtomicU64, Ordering, UnsafeCell};

/// A slot never taken in its table.
pub(super) const EMPTY: u8 = 0;
/// A slot whose key was removed or moved away; its key and value stay until a grace period ends.
pub(super) const DEAD: u8 = 1;
/// A removed slot whose key and value were dropped; it may be taken again.
pub(super) const FREED: u8 = 2;
/// A slot of a table being built that holds its key, its value not yet copied: taken, but never
/// read as live. Dropped without its value if the build is abandoned.
pub(super) const RESERVED: u8 = 3;
/// The bit of a live slot's tag; the other 7 bits are the top of the key's hash (its low bits
/// place it), so that a probe reads the slot of one live key in 128 that is not the one sought.
pub(super) const LIVE: u8 = 1 << 7;

/// The tag of a live slot holding a key of hash `hash`.
#[inline(always)]
pub(super) fn live_tag(hash: u64) -> u8 {
    (hash >> 57) as u8 | LIVE
}

/// Slots whose tags share a word of [`Table::tags`].
const PER_WORD: usize = 8;
/// Each byte's low bit.
const LOW: u64 = 0x0101_0101_0101_0101;
/// Each byte's high bit.
const HIGH: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `word` that is zero, and no other: no carry crosses a byte
/// (each sum is at most `0x7F + 0x7F`), so a byte next to a zero one is never taken for zero.
#[inline(always)]
fn zero_bytes(word: u64) -> u64 {
    const SEVEN: u64 = 0x7F7F_7F7F_7F7F_7F7F;
    !(((word & SEVEN).wrapping_add(SEVEN)) | word) & HIGH
}

/// The high bit of each byte of `word` that is zero, and perhaps of a byte `0x01` above a zero
/// one (a borrow crosses into it), in three instructions. On `tags ^ wants` those are the slots
/// whose tag is `want` or `want ^ 1`: both live (`LIVE` is bit 7), so each holds a key to compare.
#[inline(always)]
fn maybe_zero_bytes(word: u64) -> u64 {
    word.wrapping_sub(LOW) & !word & HIGH
}

/// One table: a power-of-two number of slots, and their tags.
pub(super) struct Table<K, V> {
    pub(super) slots: Box<[Slot<K, V>]>,
    /// The slots' tags, eight to a word. Word `k` holds:
    ///
    /// | bits | the tag of slot |
    /// |---|---|
    /// | 0..8 | `8k` |
    /// | 8..16 | `8k + 1` |
    /// | … | … |
    /// | 56..64 | `8k + 7` |
    ///
    /// Each word is stored whole, by writers only, under the writer's lock (or in a table not
    /// yet published), always with Release: a lookup that reads a word with Acquire then sees
    /// every slot that any of its bytes published, whichever store it read. A table of fewer
    /// than eight slots (under loom) has one word, its bytes past the last slot `DEAD`: a probe
    /// passes them by and wraps to the first slot.
    tags: Box<[AtomicU64]>,
    /// The table a growth is copying this one's entries to, once it has begun: a lookup that
    /// finds its entry here retired looks for the copy there, instead of waiting for the whole
    /// copy to be published.
    pub(super) next: AtomicPtr<Table<K, V>>,
}

/// One key's place, told by its tag. Aligned so that a slot of a `u64` key and its entry (32
/// bytes) never straddles two cache lines.
#[repr(align(32))]
pub(super) struct Slot<K, V> {
    pub(super) key: UnsafeCell<MaybeUninit<K>>,
    pub(super) value: UnsafeCell<MaybeUninit<V>>,
    pub(super) retired: Retired,
}

impl<K, V> Slot<K, V> {
    pub(super) fn empty() -> Slot<K, V> {
        Slot {
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
        let words = slots.div_ceil(PER_WORD);
        // The bytes of slots the table has not (only in a table of fewer than eight): `DEAD`.
        let phantom = if slots < PER_WORD {
            (LOW * u64::from(DEAD)) << (8 * slots)
        } else {
            0
        };
        let tags = (0..words)
            .map(|_| AtomicU64::new((u64::from(EMPTY) * LOW) | phantom))
            .collect();
        let slots = (0..slots).map(|_| Slot::empty()).collect();
        Box::into_raw(Box::new(Table {
            slots,
            tags,
            next: AtomicPtr::new(core::ptr::null_mut()),
        }))
    }

    /// The word holding the tag of the slot at `i` (taken modulo the table's size), and the
    /// tag's shift in it.
    #[inline(always)]
    fn tag_word(&self, i: usize) -> (&AtomicU64, u32) {
        let i = i & self.mask();
        // SAFETY: `i` is below the number of slots, so `i / 8` below the number of words.
        let word = unsafe { self.tags.get_unchecked(i / PER_WORD) };
        (word, 8 * (i % PER_WORD) as u32)
    }

    /// The tag of the slot at `i`, for a writer (under the writer's lock, or owning a table not
    /// yet published) or a table being dropped.
    #[inline]
    pub(super) fn tag(&self, i: usize) -> u8 {
        let (word, shift) = self.tag_word(i);
        // Relaxed: only writers store tags, under the lock the caller holds (or in a table only
        // it can reach).
        (word.load(Ordering::Relaxed) >> shift) as u8
    }

    /// Sets the tag of the slot at `i`. The caller holds the writer's lock or owns a table not
    /// yet published, so no other store to the word races with this one.
    pub(super) fn set_tag(&self, i: usize, tag: u8) {
        let (word, shift) = self.tag_word(i);
        // Relaxed: as in `tag`.
        let old = word.load(Ordering::Relaxed);
        let new = (old & !(0xFF << shift)) | (u64::from(tag) << shift);
        // Release: the slot's key and value (and those of every other slot whose tag this word
        // holds) before the tag that makes lookups read them. See `tags`.
        word.store(new, Ordering::Release);
    }

    /// Writes a key and a value into the slot at `i`, which no lookup reads, and publishes them
    /// under `tag`.
    ///
    /// # Safety
    ///
    /// The slot is `EMPTY` or `FREED`, the caller holds the writer's lock (or owns a table not
    /// yet published), and no reference to its old key or value is alive.
    pub(super) unsafe fn fill(&self, i: usize, tag: u8, key: K, value: V) {
        // SAFETY: no lookup reads the cells of an `EMPTY` or `FREED` slot, and no other writer
        // runs: this write races with nothing.
        self.at(i).key.with_mut(|k| unsafe { (*k).write(key) });
        // SAFETY: as above.
        unsafe { self.publish(i, tag, value) };
    }

    /// Writes a key into the `EMPTY` slot at `i` of a table no lookup can reach yet, and marks
    /// it `RESERVED`.
    ///
    /// # Safety
    ///
    /// As [`Table::fill`], on a table not yet linked from the published one.
    pub(super) unsafe fn reserve(&self, i: usize, key: K) {
        // SAFETY: as in `fill`.
        self.at(i).key.with_mut(|k| unsafe { (*k).write(key) });
        self.set_tag(i, RESERVED);
    }

    /// Writes the value into the slot at `i`, whose key is written (`fill`, or `RESERVED`),
    /// and publishes both under `tag`.
    ///
    /// # Safety
    ///
    /// The slot's key is written, no lookup reads its value cell (its tag is not live), and the
    /// caller holds the writer's lock.
    pub(super) unsafe fn publish(&self, i: usize, tag: u8, value: V) {
        let slot = self.at(i);
        // SAFETY: no lookup reads the value of a slot whose tag is not live, and no other writer
        // runs.
        slot.value.with_mut(|v| unsafe { (*v).write(value) });
        // Relaxed: published with the tag below.
        slot.retired.flag().store(false, Ordering::Relaxed);
        // The key, the value and the cleared flag before the tag that makes lookups read them.
        self.set_tag(i, tag);
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

    /// Sends for the cache lines of `hash`'s first tags, of its home slot and of the two lines
    /// after that one, so that the caller's work before its probe, a clock read, overlaps the
    /// wait: written one after the other, the two waited in turn (`docs/design.md`, section 6.2,
    /// has the figures). Linear probing near the table's top load leaves a key past its home
    /// slot's line often: at three quarters full, one key in five lies past the home slot and the
    /// one after it, one in eleven past these three lines. A hint only, compiled where it is a
    /// plain instruction (x86-64).
    #[inline(always)]
    pub(super) fn prefetch(&self, hash: u64) {
        #[cfg(all(target_arch = "x86_64", not(miri), not(atomic_limiter_loom)))]
        {
            use core::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            /// A cache line's bytes on x86-64.
            const LINE: usize = 64;
            let tags: *const AtomicU64 = self.tag_word(hash as usize).0;
            let home: *const u8 = core::ptr::from_ref(self.at(hash as usize)).cast();
            // Past the table's end for its last slots: a hint's address is never read.
            let next = home.wrapping_add(LINE);
            let after = home.wrapping_add(2 * LINE);
            // SAFETY: a prefetch reads nothing the program can see and faults on no address;
            // SSE, which it needs, is part of every x86-64 target.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(tags.cast());
                _mm_prefetch::<_MM_HINT_T0>(home.cast());
                _mm_prefetch::<_MM_HINT_T0>(next.cast());
                _mm_prefetch::<_MM_HINT_T0>(after.cast());
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
        let wants = u64::from(want) * LOW;
        // Where the probe is: slot `at`, modulo the table's size. Truncated on 32-bit targets: an
        // index needs only the low bits.
        let mut at = hash as usize;
        // Every probe ends at an `EMPTY` slot: at least an eighth of every table is.
        loop {
            let (word, shift) = self.tag_word(at);
            // Acquire: pairs with the Release that stored the word: the slots its tags publish.
            let word = word.load(Ordering::Acquire);
            // The bytes of slots on the probe from `at` on.
            let ahead = !0u64 << shift;
            let mut hits = maybe_zero_bytes(word ^ wants) & ahead;
            while hits != 0 {
                let i = ((at & !(PER_WORD - 1)) + hits.trailing_zeros() as usize / 8) & self.mask();
                // SAFETY: the tag, read with Acquire, is live (see `maybe_zero_bytes`); the
                // caller keeps the table alive.
                if unsafe { self.at(i).key() }.borrow() == key {
                    return Some(i);
                }
                hits &= hits - 1;
            }
            // A key is never past an `EMPTY` slot on its probe.
            if zero_bytes(word) & ahead != 0 {
                return None;
            }
            at = (at | (PER_WORD - 1)).wrapping_add(1);
        }
    }

    /// The first slot on `hash`'s probe path that an insertion may take (`EMPTY` or `FREED`),
    /// and whether it was `EMPTY`. Called under the writer's lock, on a table with an `EMPTY`
    /// slot.
    pub(super) fn vacancy(&self, hash: u64) -> (usize, bool) {
        let mut i = hash as usize;
        loop {
            // Only writers change a tag to `EMPTY` or `FREED`, under the lock held here.
            match self.tag(i) {
                EMPTY => return (i & self.mask(), true),
                FREED => return (i & self.mask(), false),
                _ => i = i.wrapping_add(1),
            }
        }
    }
}

impl<K, V> Drop for Table<K, V> {
    fn drop(&mut self) {
        for (i, slot) in self.slots.iter().enumerate() {
            // The table is unreachable; its last writer synchronised with this thread.
            let tag = self.tag(i);
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

#[cfg(all(test, not(atomic_limiter_loom)))]
mod tests {
    use super::{HIGH, maybe_zero_bytes, zero_bytes};

    /// Every byte value beside every neighbour a probe meets, at every place in the word: only
    /// the zero bytes are marked (and by the quick form, besides them, only bytes 0x01). The
    /// quick form in `zero_bytes`' place fails this (a `DEAD` byte just above an `EMPTY` one
    /// reads as empty, and a probe would end before its key).
    #[test]
    #[cfg_attr(miri, ignore = "plain arithmetic, 16 000 words: a minute under Miri")]
    fn zero_bytes_marks_exactly_the_zero_bytes() {
        for fill in [0u8, 1, 2, 3, 0x7F, 0x80, 0x81, 0xFF] {
            for value in 0..=u8::MAX {
                for place in 0..8 {
                    let mut bytes = [fill; 8];
                    bytes[place] = value;
                    let word = u64::from_le_bytes(bytes);
                    let want = bytes
                        .iter()
                        .enumerate()
                        .filter(|&(_, &b)| b == 0)
                        .fold(0, |m, (i, _)| m | 0x80 << (8 * i));
                    assert_eq!(zero_bytes(word), want, "{word:#018x}");
                    assert_eq!(zero_bytes(word) & !HIGH, 0);
                    // The quick form marks every zero byte, and besides them only bytes 0x01.
                    let maybe = maybe_zero_bytes(word);
                    assert_eq!(maybe & want, want, "{word:#018x}");
                    assert_eq!(maybe & !HIGH, 0);
                    for (i, &b) in bytes.iter().enumerate() {
                        assert!(maybe & 0x80 << (8 * i) == 0 || b <= 1, "{word:#018x}");
                    }
                }
            }
        }
    }
}
