use alloc::boxed::Box;
use alloc::vec::Vec;

use crossbeam_utils::CachePadded;

use crate::decision::Detail;
use crate::{Clock, Decision, Gcra, InsufficientCapacity, Quota, RateLimiter, TokenBucket};

/// One logical quota kept in per-core shards, so that threads on different cores do not bounce one
/// cache line between them.
///
/// The quota's rate and burst are split into `N` shares that add up exactly to the quota (the
/// remainders go to the first shards), each kept by its own limiter on its own cache line. A check
/// goes to the calling thread's home shard: the CPU it runs on, where Linux publishes that in the
/// thread's rseq area (as glibc 2.35+ sets up), otherwise a number given to each thread once, round
/// robin. If that shard refuses, the check tries every other shard once before refusing, so a
/// skewed load (all requests from one thread) still gets the whole quota. No shard can admit more
/// than its share, so in every interleaving the total admitted stays within
/// `burst + elapsed × rate / per`.
///
/// # Examples
///
/// Four shards of 100/s, burst 40, on a manual clock:
///
/// ```
/// use atomic_limiter::{ManualClock, Quota, RateLimiter, Sharded};
///
/// let clock = ManualClock::new();
/// let limiter = Sharded::gcra_with_clock(Quota::per_second(100).with_burst(40), 4, clock);
/// assert_eq!(limiter.shard_count(), 4);
/// // One thread alone still gets the whole burst: its home shard, then the others.
/// let admitted = (0..50).filter(|_| limiter.check().is_allowed()).count();
/// assert_eq!(admitted, 40);
/// ```
///
/// # What the figures mean
///
/// * An admission answers with its shard's figures: `remaining` is what is left *in that shard*
///   (a lower bound on the whole), `reset_after` when that shard is full again.
/// * A refusal has asked every shard: `remaining` is the sum over shards (tokens can be there but
///   scattered, fewer than `n` in each), `retry_after` the soonest any shard can serve the request
///   (waiting it passes: the check steals from that shard), `reset_after` when the last shard is
///   full.
///
/// # Limits
///
/// A single request can take at most one shard's burst (the largest share, about `burst / N`):
/// tokens in different shards are not taken atomically together. The shard count is rounded down
/// to a power of two, at most the rate and the burst, and halved until every share is a valid
/// [`Quota`] (shares of a fractional period can break `Quota::MAX_DENOMINATOR`); one shard is
/// always possible.
#[derive(Debug)]
pub struct Sharded<L> {
    shards: Box<[CachePadded<L>]>,
    mask: usize,
    quota: Quota,
    /// The largest share's burst: the most one request can take.
    max_request: u32,
}

/// Shares of `total` over `n`: the first `total % n` get one more.
fn share(total: u64, n: u64, i: u64) -> u64 {
    total / n + u64::from(i < total % n)
}

/// The shards' quotas for up to `wanted` shards, or `None` if even one shard is impossible (never:
/// one shard is the quota itself).
fn split(quota: &Quota, wanted: usize) -> Vec<Quota> {
    let per = quota.per().as_nanos() as u64;
    let cap = (quota.rate().min(u64::from(quota.burst()))).max(1);
    let mut n = (wanted.max(1) as u64).min(cap);
    n = 1 << (63 - n.leading_zeros()); // a power of two, rounded down
    loop {
        let shares: Option<Vec<Quota>> = (0..n)
            .map(|i| {
                Quota::try_from_nanos(
                    share(quota.rate(), n, i),
                    per,
                    share(u64::from(quota.burst()), n, i) as u32,
                )
                .ok()
            })
            .collect();
        match shares {
            Some(v) => return v,
            None if n > 1 => n /= 2,
            None => return alloc::vec![*quota],
        }
    }
}

/// The default number of shards: the available parallelism, rounded up to a power of two.
pub(crate) fn default_shards() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .next_power_of_two()
}

