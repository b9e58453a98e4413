//! [`Shadow`]: a limiter that decides and counts as usual but lets every request through, so
//! that a new limit can be watched before it is enforced.

use crate::decision::Decision;
use crate::quota::InsufficientCapacity;
use crate::quota::Quota;
use crate::rate_limiter::RateLimiter;

/// Any [`RateLimiter`] in shadow mode: every check runs on the limiter as usual (admissions take
/// their tokens, refusals take none), and every decision is then let through
/// ([`Decision::shadow`]): [`Decision::would_allow`] and the figures say what the limiter would
/// have answered. A request larger than the burst, which the limiter refuses outright, is let
/// through too, as a refusal with no wait that helps.
///
/// Every limiter of the crate is a `RateLimiter`, the reconfigurable ones included (a change of
/// quota under the wrapper applies to its next check); for a keyed table call
/// [`Decision::shadow`] on its decisions; the HTTP layer has
/// `RateLimitLayerBuilder::shadow`.
///
/// # Examples
///
/// ```
/// use atomic_limiter::{Gcra, ManualClock, Quota, RateLimiter, Shadow};
///
/// let limiter = Shadow::new(Gcra::with_clock(Quota::per_second(2), ManualClock::new()));
/// let decisions: Vec<_> = (0..5).map(|_| limiter.check()).collect();
/// assert!(decisions.iter().all(|d| d.is_allowed()));
/// assert_eq!(decisions.iter().filter(|d| d.would_allow()).count(), 2);
/// assert!(limiter.check_n(3).unwrap().is_shadowed()); // above the burst: let through too
/// ```
#[derive(Debug)]
pub struct Shadow<L> {
    limiter: L,
}

impl<L> Shadow<L> {
    /// `limiter` in shadow mode.
    pub const fn new(limiter: L) -> Shadow<L> {
        Shadow { limiter }
    }

    /// The limiter that decides.
    pub const fn limiter(&self) -> &L {
        &self.limiter
    }

    /// The limiter, back out of shadow mode (to enforce what was watched).
    pub fn into_inner(self) -> L {
        self.limiter
    }
}

impl<L: RateLimiter> RateLimiter for Shadow<L> {
    #[inline]
    fn check(&self) -> Decision {
        self.limiter.check().shadow()
    }

    /// Never an error: a request above the burst is let through as a shadowed refusal.
    #[inline]
    fn check_n(&self, n: u32) -> Result<Decision, InsufficientCapacity> {
        Ok(shadowed(self.limiter.check_n(n)))
    }

    fn quota(&self) -> Quota {
        self.limiter.quota()
    }
}

/// A `check_n` answer as shadow mode gives it: let through, a request above the burst as a
/// refusal with no wait that helps.
#[inline]
pub(crate) fn shadowed(answer: Result<Decision, InsufficientCapacity>) -> Decision {
    match answer {
        Ok(decision) => decision.shadow(),
        Err(e) => Decision::never(e.burst).shadow(),
    }
}
