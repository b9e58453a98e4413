//! The one place where atomics are named.
//!
//! Every other module takes its atomic types from here, so that the loom model checks can swap them
//! for loom's instrumented ones. Three arms:
//!
//! | cfg / feature                       | `AtomicU64` comes from      |
//! |-------------------------------------|-----------------------------|
//! | `--cfg atomic_limiter_loom`         | `loom::sync::atomic`        |
//! | feature `portable-atomic`           | `portable_atomic`           |
//! | otherwise                           | `core::sync::atomic`        |
//!
//! `Arc` follows the same switch so that a [`ManualClock`](crate::ManualClock) shared between
//! loom threads is visible to loom too.

#[cfg(atomic_limiter_loom)]
pub(crate) use loom::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

#[cfg(all(not(target_has_atomic = "64"), not(feature = "portable-atomic")))]
compile_error!(
    "this target has no 64-bit atomics: enable atomic-limiter's `portable-atomic` feature"
);

#[cfg(all(not(atomic_limiter_loom), feature = "portable-atomic"))]
pub(crate) use portable_atomic::AtomicU64;

#[cfg(all(not(atomic_limiter_loom), not(feature = "portable-atomic")))]
pub(crate) use core::sync::atomic::AtomicU64;

#[cfg(not(feature = "portable-atomic"))]
pub(crate) use core::sync::atomic::AtomicU64 as StaticAtomicU64;
/// An atomic that can live in a `static` (loom's cannot be built in one). Its one user, the jitter
/// sequence, takes part in no protocol the loom models check.
#[cfg(feature = "portable-atomic")]
pub(crate) use portable_atomic::AtomicU64 as StaticAtomicU64;

#[cfg(atomic_limiter_loom)]
pub(crate) use loom::sync::atomic::AtomicUsize;

#[cfg(all(not(atomic_limiter_loom), feature = "std"))]
pub(crate) use core::sync::atomic::AtomicUsize;

#[cfg(not(atomic_limiter_loom))]
pub(crate) use core::sync::atomic::Ordering;

#[cfg(not(atomic_limiter_loom))]
pub(crate) use alloc::sync::Arc;

/// The mutex behind a keyed limiter's eviction index: loom's under the loom cfg, so that a model
/// that reaches the cap sees it.
#[cfg(atomic_limiter_loom)]
pub(crate) use loom::sync::Mutex;
#[cfg(all(not(atomic_limiter_loom), feature = "std"))]
pub(crate) use std::sync::Mutex;

/// A small number for the calling thread, assigned once from a global counter (round robin), from
/// which a sharded limiter picks the thread's home shard. A thread keeps its number for life.
#[cfg(all(feature = "std", not(atomic_limiter_loom)))]
#[inline]
pub(crate) fn thread_slot() -> usize {
    use core::cell::Cell;
    use core::sync::atomic::AtomicUsize;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
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
#[cfg(all(feature = "std", not(atomic_limiter_loom)))]
#[inline]
pub(crate) fn home_slot() -> usize {
    #[cfg(all(
        target_os = "linux",
        target_env = "gnu",
        any(target_arch = "x86_64", target_arch = "aarch64"),
        not(miri)
    ))]
    if let Some(cpu) = crate::current_cpu::current_cpu() {
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