impl<L: RateLimiter> Sharded<L> {
    /// `quota` split over (up to) `shards` shards, each limiter made by `make` from its share.
    pub fn new(quota: Quota, shards: usize, make: impl FnMut(Quota) -> L) -> Sharded<L> {
        let shards: Box<[CachePadded<L>]> = split(&quota, shards)
            .into_iter()
            .map(make)
            .map(CachePadded::new)
            .collect();
        let max_request = shards.iter().map(|s| s.quota().burst()).max().unwrap_or(1);
        Sharded {
            mask: shards.len() - 1,
            shards,
            quota,
            max_request,
        }
    }

    /// The shard count the default constructors ask for: the available parallelism, rounded up to
    /// a power of two (fewer are made when the quota cannot be split that far).
    pub fn default_shard_count() -> usize {
        default_shards()
    }

    /// How many shards the quota was split into.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// The shards' quotas, in shard order (they add up to the whole quota).
    pub fn shard_quotas(&self) -> impl Iterator<Item = &Quota> {
        self.shards.iter().map(|s| s.quota())
    }

    /// Asks for one token.
    #[inline]
    pub fn check(&self) -> Decision {
        let home = crate::sync::home_slot() & self.mask;
        // One token never exceeds a share's burst, so the shard's plain `check` serves (no
        // `Result` to build and take apart on the hot path).
        let d = self.shards[home].check();
        if d.is_allowed() {
            return d;
        }
        self.steal(home, 1, Ok(d), |l, n| l.check_n(n))
    }

    /// Asks for `n` tokens, all or nothing; `n = 0` peeks.
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] if `n` exceeds the largest shard's burst.
    #[inline]
    pub fn check_n(&self, n: u32) -> Result<Decision, InsufficientCapacity> {
        self.check_n_from(crate::sync::home_slot(), n)
    }

    /// The check with an explicit home shard (taken modulo the shard count), for tests and models.
    #[doc(hidden)]
    #[inline]
    pub fn check_n_from(&self, home: usize, n: u32) -> Result<Decision, InsufficientCapacity> {
        InsufficientCapacity::check(n, self.max_request)?;
        Ok(self.check_from(home, n))
    }

    /// The home shard first; on a refusal, the others (cold). `n <= max_request`.
    #[inline]
    fn check_from(&self, home: usize, n: u32) -> Decision {
        let home = home & self.mask;
        match self.shards[home].check_n(n) {
            Ok(d) if d.is_allowed() => d,
            local => self.steal(home, n, local, |l, n| l.check_n(n)),
        }
    }

    /// Tries every other shard once, in order from the home shard; if all refuse, a refusal whose
    /// figures cover all of them.
    #[cold]
    #[inline(never)]
    fn steal(
        &self,
        home: usize,
        n: u32,
        local: Result<Decision, InsufficientCapacity>,
        check: impl Fn(&L, u32) -> Result<Decision, InsufficientCapacity>,
    ) -> Decision {
        let mut remaining = 0u64;
        let mut retry = u64::MAX;
        let mut reset = 0u64;
        // A share too small for this request (an error) never serves it; its tokens are not
        // counted either, since the caller could not have them.
        let mut fold = |d: &Result<Decision, InsufficientCapacity>| {
            if let Ok(d) = d {
                remaining += d.remaining();
                retry = retry.min(duration_ns(d.retry_after()));
                reset = reset.max(duration_ns(d.reset_after()));
            }
        };
        fold(&local);
        for k in 1..self.shards.len() {
            let i = (home + k) & self.mask;
            let d = check(&self.shards[i], n);
            if let Ok(d) = d {
                if d.is_allowed() {
                    return d;
                }
            }
            fold(&d);
        }
        Decision::new(
            false,
            1, // the shards' figures are already rounded to their clock
            Detail::Eager {
                remaining,
                retry_ns: retry,
                reset_ns: reset,
            },
        )
    }

    /// For the loom models' teeth: the same check, with `broken` in place of the victim shards'
    /// `check_n` (a racy variant that loom must catch).
    #[cfg(atomic_limiter_loom)]
    #[doc(hidden)]
    pub fn loom_check_with(
        &self,
        home: usize,
        n: u32,
        broken: impl Fn(&L, u32) -> Decision,
    ) -> Decision {
        let home = home & self.mask;
        match self.shards[home].check_n(n) {
            Ok(d) if d.is_allowed() => d,
            local => self.steal(home, n, local, |l, n| Ok(broken(l, n))),
        }
    }
}

