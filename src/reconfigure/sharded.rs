//! [`ReconfigurableSharded`]: a [`Sharded`] limiter whose quota changes at run time.

use super::cell::{Cells, Content};
use crate::clock::Clock;
#[cfg(feature = "quanta")]
use crate::clock::DefaultClock;
use crate::clock::DefaultClockOrNone;
use crate::decision::Decision;
use crate::limiter::Limiter;
use crate::limiter::algorithm::Carry;
use crate::limiter::algorithm::{Continuous, Retunable};
use crate::quota::InsufficientCapacity;
use crate::quota::Quota;
use crate::rate_limiter::RateLimiter;
use crate::sharded::Sharded;
use crate::sync::AtomicBool;
use core::convert::Infallible;

impl<A, C> Content for Sharded<Limiter<A, C>>
where
    A: Retunable + Continuous,
    C: Clock + Clone + Send + Sync,
{
    fn quota(&self) -> Quota {
        crate::rate_limiter::RateLimiter::quota(self)
    }

    #[inline(always)]
    fn capacity(&self) -> u32 {
        crate::rate_limiter::RateLimiter::quota(self).burst()
    }

    #[inline(always)]
    fn check_live(&self, n: u32, retired: &AtomicBool) -> Option<Decision> {
        self.check_n_live(n, retired)
    }

    #[inline(always)]
    fn check_one_or(&self, retired: &AtomicBool, again: impl FnOnce() -> Decision) -> Decision {
        Sharded::check_one_or(self, retired, again)
    }

    fn now(&self) -> u64 {
        self.clock_now()
    }

    fn retire_into(
        &self,
        retired: &AtomicBool,
        new: &mut Self,
        carry: Carry,
        retire: bool,
        at: u64,
    ) {
        Sharded::retire_into(self, retired, new, carry, retire, at);
    }
}

/// A [`Sharded`] limiter (one quota kept in per-core shards) whose quota changes at run time,
/// from any thread, while others check.
///
/// The whole sharded limiter (every shard's parameters and state word) is one cell, replaced as a
/// [`Reconfigurable`](crate::Reconfigurable) replaces its limiter: a change marks the old cell
/// retired, takes every shard's word by a CAS, carries each over and publishes the new cell. With
/// as many shards before and after (the shard count follows the quota only when a quota is too
/// small to split that far), shard `i` carries into shard `i`, as [`Carry`] says; otherwise every
/// new shard is at most as full as the emptiest old one. A check costs the plain sharded check
/// plus a pointer load and two thread-local stores. A gather across shards that a change
/// interrupts counts what it took as spent, and the request is decided again on the new quota.
///
/// # Examples
///
/// ```
/// use atomic_limiter::algorithm::GcraAlgorithm;
/// use atomic_limiter::{Carry, ManualClock, Quota, ReconfigurableSharded};
///
/// let limiter: ReconfigurableSharded<GcraAlgorithm, _> =
///     ReconfigurableSharded::with_clock(Quota::per_second(100).with_burst(40), 4, ManualClock::new());
/// assert_eq!((0..50).filter(|_| limiter.check().is_allowed()).count(), 40);
/// // Every shard drained: it stays drained, as time, at the new rate.
/// limiter.set_quota(Quota::per_second(1000).with_burst(40), Carry::Debt);
/// assert!(limiter.check().is_denied());
/// ```
pub struct ReconfigurableSharded<A, C = DefaultClockOrNone> {
    cells: Cells<Sharded<Limiter<A, C>>>,
}

impl<A, C> core::fmt::Debug for ReconfigurableSharded<A, C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ReconfigurableSharded")
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "quanta")]
impl<A: Retunable + Continuous + 'static> ReconfigurableSharded<A, DefaultClock> {
    /// `quota` over one shard per core (as [`Sharded::gcra`]), on the default clock.
    pub fn new(quota: Quota) -> Self {
        ReconfigurableSharded::with_clock(
            quota,
            Sharded::<crate::gcra::Gcra>::default_shard_count(),
            DefaultClock::new(),
        )
    }
}

impl<A, C> ReconfigurableSharded<A, C>
where
    A: Retunable + Continuous + 'static,
    C: Clock + Clone + Send + Sync + 'static,
{
    /// `quota` over (up to) `shards` shards reading clones of `clock`.
    pub fn with_clock(quota: Quota, shards: usize, clock: C) -> Self {
        let sharded = Sharded::new(quota, shards, |q| Limiter::continuous(q, clock.clone()));
        ReconfigurableSharded {
            cells: Cells::new(sharded),
        }
    }

    /// Changes the quota (split as [`Sharded`] splits it, over the shard count first asked
    /// for), carrying every shard's state over as `carry` says. Checks racing the change are
    /// decided on the old quota or the new one, each on its own state; none is lost.
    pub fn set_quota(&self, quota: Quota, carry: Carry) {
        self.replace(quota, carry, true);
    }

    /// For the loom models' teeth: a change that reads the old words instead of retiring them.
    #[cfg(atomic_limiter_loom)]
    #[doc(hidden)]
    pub fn loom_broken_set_quota(&self, quota: Quota, carry: Carry) {
        self.replace(quota, carry, false);
    }

    fn replace(&self, quota: Quota, carry: Carry, retire: bool) {
        let build = |old: &Sharded<Limiter<A, C>>| Ok::<_, Infallible>(old.rebuilt(quota));
        match self.cells.replace(build, carry, retire) {
            Ok(()) => {}
            Err(never) => match never {},
        }
    }

    /// Asks for one token on the quota in force.
    #[inline]
    pub fn check(&self) -> Decision {
        self.cells.check()
    }

    /// Asks for `n` tokens, all or nothing, on the quota in force; `n = 0` peeks. Up to the
    /// quota's burst, gathered from several shards when no one shard holds them.
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] if `n` exceeds the burst of the quota in force.
    #[inline]
    pub fn check_n(&self, n: u32) -> Result<Decision, InsufficientCapacity> {
        self.cells.check_n(n)
    }

    /// The quota in force (by value: it may change right after).
    pub fn quota(&self) -> Quota {
        self.cells.quota()
    }
}

/// The plain limiter's trait on the quota in force, so that [`Shadow`](crate::shadow::Shadow),
/// `Instrumented` and the waits of [`RateLimiter`] wrap it.
impl<A, C> RateLimiter for ReconfigurableSharded<A, C>
where
    A: Retunable + Continuous + 'static,
    C: Clock + Clone + Send + Sync + 'static,
{
    #[inline(always)]
    fn check(&self) -> Decision {
        self.cells.check()
    }

    #[inline(always)]
    fn check_n(&self, n: u32) -> Result<Decision, InsufficientCapacity> {
        self.cells.check_n(n)
    }

    fn quota(&self) -> Quota {
        self.cells.quota()
    }
}
