//! An operator's changes of a GCRA word: a penalty, a block, a reset.
//!
//! Every change here is one step through the word's one compare-and-swap
//! ([`StateCell::update`]), written as pure arithmetic in [`super::math`]: [`math::owe`],
//! [`math::block`] and [`math::reset`]. The steps run on a limiter's own word or on a key's word
//! in a [`Keyed`](crate::Keyed) table (`gate` then says whether a change of the table's took the
//! word out of use, and the step leaves it alone).

use core::time::Duration;

use super::math::{self, Metered, Outcome};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::gcra::Gcra;
use crate::limiter::retire::gated;
use crate::state_cell::{StateCell, Step};

impl<C: Clock> Gcra<C> {
    /// Takes `n` more tokens at once, admitted or not, going into debt past the burst (up to
    /// [`Gcra::debt_horizon`] ahead): a penalty for abuse, or a cost learned after the fact.
    /// Returns what a check of no tokens answers after it.
    ///
    /// # Examples
    ///
    /// ```
    /// use atomic_limiter::{Gcra, ManualClock, Quota};
    /// use std::time::Duration;
    ///
    /// let api = Gcra::with_clock(Quota::per_second(10), ManualClock::new());
    /// let after = api.penalize(12);
    /// assert_eq!(after.remaining(), 0);
    /// assert_eq!(api.check().retry_after(), Duration::from_millis(300));
    /// ```
    pub fn penalize(&self, n: u32) -> Decision {
        self.adjust_on(self.cell(), |tat, now| self.owe_step(tat, now, n), || false)
            .unwrap_or_else(|| Decision::never(0))
    }

    /// The step that owes `n` more tokens.
    pub(crate) fn owe_step(&self, tat: u64, now: u64, n: u32) -> Option<u64> {
        let p = &self.algorithm().0;
        math::owe(tat, now, u64::from(n).saturating_mul(p.token), p)
    }

    /// The step that blocks for `duration`.
    pub(crate) fn block_step(&self, tat: u64, now: u64, duration: Duration) -> Option<u64> {
        let p = &self.algorithm().0;
        math::block(tat, now, p.queue_limit(duration), p)
    }

    /// Refuses every request for `duration` from now (capped at [`Gcra::debt_horizon`]), with
    /// that retry-after for one token; a limiter that already owes more is left as it is. Past
    /// it, one token is available, and the rest refill at the quota's rate.
    ///
    /// # Examples
    ///
    /// ```
    /// use atomic_limiter::{Gcra, ManualClock, Quota};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let api = Gcra::with_clock(Quota::per_second(10), clock.clone());
    /// api.block(Duration::from_secs(3600));
    /// assert_eq!(api.check().retry_after(), Duration::from_secs(3600));
    /// clock.advance(Duration::from_secs(3600));
    /// assert!(api.check().is_allowed());
    /// ```
    pub fn block(&self, duration: Duration) -> Decision {
        self.adjust_on(
            self.cell(),
            |tat, now| self.block_step(tat, now, duration),
            || false,
        )
        .unwrap_or_else(|| Decision::never(0))
    }

    /// Full again: forgets every token spent and every debt.
    ///
    /// # Examples
    ///
    /// ```
    /// use atomic_limiter::{Gcra, ManualClock, Quota};
    ///
    /// let api = Gcra::with_clock(Quota::per_second(10), ManualClock::new());
    /// let _ = api.penalize(25);
    /// api.reset();
    /// assert_eq!(api.check().remaining(), 9);
    /// ```
    pub fn reset(&self) {
        let _ = self.adjust_on(self.cell(), math::reset, || false);
    }

    /// The furthest a settlement, a penalty or a block can push the instant the limiter is full
    /// again: the burst's time and 2^61 units of the limiter's time past it (73 years for
    /// periods of whole nanoseconds, at least 208 days for any quota).
    ///
    /// # Examples
    ///
    /// ```
    /// use atomic_limiter::{Gcra, ManualClock, Quota};
    /// use std::time::Duration;
    ///
    /// let api = Gcra::with_clock(Quota::per_second(10), ManualClock::new());
    /// assert!(api.debt_horizon() > Duration::from_secs(70 * 365 * 86_400));
    /// api.block(Duration::MAX); // capped there, not wrapped
    /// assert!(api.check().retry_after() <= api.debt_horizon());
    /// ```
    pub fn debt_horizon(&self) -> Duration {
        let p = &self.algorithm().0;
        p.duration(math::debt_limit(p))
    }

    /// Runs the change `f` (the word and now in, the new word or `None` out) on `cell`, and
    /// returns what a peek answers after it; `None` when `gate` says the word was taken out of
    /// use.
    pub(crate) fn adjust_on(
        &self,
        cell: &StateCell,
        f: impl Fn(u64, u64) -> Option<u64>,
        gate: impl Fn() -> bool,
    ) -> Option<Decision> {
        let p = &self.algorithm().0;
        let now = self.fresh_reading();
        let after = cell.update(gated(gate, |tat| {
            let new = f(tat, now);
            let word = new.unwrap_or(tat);
            let peek = match math::decide(word, now, 0, p) {
                Outcome::Allow { after, .. } | Outcome::Deny { after, .. } => after,
            };
            match new {
                Some(new) => Step::Store(peek, new),
                None => Step::Keep(peek),
            }
        }))?;
        Some(Metered { after, wait: 0 }.decision(p, self.clock().resolution()))
    }
}
