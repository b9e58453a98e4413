use std::sync::{Mutex, PoisonError};

/// A lock the baselines can run their state under.
///
/// Implemented for `std::sync::Mutex`; implement it for another mutex (a `parking_lot::Mutex`
/// newtype, say) to compare locks.
pub trait BaselineLock<T> {
    /// A lock holding `value`.
    fn new(value: T) -> Self;

    /// Runs `f` on the value with the lock held.
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R;
}

impl<T> BaselineLock<T> for Mutex<T> {
    fn new(value: T) -> Mutex<T> {
        Mutex::new(value)
    }

    #[inline]
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        // A panic while holding the lock cannot leave the state half-written (every update is a
        // plain assignment of numbers), so a poisoned lock is still usable.
        let mut guard = self.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut guard)
    }
}
