#[cfg(all(
    target_os = "linux",
    target_env = "gnu",
    any(target_arch = "x86_64", target_arch = "aarch64"),
    not(miri),
    not(atomic_limiter_loom)
))]
pub(crate) mod current_cpu;
mod home;

use alloc::boxed::Box;
use alloc::vec::Vec;

use crossbeam_utils::CachePadded;

use crate::clock::Clock;
use crate::decision::Decision;
use crate::decision::{Detail, count32};
use crate::gcra::Gcra;
use crate::limiter::shared::KeyedLimiter;
use crate::quota::InsufficientCapacity;
use crate::quota::Quota;
use crate::rate_limiter::RateLimiter;
use crate::token_bucket::TokenBucket;

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
///   (a lower bound on the whole), `limit` that shard's burst, `reset_after` when that shard is
///   full again. (Rebuilding the decision for the whole quota would cost the hot path; the whole
///   is [`RateLimiter::quota`].)
/// * A request served by several shards (see below) answers with `remaining` summed over the
///   shards as it saw them and `reset_after` of the last shard to be full again.
/// * A refusal has asked every shard: `remaining` is the sum over shards, `retry_after` a wait
///   after which the request passes if nobody else takes tokens meanwhile (the soonest any one
///   shard can serve it; for a request larger than every share, the soonest the shards together
///   hold it, up to one period more than the shortest), `reset_after` when the last shard is full.
///
/// # Requests larger than a share
///
/// Any request up to the quota's burst can pass. When no single shard holds `n` tokens but the
/// shards together do, the check *gathers*: it takes what each shard has, in turn, until it has
/// `n`; if another thread empties a shard in between and the whole cannot be had, it gives back
/// what it took (never past full) and refuses. A gathered request is therefore not atomic across
/// shards: while it gathers, other requests may be refused by the shards it is draining (never
/// over-admitted). Gathering is the cold path; requests that fit one share never take it unless
/// the tokens are scattered.
///
/// # A load on one CPU
///
/// The rate is delivered whole wherever the load runs. The burst after an idle is not, for a load
/// that one CPU makes: while it draws its home shard down, the other shards sit full and discard
/// their refill, so the limiter can fall behind a single one by up to those shards' bursts, once
/// per return from idle (`docs/design.md` §5 has the figures). A load from one thread is served
/// better by a single limiter.
///
/// # Limits
///
/// The shard count is rounded down to a power of two, at most the rate and the burst, and halved
/// until every share is a valid [`Quota`]; one shard is always possible. A share's period is its
/// own rounding of `per / rate_i` (see [`Quota::is_exact`]), never shorter, so the shards together
/// never admit more than the quota.
#[derive(Debug)]
pub struct Sharded<L> {
    shards: Box<[CachePadded<L>]>,
    /// The shard count asked for (fewer may have been made), for a quota that replaces this one.
    wanted: usize,
    mask: usize,
    quota: Quota,
    /// The largest share's burst: the most one shard can serve alone.
    max_share: u32,
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

impl<L: KeyedLimiter> Sharded<L> {
    /// `quota` split over (up to) `shards` shards, each limiter made by `make` from its share.
    pub fn new(quota: Quota, shards: usize, make: impl FnMut(Quota) -> L) -> Sharded<L> {
        let shards_wanted = shards;
        let shards: Box<[CachePadded<L>]> = split(&quota, shards)
            .into_iter()
            .map(make)
            .map(CachePadded::new)
            .collect();
        let max_share = shards.iter().map(|s| s.quota().burst()).max().unwrap_or(1);
        Sharded {
            mask: shards.len() - 1,
            wanted: shards_wanted,
            shards,
            quota,
            max_share,
        }
    }

    /// The shards, for the reconfiguration wing's live check and retirement.
    pub(crate) fn shards(&self) -> &[CachePadded<L>] {
        &self.shards
    }

    /// The shards of a sharded limiter no other thread can see yet.
    pub(crate) fn shards_mut(&mut self) -> &mut [CachePadded<L>] {
        &mut self.shards
    }

    /// The calling thread's home shard.
    #[inline(always)]
    pub(crate) fn home_shard(&self) -> usize {
        home::home_slot() & self.mask
    }

    /// The largest share's burst: a request above it can only be gathered.
    #[inline(always)]
    pub(crate) fn max_share(&self) -> u32 {
        self.max_share
    }

