//! When memory a check may still be reading can be freed: after a grace period, once every check
//! that could have loaded a pointer to it has finished. Its users are a reconfigurable limiter's
//! replaced cell (`reconfigure`) and a keyed table's removed slots and old tables
//! (`keyed::FlatStore`); "cell" below stands for either.
//!
//! # Implementation details
//!
//! Each thread that checks has a slot, registered once, holding how many sections are open on
//! its thread and a count. A check opens a section by adding one to the depth and closes it by
//! taking one from the depth and adding one to the count; a change, after unpublishing the old
//! cell, waits out every section that was open when it looked. The checks pay two plain stores to
//! their own slot and no atomic read-modify-write: the ordering work is moved to the change, which
//! is rare. A change never waits: it notes which sections were open ([`Grace`]) and frees the cell
//! at a later change (or when the limiter is dropped) once each of them has closed. A change
//! that waited would wait for a check preempted mid-section (a scheduler's time slice, about
//! 10 ms with three threads checking on two cores), and for a check that is itself waiting on
//! this change (a clock that changes a quota): a deadlock.
//!
//! | side | on Linux (`membarrier`) | elsewhere |
//! |---|---|---|
//! | a check enters | stores its slot's number with one more open, then a compiler fence | the same, then a full fence |
//! | a change, after publishing the new cell | asks the kernel to run a full barrier on every thread of the process | a full fence |
//! | then | reads every slot, and notes each that shows a section open | the same |
//! | later | frees the cell once every noted slot shows none open, or another outermost section | the same |
//! | a check leaves | stores its slot's number with one fewer open and the count one more (`Release`) | the same |
//!
//! Why that suffices: the barrier the change causes falls, in each checking thread, either after
//! the section's number was stored (the change then reads it and waits for that section to end)
//! or before it (then the section's pointer load comes after the barrier, and so after the new
//! pointer was published: it cannot load the old one). A section that ends moves its slot on with
//! `Release`, read by the change with `Acquire`: its reads of the old cell happen before the free.
//! A check inside a check (a clock that checks another limiter) finds its slot open: it adds one
//! to the depth and takes one from the count, which its close gives back, so that its close, the
//! same store as any other, does not end the outer section for a change (the slot's turn, the
//! count plus the depth, stands from an outermost open to the next). Which fence a section takes
//! is fixed in its slot when the slot is made (the kernel's answer is decided before any check
//! runs), beside the depth, so the check tells both from the one load and the one branch it needs
//! for nesting (a flag of its own and a second branch cost about 1 ns a check:
//! `docs/benchmarks.md`). A thread without a slot points at a stand-in that reads as open and
//! fenced, so that branch also catches it, and a close tests nothing.
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
    use core::sync::atomic::{AtomicU64, Ordering, compiler_fence, fence};
    use std::sync::{Mutex, OnceLock, PoisonError};

    /// A thread's slot: how many sections are open on its thread, a flag, and a count that
    /// tells one outermost section from the next; only its thread writes it (a straggler's slot,
    /// only its one section).
    ///
    /// | bits | meaning |
    /// |---|---|
    /// | 0..8 ([`Slot::DEPTH`]) | sections open on the thread: 0 outside every check, 1 in one, one more for each nested in it (at most 255) |
    /// | 8 ([`Slot::FENCED`]) | fixed when the slot is made: its sections take a full fence |
    /// | 9..64 | the count: one more at each close, one less at each nested open (wraps) |
    ///
    /// A close adds [`Slot::CLOSE`] whatever the depth (one store, no branch), and a nested open
    /// takes it back, so the count plus the depth ([`Slot::turn`]) moves on only when an
    /// outermost section opens: while the section a change saw open is open, the turn stands.
    /// A section's fence is told from the number it already reads to see whether it is nested,
    /// by the same test: the check's common path (open nothing, fence nothing) takes one branch.
    #[derive(Debug)]
    struct Slot {
        section: AtomicU64,
        /// Made for one straggler's section: taken out of [`SLOTS`] once that has closed.
        straggler: bool,
    }

    impl Slot {
        const DEPTH: u64 = (1 << 8) - 1;
        const FENCED: u64 = 1 << 8;
        /// Where the count starts (bits 9..64).
        const COUNT_SHIFT: u32 = 9;
        /// One step of the count.
        const STEP: u64 = 1 << Slot::COUNT_SHIFT;
        /// A section's close: one section fewer open, the count one more.
        const CLOSE: u64 = Slot::STEP - 1;
        /// The turn's bits: the count's width.
        const TURN: u64 = u64::MAX >> Slot::COUNT_SHIFT;

        /// A slot whose sections take a full fence unless the kernel runs the barrier for them.
        fn new(kernel_barrier: bool) -> Slot {
            Slot {
                section: AtomicU64::new(if kernel_barrier { 0 } else { Slot::FENCED }),
                straggler: false,
            }
        }

        /// A stand-in that no section writes: open and fenced, so a check takes the slow path.
        const fn sentinel() -> Slot {
            Slot {
                section: AtomicU64::new(1 | Slot::FENCED),
                straggler: false,
            }
        }

        /// How many sections `number` says are open.
        #[inline(always)]
        fn depth(number: u64) -> u64 {
            number & Slot::DEPTH
        }

        /// The count plus the depth: one more for each outermost section opened, the same
        /// from an outermost section's open until the next's.
        fn turn(number: u64) -> u64 {
            (number >> Slot::COUNT_SHIFT).wrapping_add(Slot::depth(number)) & Slot::TURN
        }

        /// Whether the section open when the slot read `seen` is still open at `now`.
        fn still_open(seen: u64, now: u64) -> bool {
            Slot::depth(now) != 0 && Slot::turn(now) == Slot::turn(seen)
        }
    }

    /// Every live thread's slot, and every straggler's whose section a change has not yet
    /// found closed.
    static SLOTS: Mutex<Vec<Arc<Slot>>> = Mutex::new(Vec::new());

    /// Whether the kernel runs the heavy barrier for us; decided once, before the first limiter
    /// exists, so every change sees the same answer.
    static KERNEL_BARRIER: OnceLock<bool> = OnceLock::new();

    /// What [`SLOT`] points at before this thread's first check registers its slot: never
    /// written, and read as an open fenced section, so that the check's one test of its number
    /// sends it to the slow path (no test of the pointer on the common path).
    static UNREGISTERED: Slot = Slot::sentinel();
    /// As [`UNREGISTERED`], once the thread's slot is gone: its checks are stragglers.
    static DEPARTED: Slot = Slot::sentinel();

    std::thread_local! {
        /// This thread's slot ([`UNREGISTERED`] until the first check registers it, [`DEPARTED`]
        /// after): read by every check, so a plain thread-local with nothing to initialise or
        /// destroy, whose access is one load. The slot is kept alive by [`OWNER`].
        static SLOT: Cell<*const Slot> = const { Cell::new(&raw const UNREGISTERED) };
        /// Owns this thread's slot, registered in [`SLOTS`]; when the thread exits it takes the
        /// slot out of them and points [`SLOT`] at [`DEPARTED`].
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
            SLOT.with(|slot| slot.set(&raw const DEPARTED));
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
        // SAFETY: this thread's registered slot, owned by its `OWNER`, which is destroyed (and
        // the pointer moved to `DEPARTED` first) only as the thread exits, outside every check;
        // or one of the two sentinels, statics.
        let slot = unsafe { &*SLOT.with(Cell::get) };
        // Relaxed: only this thread writes its slot.
        let last = slot.section.load(Ordering::Relaxed);
        if last & (Slot::DEPTH | Slot::FENCED) != 0 {
            return enter_fenced_or_nested(slot, last);
        }
        // Release: a change that waits for the last section to end may read this number rather
        // than the one that ended it; reading it must order that section's reads before the free
        // just the same. (Ordered before this section's loads by the kernel's barrier.)
        slot.section.store(last + 1, Ordering::Release);
        // The kernel runs the full barrier on this thread when a change asks for it.
        compiler_fence(Ordering::SeqCst);
        Section { slot }
    }

    /// [`enter`] on a slot whose sections take a full fence, inside an open section, or on a
    /// thread without a slot (a sentinel's number reads as both).
    #[cold]
    #[inline(never)]
    fn enter_fenced_or_nested(slot: &Slot, last: u64) -> Section {
        if ptr::eq(slot, &UNREGISTERED) || ptr::eq(slot, &DEPARTED) {
            return enter_slow();
        }
        match Slot::depth(last) {
            0 => {
                // Release: as in `enter`.
                slot.section.store(last + 1, Ordering::Release);
                // SeqCst: the store above before this section's loads, against the change's own
                // SeqCst fence (store-load ordering on both sides).
                fence(Ordering::SeqCst);
            }
            // Deeper than the depth's bits hold: a section of its own.
            Slot::DEPTH => return straggle(),
            _ => {
                // Nested (a clock that checks another limiter): the outer section covers it; one
                // more open, and the count one less, which its close gives back. Release: as in
                // `enter` (the outer section's turn stands, so no change frees on it).
                slot.section
                    .store(last.wrapping_sub(Slot::CLOSE), Ordering::Release);
            }
        }
        Section { slot }
    }

    /// [`enter`] on a thread without a slot: registers one, or, when its thread-locals are
    /// being destroyed, opens a straggler's section.
    #[cold]
    #[inline(never)]
    fn enter_slow() -> Section {
        if !ptr::eq(SLOT.with(Cell::get), &DEPARTED)
            && OWNER
                .try_with(|owner| SLOT.with(|slot| slot.set(Arc::as_ptr(&owner.slot))))
                .is_ok()
        {
            return enter();
        }
        straggle()
    }

    /// A section on a slot of its own (a check on a thread whose slot is gone, or nested past
    /// the depth a slot counts), made open and registered; the first registration or change
    /// that finds it closed takes it out of [`SLOTS`], which frees it.
    fn straggle() -> Section {
        let slot = Arc::new(Slot {
            section: AtomicU64::new(1),
            straggler: true,
        });
        let section = Section {
            slot: Arc::as_ptr(&slot),
        };
        let mut slots = SLOTS.lock().unwrap_or_else(PoisonError::into_inner);
        reap(&mut slots);
        // Under the lock that a change takes to read the slots, after its barrier or fence: a
        // change that takes it later sees this section open; one that took it before published
        // its cell before this section's loads (the lock's release and acquire order them).
        slots.push(slot);
        section
    }

    /// Takes out of `slots` every straggler's slot whose section has closed, freeing it: its
    /// close was the last that section did with it, and no other section uses it.
    fn reap(slots: &mut Vec<Arc<Slot>>) {
        // Acquire: pairs with the close's Release; the close happens before the free.
        slots.retain(|s| !(s.straggler && Slot::depth(s.section.load(Ordering::Acquire)) == 0));
    }

    /// An open section: the slot it closes, this thread's or a straggler's. The raw pointer
    /// also keeps it on its thread (not `Send`).
    pub(crate) struct Section {
        slot: *const Slot,
    }

    impl Drop for Section {
        #[inline(always)]
        fn drop(&mut self) {
            // SAFETY: this thread's slot, alive when the section opened; it is freed only after
            // this thread's `OWNER` is destroyed, as the thread exits, which cannot happen inside
            // a check, and the section never leaves the thread. Or a straggler's slot, freed only
            // once a change or registration has read it closed, after this close.
            let slot = unsafe { &*self.slot };
            // Relaxed: only this thread (this section, for a straggler's) writes the slot.
            let open = slot.section.load(Ordering::Relaxed);
            // Release: this section's reads of a cell happen before a change that reads the
            // closed slot frees it. One section fewer open, the count one more: nested or
            // outermost alike.
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
    }

    impl Grace {
        /// Whether every section noted has closed; never waits.
        pub(crate) fn passed(&mut self) -> bool {
            // Acquire: pairs with a section's Release on closing, or on opening the next one:
            // its reads of a cell happen before the free that follows.
            self.open.retain(|(slot, seen)| {
                Slot::still_open(*seen, slot.section.load(Ordering::Acquire))
            });
            self.open.is_empty()
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
        let slots: Vec<Arc<Slot>> = {
            let mut slots = SLOTS.lock().unwrap_or_else(PoisonError::into_inner);
            reap(&mut slots);
            slots.clone()
        };
        let open = slots
            .into_iter()
            .filter_map(|slot| {
                // Acquire: as in `Grace::passed`. A section of this very thread (a change made
                // from inside a check) is noted like any other: its cell outlives the check.
                let seen = slot.section.load(Ordering::Acquire);
                (Slot::depth(seen) != 0).then_some((slot, seen))
            })
            .collect();
        Some(Grace { open })
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// Slots' numbers the tests start from: a fenced slot's first, one whose count is
        /// about to wrap, and its second.
        const STARTS: [u64; 3] = [Slot::FENCED, !Slot::DEPTH, Slot::FENCED | Slot::STEP];

        /// This thread's slot's number, once a section registered it.
        fn number() -> u64 {
            let slot = SLOT.with(Cell::get);
            assert!(
                !ptr::eq(slot, &UNREGISTERED) && !ptr::eq(slot, &DEPARTED),
                "no slot registered"
            );
            // SAFETY: this thread's registered slot, as in `enter`.
            unsafe { &*slot }.section.load(Ordering::Relaxed)
        }

        /// A section opens and closes its slot's number and keeps the slot's fence as made; a
        /// nested one gives back what it took; a grace taken while the outer one is open has
        /// not passed, nested sections or not.
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
            assert_eq!(closed & (Slot::DEPTH | Slot::FENCED), fenced);
            let outer = enter();
            let open = number();
            assert_eq!(open, closed + 1);
            let mut grace = grace().expect("the kernel's barrier, once registered, runs");
            let nested = enter();
            assert_eq!(Slot::depth(number()), 2);
            assert!(!grace.passed(), "this thread's section is still open");
            drop(nested);
            assert_eq!(number(), open, "a nested section gives back what it took");
            assert!(!grace.passed(), "this thread's section is still open");
            drop(outer);
            let next = number();
            assert_eq!(next & (Slot::DEPTH | Slot::FENCED), fenced);
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
            for start in STARTS {
                slot.section.store(start, Ordering::Relaxed);
                let section = enter_fenced_or_nested(&slot, start);
                let open = slot.section.load(Ordering::Relaxed);
                assert_eq!(open, start + 1);
                let nested = enter_fenced_or_nested(&slot, open);
                assert!(ptr::eq(nested.slot, &slot), "nested on the same slot");
                assert!(Slot::still_open(open, slot.section.load(Ordering::Relaxed)));
                drop(nested);
                assert_eq!(slot.section.load(Ordering::Relaxed), open);
                drop(section);
                let closed = slot.section.load(Ordering::Relaxed);
                assert_eq!(closed & (Slot::DEPTH | Slot::FENCED), Slot::FENCED);
                assert_ne!(closed, start);
                assert!(!Slot::still_open(open, closed));
            }
        }

        /// Sections opened and closed at random depths on one slot, from counts near the wrap:
        /// a number read while a section is open shows it open until that outermost section
        /// closes, and never after, whatever nested ones open and close meanwhile.
        #[test]
        fn a_seen_section_stays_open_exactly_until_its_outermost_closes() {
            let slot = Slot::new(false);
            let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
            let mut random = move || {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed
            };
            for start in STARTS {
                slot.section.store(start, Ordering::Relaxed);
                let mut open: Vec<Section> = Vec::new();
                // Each number seen with a section open, and the outermost section's serial.
                let mut seen: Vec<(u64, u64)> = Vec::new();
                let mut outermost = 0_u64;
                // Fewer under Miri, which runs each step some thousand times slower.
                for _ in 0..if cfg!(miri) { 400 } else { 20_000 } {
                    let now = slot.section.load(Ordering::Relaxed);
                    match random() % 5 {
                        0 | 1 if open.len() < 40 => {
                            if open.is_empty() {
                                outermost += 1;
                            }
                            open.push(enter_fenced_or_nested(&slot, now));
                        }
                        0..=2 => drop(open.pop()),
                        _ if !open.is_empty() => seen.push((now, outermost)),
                        _ => {}
                    }
                    let now = slot.section.load(Ordering::Relaxed);
                    assert_eq!(Slot::depth(now), open.len() as u64);
                    for &(number, serial) in &seen {
                        let live = !open.is_empty() && serial == outermost;
                        assert_eq!(
                            Slot::still_open(number, now),
                            live,
                            "{number:#x} at {now:#x}"
                        );
                    }
                    if seen.len() > 200 {
                        seen.remove(0);
                    }
                }
                drop(open);
            }
        }

        /// A check nested past what a slot's depth counts opens a section of its own, which a
        /// grace taken meanwhile waits out, and which is freed once found closed.
        #[test]
        fn sections_nested_past_the_depth_straggle_and_are_waited_out() {
            let slot = Slot::new(false);
            let mut open: Vec<Section> = Vec::new();
            for _ in 0..Slot::DEPTH {
                open.push(enter_fenced_or_nested(
                    &slot,
                    slot.section.load(Ordering::Relaxed),
                ));
            }
            assert_eq!(
                Slot::depth(slot.section.load(Ordering::Relaxed)),
                Slot::DEPTH
            );
            let own = enter_fenced_or_nested(&slot, slot.section.load(Ordering::Relaxed));
            assert!(!ptr::eq(own.slot, &slot), "a slot of its own");
            assert_eq!(
                Slot::depth(slot.section.load(Ordering::Relaxed)),
                Slot::DEPTH
            );
            // Kept so that its memory is not reused while it is looked for below.
            let kept = SLOTS
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .find(|s| ptr::eq(Arc::as_ptr(s), own.slot))
                .map(Arc::downgrade)
                .expect("registered");
            let mut waits = grace().expect("a change's barrier");
            assert!(!waits.passed(), "the straggler's section is open");
            drop(own);
            let start = std::time::Instant::now();
            while !waits.passed() {
                assert!(start.elapsed() < std::time::Duration::from_secs(10));
                std::thread::yield_now();
            }
            drop(grace());
            let registered = SLOTS
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .any(|s| ptr::eq(Arc::as_ptr(s), kept.as_ptr()));
            assert!(!registered, "taken out once found closed");
            drop(open);
            assert_eq!(
                slot.section.load(Ordering::Relaxed),
                Slot::FENCED + Slot::STEP
            );
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
