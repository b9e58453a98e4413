//! When a replaced cell may be freed: after a grace period, once every check that could have
//! loaded its pointer has finished.
//!
//! # Implementation details
//!
//! Each thread that checks has a slot, registered once. A check marks its slot with a fresh
//! section number on entry and clears it on exit; a change, after unpublishing the old cell, waits
//! out every section that was open when it looked. The checks pay two plain stores to their own
//! slot and no atomic read-modify-write: the ordering work is moved to the change, which is rare.
//!
//! | side | on Linux (`membarrier`) | elsewhere |
//! |---|---|---|
//! | a check enters | stores the section number, then a compiler fence | the same, then a full fence |
//! | a change, after publishing the new cell | asks the kernel to run a full barrier on every thread of the process | a full fence |
//! | then | reads every slot; waits while a slot still shows the number it read | the same |
//! | a check leaves | clears the slot (`Release`) | the same |
//!
//! Why that suffices: the barrier the change causes falls, in each checking thread, either after
//! the section number was stored (the change then reads it and waits for that section to end) or
//! before it (then the section's pointer load comes after the barrier, and so after the new
//! pointer was published: it cannot load the old one). A section that ends clears its slot with
//! `Release`, read by the change with `Acquire`: its reads of the old cell happen before the free.
//!
//! Under the loom models cells are freed only when the limiter is dropped: loom checks the cell
//! protocol, not the grace periods (it cannot model `membarrier`); those run under the tests and
//! Miri (which takes the full-fence arm).
#![allow(unsafe_code)]

#[cfg(not(atomic_limiter_loom))]
pub(super) use self::grace::{enter, synchronize};

/// A check on a cell, under loom: nothing to mark, since nothing is freed until the limiter is.
#[cfg(atomic_limiter_loom)]
pub(super) struct Section;

/// See the other arm.
#[cfg(atomic_limiter_loom)]
pub(super) fn enter() -> Section {
    Section
}

/// Under loom no grace period is waited: the caller keeps what it retired until it is dropped.
#[cfg(atomic_limiter_loom)]
pub(super) fn synchronize() -> bool {
    false
}