    /// The shard count first asked for (more than made when the quota could not be split that far).
    pub(crate) fn wanted(&self) -> usize {
        self.wanted
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
    pub fn shard_quotas(&self) -> impl Iterator<Item = Quota> {
        self.shards.iter().map(|s| s.quota())
    }

    /// Asks for one token.
    #[inline]
    pub fn check(&self) -> Decision {
        let home = home::home_slot() & self.mask;
        // One token never exceeds a share's burst, so the shard's plain `check` serves (no
        // `Result` to build and take apart on the hot path).
        let d = self.shards[home].check();
        if d.is_allowed() {
            return d;
        }
        self.slow(home, 1, Some(d), |l, n| l.check_n(n), |d| d)
    }

    /// Asks for `n` tokens, all or nothing; `n = 0` peeks. Up to the quota's burst, gathered from
    /// several shards when no one shard holds them (see the type's docs).
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] if `n` exceeds the quota's burst.
    #[inline]
    pub fn check_n(&self, n: u32) -> Result<Decision, InsufficientCapacity> {
        self.check_n_from(home::home_slot(), n)
    }

    /// The check with an explicit home shard (taken modulo the shard count), for tests and models.
    #[doc(hidden)]
    #[inline]
    pub fn check_n_from(&self, home: usize, n: u32) -> Result<Decision, InsufficientCapacity> {
        InsufficientCapacity::check(n, self.quota.burst())?;
        let home = home & self.mask;
        if n > self.max_share {
            return Ok(self.slow(home, n, None, |l, n| l.check_n(n), |d| d));
        }
        match self.shards[home].check_n(n) {
            Ok(d) if d.is_allowed() => Ok(d),
            local => Ok(self.slow(home, n, local.ok(), |l, n| l.check_n(n), |d| d)),
        }
    }

    /// The cold path: every other shard once for the whole request, then a gather over all of
    /// them; if both fail, a refusal whose figures cover every shard. `local` is the home shard's
    /// refusal, when it was asked. The decision is answered through `finish`, applied where it is
    /// made, so that one wrapped on its way out is built in place, not built and then copied (a
    /// copy that stalls on forwarding the decision's narrower stores).
    #[cold]
    #[inline(never)]
    pub(crate) fn slow<R>(
        &self,
        home: usize,
        n: u32,
        local: Option<Decision>,
        check: impl Fn(&L, u32) -> Result<Decision, InsufficientCapacity>,
        finish: impl FnOnce(Decision) -> R,
    ) -> R {
        let count = self.shards.len();
        let mut seen = Seen::default();
        for k in 0..count {
            let i = (home + k) & self.mask;
            let shard = &self.shards[i];
            let d = match (k, local) {
                (0, Some(d)) => Some(d),
                // A share too small for the whole request is only peeked, for the gather.
                _ => match check(shard, n) {
                    Ok(d) if d.is_allowed() => return finish(d),
                    Ok(d) => Some(d),
                    Err(_) => check(shard, 0).ok(),
                },
            };
            if let Some(d) = d {
                seen.fold(&d, &shard.quota(), n);
            }
        }
        if n > 0 && seen.remaining >= u64::from(n) {
            if let Some(d) = self.gather(home, n, &check, |l, n| l.give_back(n)) {
                return finish(d);
            }
        }
        // A request one share can serve passes when that share holds it (stealing finds it);
        // a larger one when the shards hold it together, worked out only then (the rare case).
        let retry = match seen.soonest_single {
            Some(single) => single,
            None => self.together_at(u64::from(n), seen.reset, &check),
        };
        finish(Decision::new(
            false,
            1, // the shards' figures are already rounded to their clock
            Detail::Eager {
                remaining: count32(seen.remaining),
                retry_ns: retry.max(1),
                reset_ns: seen.reset,
                limit: self.quota.burst(),
            },
        ))
    }

    /// The soonest the shards together hold `n` tokens, from lower bounds on each one's count;
    /// every shard is full at `last_reset`.
    fn together_at(
        &self,
        n: u64,
        last_reset: u64,
        check: &impl Fn(&L, u32) -> Result<Decision, InsufficientCapacity>,
    ) -> u64 {
        let mut curve = ShardCurve::default();
        for shard in self.shards.iter() {
            if let Ok(d) = check(shard, 0) {
                curve.add(&shard.quota(), duration_ns(d.reset_after()));
            }
        }
        curve.first_holding(n, last_reset)
    }

