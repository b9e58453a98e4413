//! The one place where a limiter's state word is read and swapped.
//!
//! Every algorithm is written as a pure function from the current word to a [`Step`]: store a new
//! word, or keep the old one. [`StateCell::update`] runs it: one load, and when the step wants to
//! store, one `compare_exchange_weak`; when that fails (another thread got there first, or a
//! spurious failure) it decides again, in the same loop, on the value it found. A step that keeps
//! the word writes nothing, so denials never take the cache line exclusive.
//!
//! # Memory ordering
//!
//! Every access is `Relaxed`. A limiter's decision depends on its one word and the clock reading,
//! and it publishes no other memory, so all it needs is that read-modify-writes on that one
//! location are atomic and totally ordered, which holds at any ordering. The argument in full, and
//! what loom does and does not check of it, is in `docs/design.md`.

use crate::sync::{AtomicU64, Ordering};

/// What a step wants done with the word: answer `T`, and store a new word or keep the old one.
///
/// `repr(C)` with the answer first in both variants, so that it sits at one offset whichever the
/// variant: taking the answer out of a step is then a load, not a choice between two places.
#[repr(C)]
pub enum Step<T> {
    /// Answer `T` and replace the word with this value.
    Store(T, u64),
    /// Answer `T` and leave the word as it is.
    Keep(T),
}

/// An `AtomicU64` that is only ever changed through [`StateCell::update`].
#[derive(Debug)]
pub(crate) struct StateCell {
    word: AtomicU64,
}

impl StateCell {
    pub(crate) fn new(word: u64) -> StateCell {
        StateCell {
            word: AtomicU64::new(word),
        }
    }

    /// Runs `step` on the current word until its answer is final: kept, or stored by a CAS that
    /// succeeded on the very word the step saw. Inlined where the compiler finds it worth it;
    /// [`StateCell::update_inlined`] is the same, always inlined.
    #[inline]
    pub(crate) fn update<T>(&self, step: impl Fn(u64) -> Step<T>) -> T {
        self.update_inlined(step)
    }

    /// [`StateCell::update`], always inlined: for a plain limiter's check, whose step the compiler
    /// would otherwise call with its answer passed through memory (the token bucket's, 1.7 times
    /// as slow as GCRA's allow rather than 1.5 times). The reconfigurable limiters' checks are
    /// faster with the compiler's choice.
    ///
    /// A failed CAS goes round the same loop, not into a function of its own that is handed the
    /// step: measured side by side (`scripts/ab.sh`, `compare`), `Gcra`'s admission takes 7 %
    /// less time this way, no more than the clock read alone; the token bucket's moves by 1 to 2 %,
    /// one way or the other by harness.
    #[inline(always)]
    pub(crate) fn update_inlined<T>(&self, step: impl Fn(u64) -> Step<T>) -> T {
        // Relaxed: a stale value is re-checked by the CAS below, which compares with the latest
        // value in the word's modification order; for a kept step see `Step` users' notes.
        let mut current = self.word.load(Ordering::Relaxed);
        loop {
            match step(current) {
                Step::Keep(answer) => return answer,
                Step::Store(answer, new) => {
                    // Relaxed/Relaxed: the CAS is the linearisation point and needs only the
                    // atomicity of one read-modify-write on one location; nothing else is
                    // published.
                    match self.word.compare_exchange_weak(
                        current,
                        new,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    ) {
                        Ok(_) => return answer,
                        Err(actual) => current = actual,
                    }
                }
            }
        }
    }

    /// The deliberately broken twin of [`StateCell::update`], for the loom models' teeth only:
    /// the same step, but a load and then a plain store, no CAS. Loom must find the lost update.
    #[cfg(atomic_limiter_loom)]
    pub(crate) fn update_racy<T>(&self, step: impl Fn(u64) -> Step<T>) -> T {
        // Relaxed: this variant is wrong on purpose; the ordering is not what breaks it.
        let current = self.word.load(Ordering::Relaxed);
        match step(current) {
            Step::Keep(answer) => answer,
            Step::Store(answer, new) => {
                self.word.store(new, Ordering::Relaxed);
                answer
            }
        }
    }

    /// The current word, for the loom models.
    #[cfg(atomic_limiter_loom)]
    pub(crate) fn load(&self) -> u64 {
        // Relaxed: a snapshot of one location.
        self.word.load(Ordering::Relaxed)
    }
}

#[cfg(all(test, not(atomic_limiter_loom)))]
mod tests {
    use super::*;

    /// Every thread's increments land, through contention and (under Miri) spurious CAS failures.
    #[test]
    fn concurrent_updates_are_not_lost() {
        let per_thread = if cfg!(miri) { 20 } else { 10_000 };
        let cell = StateCell::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..per_thread {
                        cell.update(|v| Step::Store((), v + 1));
                    }
                });
            }
        });
        assert_eq!(cell.update(Step::Keep), 4 * per_thread);
    }

    /// A step that keeps the word never writes, even when it is retried.
    #[test]
    fn kept_steps_return_without_writing() {
        let cell = StateCell::new(7);
        assert_eq!(cell.update(|v| Step::<u64>::Keep(v * 2)), 14);
        assert_eq!(cell.update(Step::Keep), 7);
    }
}