#[cfg(not(atomic_limiter_loom))]
mod grace {
    use alloc::sync::Arc;
    use alloc::vec::Vec;
    use core::cell::Cell;
    use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering, compiler_fence, fence};
    use std::sync::{Mutex, OnceLock, PoisonError};

    use crate::sync::Backoff;

    /// A thread's slot: 0 outside a check, else the number of the section it is in.
    #[derive(Debug, Default)]
    struct Slot {
        section: AtomicU64,
    }

    /// Every live thread's slot.
    static SLOTS: Mutex<Vec<Arc<Slot>>> = Mutex::new(Vec::new());

    /// Checks running on a thread whose slot is gone (in a thread-local destructor): counted
    /// here instead, and waited out like a busy slot.
    static STRAGGLERS: AtomicUsize = AtomicUsize::new(0);

    /// Whether the kernel runs the heavy barrier for us; decided once, before the first limiter
    /// exists, so every check and every change sees the same answer.
    static KERNEL_BARRIER: OnceLock<bool> = OnceLock::new();

    /// This thread's slot, how deeply it is nested in checks (a clock that checks another
    /// limiter), and the number of its last section.
    struct Local {
        slot: Arc<Slot>,
        depth: Cell<u32>,
        last: Cell<u64>,
    }

    impl Local {
        fn register() -> Local {
            let slot = Arc::new(Slot::default());
            SLOTS
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(slot.clone());
            Local {
                slot,
                depth: Cell::new(0),
                last: Cell::new(0),
            }
        }
    }

    impl Drop for Local {
        fn drop(&mut self) {
            SLOTS
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .retain(|s| !Arc::ptr_eq(s, &self.slot));
        }
    }

    std::thread_local! {
        static LOCAL: Local = Local::register();
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
        match LOCAL.try_with(|local| {
            local.enter();
            local as *const Local
        }) {
            Ok(local) => Section { local },
            Err(_) => straggle(),
        }
    }

    impl Local {
        /// Marks this thread's slot with a fresh number, unless it already is (nested checks).
        #[inline(always)]
        fn enter(&self) {
            let depth = self.depth.get();
            self.depth.set(depth + 1);
            if depth > 0 {
                return;
            }
            // Never 0 (which reads as "outside"), and never the previous section's number.
            let number = self.last.get().wrapping_add(1).max(1);
            self.last.set(number);
            // Release: a change that waits for the last section to end may read this number
            // rather than the 0 that ended it; reading it must order that section's reads
            // before the free just the same. (Ordered before this section's loads by the
            // barrier below.)
            self.slot.section.store(number, Ordering::Release);
            if KERNEL_BARRIER.get() == Some(&true) {
                // The kernel runs the full barrier on this thread when a change asks for it.
                compiler_fence(Ordering::SeqCst);
            } else {
                // SeqCst: the store above before this section's loads, against the change's
                // own SeqCst fence (store-load ordering on both sides).
                fence(Ordering::SeqCst);
            }
        }

        #[inline(always)]
        fn leave(&self) {
            let depth = self.depth.get() - 1;
            self.depth.set(depth);
            if depth == 0 {
                // Release: this section's reads of a cell happen before a change that reads the
                // cleared slot frees it.
                self.slot.section.store(0, Ordering::Release);
            }
        }
    }

    /// An open section: marked in this thread's slot, or (null) counted among the stragglers.
    /// The raw pointer also keeps it on its thread (not `Send`).
    pub(crate) struct Section {
        local: *const Local,
    }

    impl Drop for Section {
        #[inline(always)]
        fn drop(&mut self) {
            if self.local.is_null() {
                // Release: as a slot's clearing.
                STRAGGLERS.fetch_sub(1, Ordering::Release);
                return;
            }
            // SAFETY: this thread's thread-local, alive when the section opened; it is destroyed
            // only as this thread exits, which cannot happen inside a check, and the section
            // never leaves the thread.
            unsafe { &*self.local }.leave();
        }
    }

    /// A check on a thread whose slot is already gone (in a thread-local destructor).
    #[cold]
    fn straggle() -> Section {
        // SeqCst: a section's number and its barrier in one operation.
        STRAGGLERS.fetch_add(1, Ordering::SeqCst);
        Section {
            local: core::ptr::null(),
        }
    }

    /// Waits until every check that could have loaded a pointer unpublished before this call has
    /// finished; `false` if this thread is itself in a check (a clock that changes a quota), in
    /// which case nothing may be freed yet.
    pub(crate) fn synchronize() -> bool {
        let nested = LOCAL
            .try_with(|local| local.depth.get() > 0)
            .unwrap_or(true);
        if nested {
            return false;
        }
        if KERNEL_BARRIER.get() == Some(&true) {
            // Sections took only a compiler fence: without the kernel's barrier nothing may be
            // freed (it does not fail once registered; were it to, the cells wait for the next).
            if !kernel::barrier() {
                return false;
            }
        } else {
            // SeqCst: against the SeqCst fence of every section.
            fence(Ordering::SeqCst);
        }
        let slots: Vec<Arc<Slot>> = SLOTS.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let backoff = Backoff::new();
        for slot in &slots {
            // Acquire: pairs with a section's Release on leaving, or on entering the next one.
            let seen = slot.section.load(Ordering::Acquire);
            if seen == 0 {
                continue;
            }
            while slot.section.load(Ordering::Acquire) == seen {
                backoff.snooze();
            }
        }
        // Acquire: pairs with a straggler's Release on leaving.
        while STRAGGLERS.load(Ordering::Acquire) != 0 {
            backoff.snooze();
        }
        true
    }

    /// The heavy barrier from the kernel: `membarrier(2)`'s private expedited command, on Linux
    /// with glibc outside Miri.
    #[cfg(all(target_os = "linux", target_env = "gnu", not(miri)))]
    mod kernel {
        const PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
        const REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

        /// Registers the process for the private expedited command: whether it is available.
        pub(super) fn register() -> bool {
            // SAFETY: a system call with integer arguments only; it reads and writes no memory
            // of ours. Failure (an old kernel, a seccomp filter) is an error code, handled.
            unsafe { libc::syscall(libc::SYS_membarrier, REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0 }
        }

        /// A full barrier on every running thread of the process; `false` if the kernel refused.
        pub(super) fn barrier() -> bool {
            // SAFETY: as in `register`.
            unsafe { libc::syscall(libc::SYS_membarrier, PRIVATE_EXPEDITED, 0, 0) == 0 }
        }
    }

    /// Elsewhere, no kernel barrier: sections and changes take full fences.
    #[cfg(not(all(target_os = "linux", target_env = "gnu", not(miri))))]
    mod kernel {
        pub(super) fn register() -> bool {
            false
        }

        pub(super) fn barrier() -> bool {
            false
        }
    }
}

#[cfg(not(atomic_limiter_loom))]
pub(super) use self::grace::prepare;

/// Under loom there is nothing to prepare.
#[cfg(atomic_limiter_loom)]
pub(super) fn prepare() {}