    /// Takes `n` tokens from several shards, from the home shard on; gives back what it took and
    /// answers `None` if the shards no longer hold them together.
    fn gather(
        &self,
        home: usize,
        n: u32,
        check: &impl Fn(&L, u32) -> Result<Decision, InsufficientCapacity>,
        give_back: impl Fn(&L, u32),
    ) -> Option<Decision> {
        let count = self.shards.len();
        // What was taken from each shard, to give back on failure: on the stack for up to 64
        // shards (this is the cold path; only wider machines allocate here).
        let mut small = [0u32; 64];
        let mut large = Vec::new();
        let taken: &mut [u32] = if count <= small.len() {
            &mut small[..count]
        } else {
            large.resize(count, 0);
            &mut large
        };
        let mut need = n;
        let (mut remaining, mut reset) = (0u64, 0u64);
        for k in 0..count {
            let i = (home + k) & self.mask;
            let shard = &self.shards[i];
            let have = check(shard, 0).map_or(0, |d| d.remaining());
            let have = u32::try_from(have).unwrap_or(u32::MAX);
            let take = have.min(need);
            let d = match check(shard, take) {
                Ok(d) if d.is_allowed() => {
                    if take > 0 {
                        taken[i] = take;
                        need -= take;
                    }
                    d
                }
                // Emptied by another thread since the peek: move on to the next shard.
                Ok(d) => d,
                Err(_) => continue,
            };
            remaining += d.remaining();
            reset = reset.max(duration_ns(d.reset_after()));
            if need == 0 {
                // The shards after this one were not looked at: their tokens are not counted.
                return Some(Decision::new(
                    true,
                    1, // the shards' figures are already rounded to their clock
                    Detail::Eager {
                        remaining: count32(remaining),
                        retry_ns: 0,
                        reset_ns: reset,
                        limit: self.quota.burst(),
                    },
                ));
            }
        }
        for (shard, &took) in self.shards.iter().zip(taken.iter()) {
            if took > 0 {
                give_back(shard, took);
            }
        }
        None
    }

    /// For the loom models' teeth: a gather of `n` from `home` on that fails without giving back
    /// what it took (`None` when it gathered less than `n`).
    #[cfg(atomic_limiter_loom)]
    pub(crate) fn loom_gather_keeping_what_it_took(&self, home: usize, n: u32) -> Option<Decision> {
        self.gather(home & self.mask, n, &|l, n| l.check_n(n), |_, _| ())
    }

    /// For the loom models' teeth: the same check, with `broken` in place of the other shards'
    /// `check_n` (a racy variant that loom must catch).
    #[cfg(atomic_limiter_loom)]
    pub(crate) fn loom_check_with(
        &self,
        home: usize,
        n: u32,
        broken: impl Fn(&L, u32) -> Decision,
    ) -> Decision {
        let home = home & self.mask;
        match self.shards[home].check_n(n) {
            Ok(d) if d.is_allowed() => d,
            local => self.slow(home, n, local.ok(), |l, n| Ok(broken(l, n)), |d| d),
        }
    }
}

/// What the cold path saw of every shard, for a refusal's figures.
#[derive(Default)]
struct Seen {
    /// Whole tokens over all shards.
    remaining: u64,
    /// The soonest any one shard can serve the whole request, in ns, if one can.
    soonest_single: Option<u64>,
    /// When the last shard is full again, in ns.
    reset: u64,
}

impl Seen {
    fn fold(&mut self, d: &Decision, quota: &Quota, n: u32) {
        self.remaining += d.remaining();
        self.reset = self.reset.max(duration_ns(d.reset_after()));
        if n <= quota.burst() {
            let retry = duration_ns(d.retry_after());
            self.soonest_single = Some(self.soonest_single.map_or(retry, |s| s.min(retry)));
        }
    }
}

/// Lower bounds on the tokens each shard holds `t` ns from now, from its burst, its reset and its
/// period: `burst - ceil((reset - t) / period) - 1` before its reset (the extra token covers a
/// token bucket trailing the exact count), `burst` from then on.
struct ShardCurve {
    /// (burst, reset ns, period ns rounded down, at least 1) per shard; at most 64 kept inline.
    inline: [(u64, u64, u64); 64],
    len: usize,
    spill: Vec<(u64, u64, u64)>,
}

impl Default for ShardCurve {
    fn default() -> ShardCurve {
        ShardCurve {
            inline: [(0, 0, 1); 64],
            len: 0,
            spill: Vec::new(),
        }
    }
}

impl ShardCurve {
    fn add(&mut self, quota: &Quota, reset: u64) {
        let period = u64::try_from(quota.period().as_nanos())
            .unwrap_or(u64::MAX)
            .max(1);
        let entry = (u64::from(quota.burst()), reset, period);
        if self.len < self.inline.len() {
            self.inline[self.len] = entry;
            self.len += 1;
        } else {
            self.spill.push(entry);
        }
    }

