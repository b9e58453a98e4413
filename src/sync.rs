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
/// An atomic that can live in a `static` (loom's cannot be built in one). Its users, the jitter
/// sequence and the coarse clock's time, take part in no protocol the loom models check.
#[cfg(feature = "portable-atomic")]
pub(crate) use portable_atomic::AtomicU64 as StaticAtomicU64;

#[cfg(atomic_limiter_loom)]
pub(crate) use loom::sync::atomic::AtomicUsize;

#[cfg(all(not(atomic_limiter_loom), feature = "std"))]
pub(crate) use core::sync::atomic::{AtomicBool, AtomicPtr, fence};
/// What a reconfigurable limiter's cell protocol uses: the retired flag, the pointer to the live
/// cell, and the fences that pair the flag with the retiring CAS.
#[cfg(atomic_limiter_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicPtr, fence};

/// A spin-then-yield wait for another thread's few instructions: crossbeam's backoff, or under
/// loom a yield, which loom needs to explore past a spinning thread.
#[cfg(all(not(atomic_limiter_loom), feature = "std"))]
pub(crate) use crossbeam_utils::Backoff;

/// See the other arm.
#[cfg(atomic_limiter_loom)]
#[derive(Debug, Default)]
pub(crate) struct Backoff;

#[cfg(atomic_limiter_loom)]
impl Backoff {
    pub(crate) fn new() -> Backoff {
        Backoff
    }

    pub(crate) fn snooze(&self) {
        loom::thread::yield_now();
    }
}

#[cfg(all(not(atomic_limiter_loom), feature = "std"))]
pub(crate) use core::sync::atomic::AtomicUsize;

#[cfg(not(atomic_limiter_loom))]
pub(crate) use core::sync::atomic::Ordering;

#[cfg(not(atomic_limiter_loom))]
pub(crate) use alloc::sync::Arc;

/// The mutex behind a keyed limiter's eviction index: loom's under the loom cfg, so that a model
/// that reaches the cap sees it.
#[cfg(atomic_limiter_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(all(not(atomic_limiter_loom), feature = "std"))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// An atomic counter that can live in a `static`, for numbering threads (loom's cannot be built in
/// one; under loom the sharded limiter numbers no threads).
#[cfg(all(feature = "std", not(atomic_limiter_loom)))]
pub(crate) use core::sync::atomic::AtomicUsize as StaticAtomicUsize;

/// A cell written before an atomic publishes it and read after: loom's under the loom cfg, so
/// that a model sees a read that the publishing store does not order after the write.
#[cfg(atomic_limiter_loom)]
pub(crate) use loom::cell::UnsafeCell;

/// See the other arm: `core`'s cell behind loom's interface.
#[cfg(all(not(atomic_limiter_loom), feature = "std"))]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

#[cfg(all(not(atomic_limiter_loom), feature = "std"))]
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(value: T) -> UnsafeCell<T> {
        UnsafeCell(core::cell::UnsafeCell::new(value))
    }

    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}
