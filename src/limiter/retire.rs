//! The retire protocol: how a reconfiguration (or a keyed table's change) takes a state word out
//! of use while other threads check on it, and the shell's live check and retirement on it.
//!
//! A change sets a `retired` flag, then changes the word by a CAS ([`retire_word`]); every step
//! run through [`live`] reads the flag after it loads the word ([`is_retired`]), so a step that
//! loaded the word before the change fails its CAS, and every step after sees the flag and steps
//! aside. The ordering argument is in `docs/design.md`.

use crate::decision::{Decision, Detail};
use crate::state_cell::Step;
#[cfg(feature = "std")]
use {
    super::Limiter,
    super::algorithm::engine::Answer,
    super::algorithm::{self, Algorithm},
    crate::clock::{Clock, is_coarse},
    crate::state_cell::StateCell,
    crate::sync::{AtomicBool, Ordering, fence},
};

#[cfg(feature = "std")]
impl<A: Algorithm, C: Clock> Limiter<A, C> {
    /// The check on a limiter that a reconfiguration may retire ([`Limiter::retire`]): `None`
    /// once `retired` is set (the caller moves to the limiter that replaced this one), else the
    /// decision, made on a word that no reconfiguration has taken yet.
    #[inline(always)]
    pub(crate) fn check_live(&self, n: u32, retired: &AtomicBool) -> Option<Decision> {
        let now = self.reading();
        let answer = self
            .word
            .update_inlined(live(retired, self.step(now, n, false)))?;
        let coarse = is_coarse(&self.clock);
        if answer.is_final(coarse) {
            return Some(answer.into_final(&self.algorithm, now, self.clock.resolution()));
        }
        let (answer, now) = self.fresh_live(n, retired, now, coarse.then_some(answer))?;
        Some(settle(answer.decide(
            &self.algorithm,
            now,
            self.clock.resolution(),
        )))
    }

    /// [`Limiter::check_live`] decided again on a fresh reading, as [`Limiter::fresh_on`].
    #[cold]
    #[inline(never)]
    fn fresh_live(
        &self,
        n: u32,
        retired: &AtomicBool,
        made: u64,
        denial: Option<A::Answer>,
    ) -> Option<(A::Answer, u64)> {
        let now = self.fresh_reading();
        // A denial takes nothing: one made before a retirement may still be answered.
        if let Some(answer) = denial.and_then(|a| self.algorithm.answer_at(&a, made, now)) {
            return Some((answer, now));
        }
        Some((
            self.word.update(live(retired, self.step(now, n, true)))?,
            now,
        ))
    }

    /// Takes the word out of use, for a reconfiguration: `retired` is set, then the word is
    /// changed, so that a check that loaded it before fails its CAS and, like every check after,
    /// finds `retired` set. Returns the last word, with every admission made on it.
    pub(crate) fn retire(&self, retired: &AtomicBool) -> u64 {
        retire_word(&self.word, retired)
    }

    /// [`Limiter::retire`], or where `retire` is false (the loom models' twin, as swapping
    /// limiters behind a lock does) a plain read of the word that leaves it in use.
    pub(crate) fn retire_or_read(&self, retired: &AtomicBool, retire: bool) -> u64 {
        #[cfg(atomic_limiter_loom)]
        if !retire {
            return self.word.load();
        }
        debug_assert!(retire);
        self.retire(retired)
    }

    /// `word`, this limiter's state at the instant `at_ns`, carried over to the limiter `to`
    /// (another quota) as `how` says: the algorithm's carry, each side in its own units.
    pub(crate) fn carried_word(
        &self,
        word: u64,
        to: &Self,
        at_ns: u64,
        how: crate::limiter::algorithm::Carry,
    ) -> u64
    where
        A: algorithm::engine::Carried,
    {
        let (from, into) = (&self.algorithm, &to.algorithm);
        from.carry(word, from.units(at_ns), into, into.units(at_ns), how)
    }

