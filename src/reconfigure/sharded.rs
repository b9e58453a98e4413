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

    const ONE_OR_AGAIN: bool = true;

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

/// The hooks of a sharded limiter in a cell: its live check and its retirement, over the
/// shards' crate-private accessors.
impl<A: Continuous, C: Clock + Send + Sync> Sharded<Limiter<A, C>> {
    /// The check of a sharded limiter that a reconfiguration may retire, for `n <= burst`:
    /// `None` once a shard it asks finds `retired` set (the caller moves to the limiter that
    /// replaced this one), unless it was admitted meanwhile, on words no change had taken yet. A
    /// gather interrupted by the change gives back what it took to words the change may already
    /// have carried over: those tokens count as spent (fewer admissions, never more).
    #[inline]
    fn check_n_live(&self, n: u32, retired: &AtomicBool) -> Option<Decision> {
        let home = self.home_shard();
        // The home shard alone, as the plain check's fast path: a request it serves is answered
        // here, and one found retired moves on.
        let local = if n <= self.max_share() && n <= self.shards()[home].quota().burst() {
            let d = self.shards()[home].check_live(n, retired)?;
            if d.is_allowed() {
                return Some(d);
            }
            Some(d)
        } else {
            None
        };
        self.slow_live(home, n, local, retired, |d| d)
    }

    /// [`Sharded::check_n_live`] for one token, as the plain [`Sharded::check`]: one token never
    /// exceeds a share's burst, so the home shard is asked first with nothing to compare. Found
    /// retired, it answers `again()` (the check on the limiter that replaced this one): so the
    /// decision is made where it is returned, never built and then copied out of an `Option`.
    #[inline(always)]
    fn check_one_or(&self, retired: &AtomicBool, again: impl FnOnce() -> Decision) -> Decision {
        let home = self.home_shard();
        let Some(d) = self.shards()[home].check_live(1, retired) else {
            return again();
        };
        if d.is_allowed() {
            return d;
        }
        self.slow_live(home, 1, Some(d), retired, |d| d.unwrap_or_else(again))
    }

    /// The cold path of [`Sharded::check_n_live`]: the other shards, then a gather; the decision
    /// (`None` when a shard was found retired) answered through `finish`.
    #[cold]
    #[inline(never)]
    fn slow_live<R>(
        &self,
        home: usize,
        n: u32,
        local: Option<Decision>,
        retired: &AtomicBool,
        finish: impl FnOnce(Option<Decision>) -> R,
    ) -> R {
        let gone = core::cell::Cell::new(false);
        let check = |l: &Limiter<A, C>, n: u32| {
            InsufficientCapacity::check(n, l.quota().burst())?;
            l.check_live(n, retired).ok_or_else(|| {
                gone.set(true);
                InsufficientCapacity {
                    requested: n,
                    burst: 0,
                }
            })
        };
        // A refusal made after a shard was found retired may have missed tokens in the cell that
        // replaced this one: made again there.
        self.slow(home, n, local, check, |d| {
            finish((d.is_allowed() || !gone.get()).then_some(d))
        })
    }

    /// Takes every shard's word out of use (`retired` set first) and carries what they held into
    /// `new`, which no other thread can see yet; `retire` is false only in the loom models' twin.
    ///
    /// With as many shards on both sides, shard `i` carries into shard `i` (each share changes
    /// as the quota does). Otherwise every new shard takes the emptiest of what each old shard
    /// carries into it (full again last): never fuller than any old shard was.
    fn retire_into(
        &self,
        retired: &AtomicBool,
        new: &mut Sharded<Limiter<A, C>>,
        carry: Carry,
        retire: bool,
        at: u64,
    ) {
        let words: Vec<u64> = self
            .shards()
            .iter()
            .map(|shard| shard.retire_or_read(retired, retire))
            .collect();
        let same = new.shards().len() == self.shards().len();
        for (j, to) in new.shards_mut().iter_mut().enumerate() {
            let word = if same {
                self.shards()[j].carried_word(words[j], to, at, carry)
            } else {
                let mut emptiest = (core::time::Duration::ZERO, to.full_word());
                for (from, &word) in self.shards().iter().zip(words.iter()) {
                    let word = from.carried_word(word, to, at, carry);
                    let reset = to.reset_of(word, at);
                    if reset >= emptiest.0 {
                        emptiest = (reset, word);
                    }
                }
                emptiest.1
            };
            to.set_word(word);
        }
    }

    /// The shards' clock, read now.
    fn clock_now(&self) -> u64 {
        self.shards()[0].clock().now()
    }

    /// The quota the shards were asked for and the clock they read, for a quota that replaces
    /// this one.
    fn rebuilt(&self, quota: Quota) -> Sharded<Limiter<A, C>>
    where
        C: Clone,
    {
        let clock = self.shards()[0].clock();
        Sharded::new(quota, self.wanted(), |q| {
            Limiter::continuous(q, clock.clone())
        })
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
    pub(crate) fn loom_broken_set_quota(&self, quota: Quota, carry: Carry) {
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
