//! Charge, then settle: admit on an estimate, settle the actual cost once it is known, for every
//! continuous algorithm (GCRA, the token bucket).
//!
//! A charge is the check's step run through the word's one compare-and-swap, keeping the word it
//! stored; a settlement is one more step (the algorithm's own `settle`, its own
//! arithmetic). Both run on a limiter's own word or on a key's word in a
//! [`Keyed`](crate::Keyed) table (`gate` then says whether a change of the table's took the word
//! out of use, and the step leaves it alone).

use super::Limiter;
use super::algorithm::Continuous;
use super::algorithm::engine::Answer;
use super::retire::{gated, settle};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::quota::InsufficientCapacity;
use crate::state_cell::{StateCell, Step};

/// What a charge left behind, for its settlement: the tokens it took and the word it stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mark {
    pub(crate) taken: u32,
    pub(crate) stored: u64,
}

/// An admission on an estimate, to be settled at the actual cost: from [`Limiter::charge`].
///
/// [`Charge::settle`] takes the actual cost. Less than the estimate gives the difference back,
/// never more than the charge took and never past full, only while the charge is still the
/// limiter's latest change (no request admitted, and nothing owed or given back, since): a refund
/// moves every later request's span, and one word cannot record how far, so a surplus settled
/// after another admission is kept (the limiter under-admits; it never lets the same tokens pass
/// twice: `docs/design.md`, section 16). Where requests overlap, estimate low and let the
/// settlement owe the rest. More than the estimate is taken
/// too: on [`Gcra`](crate::Gcra) as debt that later requests wait out (at most
/// [`Gcra::debt_horizon`](crate::Gcra::debt_horizon) ahead); a [`TokenBucket`](crate::TokenBucket)
/// holds no debt, so there an excess empties the bucket and no more. The guard borrows its
/// limiter and `settle` consumes it, so a settlement goes to the limiter that charged, once.
/// Dropped without settling, the charge stands at the estimate. A refused charge took nothing and
/// settles nothing.
///
/// # Examples
///
/// An LLM gateway's token budget: a request is admitted on an estimate of 500 tokens, and costs
/// 120 when the response is known; the 380 come back (nothing else was admitted meanwhile):
///
/// ```
/// use atomic_limiter::{Gcra, ManualClock, Quota};
///
/// let budget = Gcra::with_clock(Quota::per_minute(10_000), ManualClock::new());
/// let charge = budget.charge(500).unwrap();
/// assert!(charge.decision().is_allowed());
/// assert_eq!(charge.decision().remaining(), 9_500);
/// charge.settle(120);
/// assert_eq!(budget.check_n(0).unwrap().remaining(), 9_880);
/// ```
///
/// A response that cost more than its estimate leaves debt that later requests wait out:
///
/// ```
/// use atomic_limiter::{Gcra, ManualClock, Quota};
/// use std::time::Duration;
///
/// let budget = Gcra::with_clock(Quota::per_second(10), ManualClock::new());
/// budget.charge(1).unwrap().settle(15); // 5 tokens past the burst of 10
/// let next = budget.check();
/// assert!(next.is_denied());
/// assert_eq!(next.retry_after(), Duration::from_millis(600));
/// ```
#[derive(Debug)]
#[must_use = "a charge is settled at its estimate when dropped: settle it at the actual cost"]
pub struct Charge<'a, A, C> {
    limiter: &'a Limiter<A, C>,
    decision: Decision,
    mark: Option<Mark>,
}

impl<A: Continuous, C: Clock> Charge<'_, A, C> {
    /// The decision the charge was made with: allowed or not, and the figures of the estimate.
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// Whether the estimate was admitted.
    pub fn is_allowed(&self) -> bool {
        self.decision.is_allowed()
    }

    /// Settles the charge at `actual` tokens (see the type's docs); nothing for a refused one.
    pub fn settle(self, actual: u32) {
        if let Some(mark) = self.mark {
            self.limiter
                .settle_on(&self.limiter.word, mark, actual, || false);
        }
    }

    /// For the loom models' teeth: [`Charge::settle`] with the CAS replaced by a load and a store.
    #[cfg(atomic_limiter_loom)]
    pub(crate) fn loom_broken_settle(self, actual: u32) {
        let Some(mark) = self.mark else { return };
        let l = self.limiter;
        l.word
            .update_racy(l.settle_step(l.fresh_reading(), mark, actual));
    }
}

impl<A: Continuous, C: Clock> Limiter<A, C> {
    /// Admits `estimate` tokens, all or nothing, as [`check_n`](Limiter::check_n) does, and
    /// returns a [`Charge`] to settle at the actual cost once it is known.
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] if `estimate` exceeds the burst.
    ///
    /// # Examples
    ///
    /// A token bucket charged 8 of its 10 and settled at 3:
    ///
    /// ```
    /// use atomic_limiter::{ManualClock, Quota, TokenBucket};
    ///
    /// let bucket = TokenBucket::with_clock(Quota::per_second(10), ManualClock::new());
    /// let charge = bucket.charge(8).unwrap();
    /// assert_eq!(charge.decision().remaining(), 2);
    /// charge.settle(3);
    /// assert_eq!(bucket.check_n(0).unwrap().remaining(), 7);
    /// assert!(bucket.charge(11).is_err(), "more than the burst");
    /// ```
    pub fn charge(&self, estimate: u32) -> Result<Charge<'_, A, C>, InsufficientCapacity> {
        InsufficientCapacity::check(estimate, self.quota().burst())?;
        let (decision, mark) = self
            .charge_on(&self.word, estimate, || false)
            .unwrap_or((Decision::never(0), None));
        Ok(Charge {
            limiter: self,
            decision,
            mark,
        })
    }

    /// The charge of `n <= burst` tokens on `cell`: the decision and, when admitted, its mark;
    /// `None` when `gate` says the word was taken out of use. Decided on a fresh reading, which
    /// every algorithm decides on without a second look.
    pub(crate) fn charge_on(
        &self,
        cell: &StateCell,
        n: u32,
        gate: impl Fn() -> bool,
    ) -> Option<(Decision, Option<Mark>)> {
        let now = self.fresh_reading();
        let step = self.step(now, n, true);
        let (answer, stored) = cell.update(gated(gate, |word| match step(word) {
            Step::Store(answer, new) => Step::Store((answer, Some(new)), new),
            Step::Keep(answer) => Step::Keep((answer, None)),
        }))?;
        let allowed = answer.is_allowed();
        let decision = settle(answer.decide(&self.algorithm, now, self.clock.resolution()));
        let mark = stored
            .filter(|_| allowed && n > 0)
            .map(|stored| Mark { taken: n, stored });
        Some((decision, mark))
    }

    /// Settles a charge on `cell` that left `mark`, at `actual` tokens. `None` when `gate` says
    /// the word was taken out of use.
    pub(crate) fn settle_on(
        &self,
        cell: &StateCell,
        mark: Mark,
        actual: u32,
        gate: impl Fn() -> bool,
    ) -> Option<()> {
        let now = self.fresh_reading();
        cell.update(gated(gate, self.settle_step(now, mark, actual)))
    }

    /// The settlement at `now` as a step: the algorithm's own arithmetic.
    fn settle_step(&self, now: u64, mark: Mark, actual: u32) -> impl Fn(u64) -> Step<()> + '_ {
        move |word| match self
            .algorithm
            .settle(word, now, mark.stored, mark.taken, actual)
        {
            Some(new) => Step::Store((), new),
            None => Step::Keep(()),
        }
    }
}