fn duration_ns(d: core::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(feature = "quanta")]
impl Sharded<Gcra> {
    /// `quota` over one GCRA per core (the available parallelism, rounded up to a power of two),
    /// on the default clock.
    pub fn gcra(quota: Quota) -> Sharded<Gcra> {
        let clock = crate::QuantaClock::new();
        Sharded::new(quota, default_shards(), |q| {
            Gcra::with_clock(q, clock.clone())
        })
    }
}

impl<C: Clock + Clone> Sharded<Gcra<C>> {
    /// `quota` over (up to) `shards` GCRA shards reading clones of `clock`.
    pub fn gcra_with_clock(quota: Quota, shards: usize, clock: C) -> Sharded<Gcra<C>> {
        Sharded::new(quota, shards, |q| Gcra::with_clock(q, clock.clone()))
    }
}

impl<C: Clock + Clone> Sharded<TokenBucket<C>> {
    /// `quota` over (up to) `shards` token-bucket shards reading clones of `clock`.
    pub fn token_bucket_with_clock(
        quota: Quota,
        shards: usize,
        clock: C,
    ) -> Sharded<TokenBucket<C>> {
        Sharded::new(quota, shards, |q| TokenBucket::with_clock(q, clock.clone()))
    }
}

impl<L: RateLimiter> RateLimiter for Sharded<L> {
    #[inline]
    fn check(&self) -> Decision {
        Sharded::check(self)
    }

    #[inline]
    fn check_n(&self, n: u32) -> Result<Decision, InsufficientCapacity> {
        Sharded::check_n(self, n)
    }

    fn quota(&self) -> &Quota {
        &self.quota
    }
}

#[cfg(all(test, not(atomic_limiter_loom)))]
mod tests {
    use super::*;
    use crate::ManualClock;

    #[test]
    fn shares_add_up_exactly() {
        for (rate, burst, n) in [
            (100u64, 40u32, 4usize),
            (10, 3, 8),
            (7, 7, 4),
            (1000, 1, 4),
            (3, 100, 2),
        ] {
            let q = Quota::per_second(rate).with_burst(burst);
            let s = Sharded::gcra_with_clock(q, n, ManualClock::new());
            let (r, b): (u64, u64) = s
                .shard_quotas()
                .map(|q| (q.rate(), u64::from(q.burst())))
                .fold((0, 0), |a, x| (a.0 + x.0, a.1 + x.1));
            assert_eq!(
                (r, b),
                (rate, u64::from(burst)),
                "{rate}/s burst {burst} over {n}"
            );
            assert!(s.shard_count().is_power_of_two());
            assert!(s.shard_count() as u64 <= rate.min(u64::from(burst)));
        }
    }

    #[test]
    fn shares_of_fractional_periods_fall_back_to_fewer_shards() {
        // 1000 per 3 s: shares of 500 per 3 s are fine, 250 per 3 s too.
        let q = Quota::try_new(1000, core::time::Duration::from_secs(3), 1000).unwrap();
        assert_eq!(
            Sharded::gcra_with_clock(q, 4, ManualClock::new()).shard_count(),
            4
        );
        // 515/s is fine (denominator 103), but its quarters (129 = 3 x 43) and halves (258, 257)
        // are not: it falls back to one shard.
        let q = Quota::per_second(515).with_burst(100);
        let s = Sharded::gcra_with_clock(q, 4, ManualClock::new());
        assert_eq!(s.shard_count(), 1);
        assert_eq!(s.shard_quotas().next(), Some(&q));
    }
}