    fn held_at(&self, t: u64) -> u64 {
        self.inline[..self.len]
            .iter()
            .chain(self.spill.iter())
            .map(|&(burst, reset, period)| {
                if t >= reset {
                    burst
                } else {
                    burst.saturating_sub((reset - t).div_ceil(period) + 1)
                }
            })
            .sum()
    }

    /// The least `t` at which the lower bounds add up to `n`; every shard is full at `last_reset`.
    fn first_holding(&self, n: u64, last_reset: u64) -> u64 {
        let (mut lo, mut hi) = (0u64, last_reset);
        if self.held_at(lo) >= n {
            return 0;
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.held_at(mid) >= n {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        hi
    }
}

fn duration_ns(d: core::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(feature = "quanta")]
impl Sharded<Gcra> {
    /// `quota` over one GCRA per core (the available parallelism, rounded up to a power of two),
    /// on the default clock.
    ///
    /// # Examples
    ///
    /// One quota for every thread of a server, each thread checking its own core's shard first:
    ///
    /// ```
    /// use atomic_limiter::{Quota, Sharded};
    ///
    /// let limiter = Sharded::gcra(Quota::per_second(1000).with_burst(100));
    /// let admitted: usize = std::thread::scope(|s| {
    ///     let workers: Vec<_> = (0..4)
    ///         .map(|_| s.spawn(|| (0..50).filter(|_| limiter.check().is_allowed()).count()))
    ///         .collect();
    ///     workers.into_iter().map(|w| w.join().unwrap()).sum()
    /// });
    /// // The burst, and what refilled while the threads ran: never more.
    /// assert!(admitted >= 100 && admitted <= 200);
    /// ```
    pub fn gcra(quota: Quota) -> Sharded<Gcra> {
        let clock = crate::clock::QuantaClock::new();
        Sharded::new(quota, default_shards(), |q| {
            Gcra::with_clock(q, clock.clone())
        })
    }
}

impl<C: Clock + Clone + Send + Sync> Sharded<Gcra<C>> {
    /// `quota` over (up to) `shards` GCRA shards reading clones of `clock`.
    pub fn gcra_with_clock(quota: Quota, shards: usize, clock: C) -> Sharded<Gcra<C>> {
        Sharded::new(quota, shards, |q| Gcra::with_clock(q, clock.clone()))
    }
}

impl<C: Clock + Clone + Send + Sync> Sharded<TokenBucket<C>> {
    /// `quota` over (up to) `shards` token-bucket shards reading clones of `clock`.
    pub fn token_bucket_with_clock(
        quota: Quota,
        shards: usize,
        clock: C,
    ) -> Sharded<TokenBucket<C>> {
        Sharded::new(quota, shards, |q| TokenBucket::with_clock(q, clock.clone()))
    }
}

impl<L: KeyedLimiter> RateLimiter for Sharded<L> {
    #[inline]
    fn check(&self) -> Decision {
        Sharded::check(self)
    }

    #[inline]
    fn check_n(&self, n: u32) -> Result<Decision, InsufficientCapacity> {
        Sharded::check_n(self, n)
    }

    fn quota(&self) -> Quota {
        self.quota
    }
}

#[cfg(all(test, not(atomic_limiter_loom)))]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

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
    fn rates_with_inexact_shares_still_split_over_every_shard() {
        // 515/s: its quarters (129/s = 3 x 43) have periods that are rounded, not rejected.
        let q = Quota::per_second(515).with_burst(100);
        let s = Sharded::gcra_with_clock(q, 4, ManualClock::new());
        assert_eq!(s.shard_count(), 4);
        // Each share's period is never shorter than its exact `per / rate_i`.
        for share in s.shard_quotas() {
            let (t, d) = share.period_fraction();
            assert!(u128::from(t) * u128::from(share.rate()) >= 1_000_000_000 * u128::from(d));
        }
        let top = if cfg!(miri) { 40 } else { 2000 };
        for rate in 1..=top {
            let q = Quota::per_second(rate);
            let s = Sharded::gcra_with_clock(q, 4, ManualClock::new());
            let want = match rate {
                1 => 1,
                2 | 3 => 2,
                _ => 4,
            };
            assert_eq!(s.shard_count(), want, "{rate}/s");
        }
    }
}
