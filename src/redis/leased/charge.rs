//! [`Leased::charge`] and its [`LeasedCharge`]: a charge spent from the lease and settled there,
//! the store called only for an excess the lease cannot cover.

use super::{Leased, Taken};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::limiter::lease::{self, Spend};
use crate::quota::InsufficientCapacity;
use crate::redis::StoreError;

/// An admission on an estimate from a [`Leased`] lease, to be settled at the actual cost: from
/// [`Leased::charge`].
///
/// A surplus goes back into the lease it was spent from while that lease's TTL holds (past it,
/// it is dropped: the node admits less, never more), so the fleet's bound
/// `burst + rate × (W + E)` is untouched, and no call is made. An excess is spent from the lease
/// when it holds it, with no call either; otherwise it is owed to the store as a penalty
/// ([`RedisGcra::penalize`](crate::redis::RedisGcra::penalize)): one call, only then. `settle`
/// consumes the guard, which goes back only to its own lease. Dropped, the charge stands at the
/// estimate. A refusal, or an admission by the failure policy (which took nothing from the
/// lease), settles nothing.
#[derive(Debug)]
#[must_use = "a charge is settled at its estimate when dropped: settle it at the actual cost"]
pub struct LeasedCharge {
    decision: Decision,
    taken: Option<Taken>,
}

impl LeasedCharge {
    /// The decision the charge was made with.
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// Whether the estimate was admitted.
    pub fn is_allowed(&self) -> bool {
        self.decision.is_allowed()
    }

    /// Settles the charge at `actual` tokens: locally, unless an excess exceeds what the lease
    /// holds. Says whether it called the store.
    ///
    /// # Errors
    ///
    /// The [`StoreError`] of the one call an excess past the lease needs: that excess is then
    /// not owed.
    pub async fn settle(self, actual: u32) -> Result<bool, StoreError> {
        let Some(taken) = self.taken else {
            return Ok(false);
        };
        let leased = taken.leased.clone();
        let inner = &*leased.inner;
        let options = inner.remote.options();
        options.count_admin("settle");
        if actual <= taken.n {
            let back = Taken {
                n: taken.n - actual,
                ..taken
            };
            if back.n > 0 {
                let _ = back.give_back();
            }
            return Ok(false);
        }
        let more = actual - taken.n;
        let tick = lease::tick(inner.clock.now());
        match inner.word.update(|w| lease::spend(w, tick, more)) {
            Spend::Spent { .. } => Ok(false),
            Spend::Short { .. } => {
                inner.remote.penalize(&inner.subject, more).await?;
                Ok(true)
            }
        }
    }
}

impl Leased {
    /// Admits `estimate` tokens from the lease, as [`check_n`](Leased::check_n) does (refilling
    /// it from the store when it falls short), and returns a [`LeasedCharge`] to settle at the
    /// actual cost.
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] if `estimate` exceeds what one check may ask for.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use atomic_limiter::Quota;
    /// use atomic_limiter::redis::{LeaseOptions, Leased, RedisGcra, RedisOptions, RedisStore};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = RedisStore::connect("redis://127.0.0.1:6379/", &RedisOptions::default()).await?;
    /// let fleet = RedisGcra::new(store, "llm", Quota::per_minute(1_000_000))?;
    /// let tokens = Leased::new(fleet, "all", LeaseOptions::default());
    /// let charge = tokens.charge(4_000).await?;
    /// if charge.is_allowed() {
    ///     let called_the_store = charge.settle(1_250).await?;
    ///     assert!(!called_the_store, "a surplus goes back into the lease");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn charge(&self, estimate: u32) -> Result<LeasedCharge, InsufficientCapacity> {
        let took = self.take_n(estimate).await?;
        Ok(LeasedCharge {
            decision: took.decision,
            taken: took.taken.filter(|t| t.n > 0),
        })
    }
}
