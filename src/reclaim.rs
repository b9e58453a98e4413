//! When memory a check may still be reading can be freed: after a grace period, once every check
//! that could have loaded a pointer to it has finished. Its users are a reconfigurable limiter's
//! replaced cell (`reconfigure`) and a keyed table's removed slots and old tables
//! (`keyed::FlatStore`); "cell" below stands for either.
//!
//! # Implementation details
//!
//! Each thread that checks has a slot, registered once, holding the number of its last section
//! and whether that section is open. A check opens a section by setting the open bit and closes
//! it with the next number, the bit clear; a change, after unpublishing the old cell,
//! waits out every section that was open when it looked. The checks pay two plain stores to their
//! own slot and no atomic read-modify-write: the ordering work is moved to the change, which is
//! rare. A change never waits: it notes which sections were open ([`Grace`]) and frees the cell
//! at a later change (or when the limiter is dropped) once each of them has closed. A change
//! that waited would wait for a check preempted mid-section (a scheduler's time slice, about
//! 10 ms with three threads checking on two cores), and for a check that is itself waiting on
//! this change (a clock that changes a quota): a deadlock.
//!
//! | side | on Linux (`membarrier`) | elsewhere |
//! |---|---|---|
//! | a check enters | stores its section number with the open bit, then a compiler fence | the same, then a full fence |
//! | a change, after publishing the new cell | asks the kernel to run a full barrier on every thread of the process | a full fence |
//! | then | reads every slot, and notes each that shows the open bit | the same |
//! | later | frees the cell once every noted slot has moved past the number it showed | the same |
//! | a check leaves | stores the next number, the bit clear (`Release`) | the same |
//!
//! Why that suffices: the barrier the change causes falls, in each checking thread, either after
//! the section number was stored (the change then reads it and waits for that section to end) or
//! before it (then the section's pointer load comes after the barrier, and so after the new
//! pointer was published: it cannot load the old one). A section that ends moves its slot on with
//! `Release`, read by the change with `Acquire`: its reads of the old cell happen before the free.
//! A check inside a check (a clock that checks another limiter) finds its slot open and leaves
//! it to the outer section. Which fence a section takes is fixed in its slot when the slot is
//! made (the kernel's answer is decided before any check runs), beside the open bit, so the check
//! tells both from the one load and the one branch it needs for nesting (a flag of its own and
//! a second branch cost about 1 ns a check: `docs/benchmarks.md`).
//!
//! Under the loom models cells are freed only when the limiter is dropped: loom checks the cell
//! protocol, not the grace periods (it cannot model `membarrier`); those run under the tests and
//! Miri (which takes the full-fence arm).
#![allow(unsafe_code)]

#[cfg(not(atomic_limiter_loom))]
pub(crate) use self::grace::{Grace, enter, grace};

/// A check on a cell, under loom: nothing to mark, since nothing is freed until the limiter is.
#[cfg(atomic_limiter_loom)]
pub(crate) struct Section;

/// See the other arm.
#[cfg(atomic_limiter_loom)]
pub(crate) fn enter() -> Section {
    Section
}

/// Under loom no grace period is ever taken, so none passes.
#[cfg(atomic_limiter_loom)]
#[derive(Debug, Clone)]
pub(crate) struct Grace;

#[cfg(atomic_limiter_loom)]
impl Grace {
    /// Never: the caller keeps what it retired until it is dropped.
    pub(crate) fn passed(&mut self) -> bool {
        false
    }
}

/// See the other arm: under loom, none.
#[cfg(atomic_limiter_loom)]
pub(crate) fn grace() -> Option<Grace> {
    None
}