    /// How long until `word` is full, as a peek at `at_ns` would answer: a pure step, nothing
    /// stored.
    pub(crate) fn reset_of(&self, word: u64, at_ns: u64) -> core::time::Duration {
        let now = self.algorithm.units(at_ns);
        let answer = match self.step(now, 0, true)(word) {
            Step::Store(answer, _) | Step::Keep(answer) => answer,
        };
        settle(answer.decide(&self.algorithm, now, self.clock.resolution())).reset_after()
    }

    /// Replaces the word of a limiter no other thread can see yet.
    pub(crate) fn set_word(&mut self, word: u64) {
        self.word = StateCell::new(word);
    }

    /// A fresh state word, full at the clock's current reading.
    pub(crate) fn full_word(&self) -> u64 {
        self.algorithm.full_word(self.reading())
    }
}

/// Takes `word` out of use, for a reconfiguration: `retired` is set, then the word is changed (its
/// low bit flipped), so that a step that loaded it before fails its CAS and, like every step after,
/// finds `retired` set ([`live`]). Returns the last word, with every admission made on it.
#[cfg(feature = "std")]
pub(crate) fn retire_word(word: &StateCell, retired: &AtomicBool) -> u64 {
    // Relaxed: published by the fence and the CAS below.
    retired.store(true, Ordering::Relaxed);
    // Release: with the Acquire fence in `live`, a step that reads the word the CAS below writes
    // (or any later one) sees `retired` set.
    fence(Ordering::Release);
    word.update(|word| Step::Store(word, word ^ 1))
}

/// Whether `retired` is set, read inside a step: a step that reads the word [`retire_word`]'s
/// CAS wrote (or any later one) sees it set.
#[cfg(feature = "std")]
#[inline(always)]
pub(crate) fn is_retired(retired: &AtomicBool) -> bool {
    // Acquire: pairs with the Release fence in `retire_word`; a word its CAS wrote is seen here
    // with `retired` set.
    fence(Ordering::Acquire);
    // Relaxed: ordered by the fence above.
    retired.load(Ordering::Relaxed)
}

/// `step`, unless `retired` is set: then the word is left alone and the answer is `None`.
#[cfg(feature = "std")]
#[inline(always)]
pub(crate) fn live<T>(
    retired: &AtomicBool,
    step: impl Fn(u64) -> Step<T>,
) -> impl Fn(u64) -> Step<Option<T>> {
    gated(move || is_retired(retired), step)
}

/// `step`, unless `stopped` says the word was taken out of use (read after the word is loaded,
/// as [`live`] reads its flag): then the word is left alone and the answer is `None`.
#[inline(always)]
pub(crate) fn gated<T>(
    stopped: impl Fn() -> bool,
    step: impl Fn(u64) -> Step<T>,
) -> impl Fn(u64) -> Step<Option<T>> {
    // Always inlined, as `Limiter::step`.
    #[inline(always)]
    move |word| {
        if stopped() {
            return Step::Keep(None);
        }
        match step(word) {
            Step::Store(answer, new) => Step::Store(Some(answer), new),
            Step::Keep(answer) => Step::Keep(Some(answer)),
        }
    }
}

/// A step's answer on a reading that needs no other: only a possibly stale reading asks for a
/// fresh one, so this never sees `None`; were it to, it refuses (never over-admits).
#[inline]
pub(crate) fn settle(answer: Option<Decision>) -> Decision {
    match answer {
        Some(d) => d,
        None => unsettled(),
    }
}

/// The refusal [`settle`] gives for an answer that never comes. Built in place: returned from a
/// call, it is a decision in memory that every other path's decision joins there, and each check
/// then writes out figures its caller may never read (a bucket's admission took 1.2x GCRA's time
/// instead of 1.1x).
#[inline(always)]
fn unsettled() -> Decision {
    Decision::new(
        false,
        1,
        Detail::Eager {
            retry_ns: 1,
            reset_ns: 1,
            remaining: 0,
            limit: 0,
        },
    )
}
