//! Which shard a thread's checks start from: the CPU it runs on where the kernel tells it for a
//! load ([`super::current_cpu`]), otherwise a number given to the thread once.

#[cfg(not(atomic_limiter_loom))]
use crate::sync::{Ordering, StaticAtomicUsize};

/// A small number for the calling thread, assigned once from a global counter (round robin), from
/// which a sharded limiter picks the thread's home shard. A thread keeps its number for life.
#[cfg(not(atomic_limiter_loom))]
#[inline]
pub(crate) fn thread_slot() -> usize {
    use core::cell::Cell;
    static NEXT: StaticAtomicUsize = StaticAtomicUsize::new(0);
    std::thread_local! {
        // Const-initialised, so reading it needs no lazy-initialisation check; `usize::MAX` means
        // "not numbered yet".
        static SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    SLOT.with(|slot| {
        let mine = slot.get();
        if mine != usize::MAX {
            return mine;
        }
        // Relaxed: only the uniqueness of the numbers handed out matters, which the RMW gives.
        let mine = NEXT.fetch_add(1, Ordering::Relaxed) & (usize::MAX >> 1);
        slot.set(mine);
        mine
    })
}

/// Where the calling thread's sharded checks start: the CPU it runs on, where the kernel publishes
/// that for the price of a load (see `current_cpu`), otherwise its [`thread_slot`]. Following the
/// CPU keeps threads that run at the same moment on different shards even when threads outnumber
/// shards; a thread number alone pairs some of them up on one shard.
#[cfg(not(atomic_limiter_loom))]
#[inline]
pub(crate) fn home_slot() -> usize {
    #[cfg(all(
        target_os = "linux",
        target_env = "gnu",
        any(target_arch = "x86_64", target_arch = "aarch64"),
        not(miri)
    ))]
    if let Some(cpu) = super::current_cpu::current_cpu() {
        return cpu;
    }
    thread_slot()
}

/// Under loom every thread starts on shard 0 (loom shares thread-locals between its threads, so a
/// per-thread number would not be per thread): the models exercise stealing, and pass explicit
/// home shards where they want others.
#[cfg(atomic_limiter_loom)]
pub(crate) fn home_slot() -> usize {
    0
}