#[cfg(not(atomic_limiter_loom))]
mod grace {
    use alloc::sync::Arc;
    use alloc::vec::Vec;
    use core::cell::Cell;
    use core::ptr;
    use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering, compiler_fence, fence};
    use std::sync::{Mutex, OnceLock, PoisonError};

    /// A thread's slot: the number of its last section, with two flags; only its thread writes
    /// it, and every section takes a new number.
    ///
    /// | bits | meaning |
    /// |---|---|
    /// | 0 ([`Slot::OPEN`]) | set while the thread is in a section (in a check) |
    /// | 1 ([`Slot::FENCED`]) | fixed when the slot is made: its sections take a full fence |
    /// | 2..64 | the section count, one more each time a section closes (wraps after 2^62) |
    ///
    /// A section's fence is told from the number it already reads to see whether it is nested,
    /// by the same test: the check's common path (open nothing, fence nothing) takes one branch.
    #[derive(Debug)]
    struct Slot {
        section: AtomicU64,
    }

    impl Slot {
        const OPEN: u64 = 1;
        const FENCED: u64 = 1 << 1;
        /// A section's close: clears `OPEN`, counts one more.
        const CLOSE: u64 = (1 << 2) - Slot::OPEN;

        /// A slot whose sections take a full fence unless the kernel runs the barrier for them.
        fn new(kernel_barrier: bool) -> Slot {
            Slot {
                section: AtomicU64::new(if kernel_barrier { 0 } else { Slot::FENCED }),
            }
        }

        /// Whether `number` is a section's while it is open.
        #[inline(always)]
        fn is_open(number: u64) -> bool {
            number & Slot::OPEN != 0
        }
    }

    /// Every live thread's slot.
    static SLOTS: Mutex<Vec<Arc<Slot>>> = Mutex::new(Vec::new());

    /// Checks running on a thread whose slot is gone (in a thread-local destructor): counted
    /// here instead, and waited out like a busy slot.
    static STRAGGLERS: AtomicUsize = AtomicUsize::new(0);

    /// Whether the kernel runs the heavy barrier for us; decided once, before the first limiter
    /// exists, so every change sees the same answer.
    static KERNEL_BARRIER: OnceLock<bool> = OnceLock::new();

    /// A slot pointer's value for a thread whose slot is gone (its thread-locals are being
    /// destroyed): its checks are stragglers.
    const GONE: usize = 1;

    std::thread_local! {
        /// This thread's slot (null until the first check registers it, [`GONE`] after): read by
        /// every check, so a plain thread-local with nothing to initialise or destroy, whose
        /// access is one load. The slot is kept alive by [`OWNER`].
        static SLOT: Cell<*const Slot> = const { Cell::new(ptr::null()) };
        /// Owns this thread's slot, registered in [`SLOTS`]; when the thread exits it takes the
        /// slot out of them and marks [`SLOT`] gone.
        static OWNER: Owner = Owner::register();
    }

    struct Owner {
        slot: Arc<Slot>,
    }

    impl Owner {
        fn register() -> Owner {
            // Decided before this thread's first check: `prepare` ran when the limiter it checks
            // was built. A slot made before (none is) would take full fences: never wrong, only
            // slower.
            let slot = Arc::new(Slot::new(KERNEL_BARRIER.get() == Some(&true)));
            SLOTS
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(slot.clone());
            Owner { slot }
        }
    }

    impl Drop for Owner {
        fn drop(&mut self) {
            // Not in a check: thread-local destructors run outside every check of this thread.
            SLOT.with(|slot| slot.set(ptr::without_provenance(GONE)));
            SLOTS
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .retain(|s| !Arc::ptr_eq(s, &self.slot));
        }
    }

    /// Decides, once, whether changes ask the kernel for the heavy barrier. Called when a
    /// reconfigurable limiter is built, so before any check or change on one.
    pub(crate) fn prepare() {
        KERNEL_BARRIER.get_or_init(kernel::register);
    }

    /// Opens a section, a check on a cell, which a change waits out before freeing that cell; it
    /// closes when the guard is dropped (also when the check unwinds).
    #[inline(always)]
    pub(crate) fn enter() -> Section {
        let slot = SLOT.with(Cell::get);
        if slot.addr() <= GONE {
            return enter_slow();
        }
        // SAFETY: a registered slot, owned by this thread's `OWNER`, which is destroyed (and the
        // pointer marked gone first) only as the thread exits, outside every check.
        let slot = unsafe { &*slot };
        // Relaxed: only this thread writes its slot.
        let last = slot.section.load(Ordering::Relaxed);
        if last & (Slot::OPEN | Slot::FENCED) != 0 {
            return enter_fenced_or_nested(slot, last);
        }
        // Release: a change that waits for the last section to end may read this number rather
        // than the one that ended it; reading it must order that section's reads before the free
        // just the same. (Ordered before this section's loads by the kernel's barrier.)
        slot.section.store(last | Slot::OPEN, Ordering::Release);
        // The kernel runs the full barrier on this thread when a change asks for it.
        compiler_fence(Ordering::SeqCst);
        Section { slot }
    }

    /// [`enter`] on a slot whose sections take a full fence, or inside an open section.
    #[cold]
    #[inline(never)]
    fn enter_fenced_or_nested(slot: &Slot, last: u64) -> Section {
        if Slot::is_open(last) {
            // Nested (a clock that checks another limiter): the outer section covers it.
            return Section { slot: ptr::null() };
        }
        // Release: as in `enter`.
        slot.section.store(last | Slot::OPEN, Ordering::Release);
        // SeqCst: the store above before this section's loads, against the change's own SeqCst
        // fence (store-load ordering on both sides).
        fence(Ordering::SeqCst);
        Section { slot }
    }

    /// [`enter`] on a thread without a slot: registers one, or, when its thread-locals are
    /// being destroyed, counts the check as a straggler.
    #[cold]
    #[inline(never)]
    fn enter_slow() -> Section {
        if SLOT.with(Cell::get).addr() != GONE
            && OWNER
                .try_with(|owner| SLOT.with(|slot| slot.set(Arc::as_ptr(&owner.slot))))
                .is_ok()
        {
            return enter();
        }
        // SeqCst: a section's number and its barrier in one operation.
        STRAGGLERS.fetch_add(1, Ordering::SeqCst);
        Section {
            slot: ptr::without_provenance(GONE),
        }
    }

    /// An open section: this thread's slot, null for a nested one (nothing to close), or
    /// [`GONE`] for a straggler. The raw pointer also keeps it on its thread (not `Send`).
    pub(crate) struct Section {
        slot: *const Slot,
    }

    impl Drop for Section {
        #[inline(always)]
        fn drop(&mut self) {
            if self.slot.is_null() {
                return;
            }
            if self.slot.addr() == GONE {
                // Release: as a slot's closing.
                STRAGGLERS.fetch_sub(1, Ordering::Release);
                return;
            }
            // SAFETY: this thread's slot, alive when the section opened; it is freed only after
            // this thread's `OWNER` is destroyed, as the thread exits, which cannot happen inside
            // a check, and the section never leaves the thread.
            let slot = unsafe { &*self.slot };
            // Relaxed: only this thread writes its slot.
            let open = slot.section.load(Ordering::Relaxed);
            // Release: this section's reads of a cell happen before a change that reads the
            // closed slot frees it.
            slot.section
                .store(open.wrapping_add(Slot::CLOSE), Ordering::Release);
        }
    }

    /// The sections open when a change looked, after it unpublished a cell: once each has closed
    /// ([`Grace::passed`]), no check can still be reading that cell, nor any cell unpublished
    /// before it.
    #[derive(Debug, Clone)]
    pub(crate) struct Grace {
        /// Each slot seen open, with the number it showed.
        open: Vec<(Arc<Slot>, u64)>,
        /// Stragglers were counted: they are anonymous, so the count must reach 0.
        stragglers: bool,
    }

    impl Grace {
        /// Whether every section noted has closed; never waits.
        pub(crate) fn passed(&mut self) -> bool {
            // Acquire: pairs with a section's Release on closing, or on opening the next one:
            // its reads of a cell happen before the free that follows.
            self.open
                .retain(|(slot, seen)| slot.section.load(Ordering::Acquire) == *seen);
            if self.stragglers {
                // Acquire: pairs with a straggler's Release on leaving.
                self.stragglers = STRAGGLERS.load(Ordering::Acquire) != 0;
            }
            self.open.is_empty() && !self.stragglers
        }
    }

    /// Called after a pointer was unpublished: notes every check section that could have loaded
    /// it, without waiting for any. `None` if the kernel refused its barrier (nothing may be
    /// freed on the strength of this call; a later one covers the same cells).
    pub(crate) fn grace() -> Option<Grace> {
        if KERNEL_BARRIER.get() == Some(&true) {
            // Sections may take only a compiler fence: without the kernel's barrier nothing may
            // be freed (it does not fail once registered).
            if !kernel::barrier() {
                return None;
            }
        } else {
            // SeqCst: against the SeqCst fence of every section.
            fence(Ordering::SeqCst);
        }
        let slots: Vec<Arc<Slot>> = SLOTS.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let open = slots
            .into_iter()
            .filter_map(|slot| {
                // Acquire: as in `Grace::passed`. A section of this very thread (a change made
                // from inside a check) is noted like any other: its cell outlives the check.
                let seen = slot.section.load(Ordering::Acquire);
                Slot::is_open(seen).then_some((slot, seen))
            })
            .collect();
        // Acquire: pairs with a straggler's Release on leaving.
        let stragglers = STRAGGLERS.load(Ordering::Acquire) != 0;
        Some(Grace { open, stragglers })
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// This thread's slot's number, once a section registered it.
        fn number() -> u64 {
            let slot = SLOT.with(Cell::get);
            assert!(slot.addr() > GONE, "no slot registered");
            // SAFETY: this thread's registered slot, as in `enter`.
            unsafe { &*slot }.section.load(Ordering::Relaxed)
        }

        /// A section opens and closes its slot's number and keeps the slot's fence as made; a
        /// nested one leaves the number alone; a grace taken while it is open has not passed.
        #[test]
        fn a_section_moves_its_number_on_and_keeps_the_slot_fence() {
            prepare();
            let fenced = if KERNEL_BARRIER.get() == Some(&true) {
                0
            } else {
                Slot::FENCED
            };
            drop(enter());
            let closed = number();
            assert_eq!(closed & (Slot::OPEN | Slot::FENCED), fenced);
            let outer = enter();
            let open = number();
            assert_eq!(open, closed | Slot::OPEN);
            let mut grace = grace().expect("the kernel's barrier, once registered, runs");
            drop(enter());
            assert_eq!(number(), open, "a nested section changes nothing");
            assert!(!grace.passed(), "this thread's section is still open");
            drop(outer);
            let next = number();
            assert_eq!(next & (Slot::OPEN | Slot::FENCED), fenced);
            assert_ne!(next, closed);
            // Other tests' threads may be in sections of their own for a while.
            let start = std::time::Instant::now();
            while !grace.passed() {
                assert!(start.elapsed() < std::time::Duration::from_secs(10));
                std::thread::yield_now();
            }
        }

        /// A slot that takes full fences: its sections keep it so, and each closes with a new
        /// number, wrapping at the end of the count.
        #[test]
        fn a_fenced_slot_stays_fenced() {
            let slot = Slot::new(false);
            for start in [Slot::FENCED, u64::MAX - Slot::OPEN] {
                slot.section.store(start, Ordering::Relaxed);
                let section = enter_fenced_or_nested(&slot, start);
                let open = slot.section.load(Ordering::Relaxed);
                assert_eq!(open, start | Slot::OPEN);
                assert!(enter_fenced_or_nested(&slot, open).slot.is_null(), "nested");
                drop(section);
                let closed = slot.section.load(Ordering::Relaxed);
                assert_eq!(closed & (Slot::OPEN | Slot::FENCED), Slot::FENCED);
                assert_ne!(closed, start);
            }
        }
    }

    /// The heavy barrier from the kernel: `membarrier(2)`'s private expedited command, on Linux
    /// with glibc outside Miri.
    #[cfg(all(target_os = "linux", target_env = "gnu", not(miri)))]
    mod kernel {
        const PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
        const REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

        /// Registers the process for the private expedited command: whether it is available.
        pub(crate) fn register() -> bool {
            // SAFETY: a system call with integer arguments only; it reads and writes no memory
            // of ours. Failure (an old kernel, a seccomp filter) is an error code, handled.
            unsafe { libc::syscall(libc::SYS_membarrier, REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0 }
        }

        /// A full barrier on every running thread of the process; `false` if the kernel refused.
        pub(crate) fn barrier() -> bool {
            // SAFETY: as in `register`.
            unsafe { libc::syscall(libc::SYS_membarrier, PRIVATE_EXPEDITED, 0, 0) == 0 }
        }
    }

    /// Elsewhere, no kernel barrier: sections and changes take full fences.
    #[cfg(not(all(target_os = "linux", target_env = "gnu", not(miri))))]
    mod kernel {
        pub(crate) fn register() -> bool {
            false
        }

        pub(crate) fn barrier() -> bool {
            false
        }
    }
}

#[cfg(not(atomic_limiter_loom))]
pub(crate) use self::grace::prepare;

/// Under loom there is nothing to prepare.
#[cfg(atomic_limiter_loom)]
pub(crate) fn prepare() {}
