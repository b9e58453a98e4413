//! The keyed limiter's eviction index: every held key, ordered by when its bucket is full again.
//!
//! # Implementation details
//!
//! A min-heap of `(due, key)`, where `due` is a *lower bound* on the instant (ns, on the limiters'
//! clock) at which the key's bucket is full again. It is exact when recorded; a later admission
//! on the key moves the real instant on, and the heap is not told (the hot path stays one lookup
//! and one CAS). So whoever reads the front checks it against the key's state first:
//!
//! | front's real instant | what the reader does |
//! |---|---|
//! | the key is gone (swept) | drops the entry |
//! | passed: the bucket is full | evicts the key (under its lock, re-checked) |
//! | later than recorded | re-files the key at its real instant |
//! | as recorded, still ahead | stops: it is the soonest any held key is full, as every other entry is a lower bound |
//!
//! Each entry is re-filed at most once per stretch of admissions on its key, so a new key at the
//! cap costs one heap step (`O(log n)`) plus the re-filing that the admissions since have earned,
//! never a pass over the map.

use alloc::collections::BinaryHeap;
use core::cmp::Ordering;

/// One held key and the instant its bucket is full again (a lower bound).
#[derive(Debug)]
struct Due<K> {
    at: u64,
    key: K,
}

impl<K> PartialEq for Due<K> {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}

impl<K> Eq for Due<K> {}

impl<K> PartialOrd for Due<K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<K> Ord for Due<K> {
    /// Reversed, so that `BinaryHeap` (a max-heap) keeps the earliest on top.
    fn cmp(&self, other: &Self) -> Ordering {
        other.at.cmp(&self.at)
    }
}

/// What the front entry turned out to be, as the caller found it in the map.
pub(crate) enum Front {
    /// The key is no longer held.
    Gone,
    /// The bucket is full now, and the key was removed.
    Evicted,
    /// The bucket is full again at `at` (ns, a lower bound, for filing), which is `wait` ns from
    /// now (an upper bound, for a retry-after).
    FullAt { at: u64, wait: u64 },
}

/// Why a new key could not have a place: how long until a held key's bucket is full again, if
/// any key is held.
pub(crate) type NoRoom = Option<u64>;

/// The eviction index (see the module docs).
#[derive(Debug)]
pub(crate) struct DueQueue<K> {
    heap: BinaryHeap<Due<K>>,
}

impl<K> DueQueue<K> {
    pub(crate) fn new() -> DueQueue<K> {
        DueQueue {
            heap: BinaryHeap::new(),
        }
    }

    /// Files a key held from now on, full again at `at` or later.
    pub(crate) fn push(&mut self, key: K, at: u64) {
        // Grow by a quarter, not by doubling: the index holds one entry per held key, and a
        // doubled buffer would add up to another entry's worth of memory to every key.
        let len = self.heap.len();
        if len == self.heap.capacity() {
            self.heap.reserve_exact((len / 4).max(16));
        }
        self.heap.push(Due { at, key });
    }

    /// Evicts one held key whose bucket is full now, if there is one. `inspect` looks the key up
    /// and either evicts it (full) or tells when it will be full. `Err` says how long until the
    /// soonest held key is: fresh, since that entry was just checked.
    pub(crate) fn evict_one(&mut self, mut inspect: impl FnMut(&K) -> Front) -> Result<(), NoRoom> {
        while let Some(front) = self.heap.peek() {
            match inspect(&front.key) {
                Front::Gone => {
                    self.heap.pop();
                }
                Front::Evicted => {
                    self.heap.pop();
                    return Ok(());
                }
                Front::FullAt { at, .. } if at > front.at => {
                    // Used since it was filed: file it again at its real instant.
                    if let Some(mut entry) = self.heap.peek_mut() {
                        entry.at = at;
                    }
                }
                Front::FullAt { wait, .. } => return Err(Some(wait.max(1))),
            }
        }
        Err(None)
    }

    /// How many entries are filed (a key re-filed by a change of quota may have two).
    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }

    /// Keeps one entry per key, its earliest: the least of lower bounds is one too.
    pub(crate) fn dedup(&mut self)
    where
        K: core::hash::Hash + Eq,
    {
        let mut entries = core::mem::take(&mut self.heap).into_sorted_vec();
        // Sorted by the reversed order: the latest first. Earliest first, then first seen kept.
        entries.reverse();
        let keep: alloc::vec::Vec<bool> = {
            let mut seen = std::collections::HashSet::with_capacity(entries.len());
            entries.iter().map(|d| seen.insert(&d.key)).collect()
        };
        let mut kept = keep.into_iter();
        entries.retain(|_| kept.next().unwrap_or(true));
        self.heap = BinaryHeap::from(entries);
    }

    /// Files the held keys anew, each once, in place of everything filed (after a change of
    /// quota moved every instant).
    pub(crate) fn refile(&mut self, keys: alloc::vec::Vec<(K, u64)>) {
        self.heap = keys.into_iter().map(|(key, at)| Due { at, key }).collect();
    }

    /// Keeps only the keys `held` says are still in the map (after a sweep).
    pub(crate) fn retain(&mut self, mut held: impl FnMut(&K) -> bool) {
        self.heap.retain(|d| held(&d.key));
    }

    /// Frees memory left by removed entries.
    pub(crate) fn shrink_to_fit(&mut self) {
        self.heap.shrink_to_fit();
    }
}
