//! Accuracy on simulated clocks: every limiter polled on the same simulated instants, its
//! admissions counted against the exact quota, and whether waiting its retry-after is enough.

use atomic_limiter::baseline::MutexTokenBucket;
use atomic_limiter::{Gcra, ManualClock, Quota, RateLimiter, TokenBucket};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A ratelimit clock driven by hand.
#[derive(Clone, Default)]
pub(crate) struct SimClock(Arc<AtomicU64>);

impl ratelimit::Clock for SimClock {
    fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }
}

/// One limiter on a simulated clock: `check()` and "advance the clock by ns".
pub(crate) trait Sim {
    fn check(&mut self) -> Result<(), Duration>;
    fn advance(&mut self, ns: u64);
}

pub(crate) struct OursSim<L> {
    l: L,
    clock: ManualClock,
}

impl<L: RateLimiter> Sim for OursSim<L> {
    fn check(&mut self) -> Result<(), Duration> {
        let d = self.l.check();
        if d.is_allowed() {
            Ok(())
        } else {
            Err(d.retry_after())
        }
    }
    fn advance(&mut self, ns: u64) {
        self.clock.advance_nanos(ns);
    }
}

pub(crate) struct GovSim {
    l: governor::RateLimiter<
        governor::state::NotKeyed,
        governor::state::InMemoryState,
        governor::clock::FakeRelativeClock,
        governor::middleware::NoOpMiddleware<governor::nanos::Nanos>,
    >,
    clock: governor::clock::FakeRelativeClock,
}

impl Sim for GovSim {
    fn check(&mut self) -> Result<(), Duration> {
        use governor::clock::Clock as _;
        self.l
            .check()
            .map_err(|nu| nu.wait_time_from(self.clock.now()))
    }
    fn advance(&mut self, ns: u64) {
        self.clock.advance(Duration::from_nanos(ns));
    }
}

pub(crate) struct RlSim {
    l: ratelimit::Ratelimiter<SimClock>,
    clock: SimClock,
}

impl Sim for RlSim {
    fn check(&mut self) -> Result<(), Duration> {
        match self.l.try_wait() {
            Ok(()) => Ok(()),
            Err(ratelimit::TryWaitError::Insufficient(d)) => Err(d),
            Err(_) => Err(Duration::MAX),
        }
    }
    fn advance(&mut self, ns: u64) {
        self.clock.0.fetch_add(ns, Ordering::Relaxed);
    }
}

pub(crate) fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

/// Every limiter for `rate` per second with `burst`, on simulated clocks at 0.
pub(crate) fn sims(rate: u32, burst: u32) -> Vec<(&'static str, Box<dyn Sim>)> {
    let q = Quota::per_second(u64::from(rate)).with_burst(burst);
    let gov_clock = governor::clock::FakeRelativeClock::default();
    let rl_clock = SimClock::default();
    let c1 = ManualClock::new();
    let c2 = ManualClock::new();
    let c3 = ManualClock::new();
    vec![
        (
            "Gcra",
            Box::new(OursSim {
                l: Gcra::with_clock(q, c1.clone()),
                clock: c1,
            }) as Box<dyn Sim>,
        ),
        (
            "TokenBucket",
            Box::new(OursSim {
                l: TokenBucket::with_clock(q, c2.clone()),
                clock: c2,
            }),
        ),
        (
            "MutexTokenBucket",
            Box::new(OursSim {
                l: MutexTokenBucket::<_>::with_clock(q, c3.clone()),
                clock: c3,
            }),
        ),
        (
            "governor",
            Box::new(GovSim {
                l: governor::RateLimiter::direct_with_clock(
                    governor::Quota::per_second(nz(rate)).allow_burst(nz(burst)),
                    gov_clock.clone(),
                ),
                clock: gov_clock,
            }),
        ),
        (
            "ratelimit",
            Box::new(RlSim {
                l: ratelimit::Builder::with_clock(u64::from(rate), rl_clock.clone())
                    .max_tokens(u64::from(burst))
                    .initial_available(u64::from(burst))
                    .build()
                    .unwrap(),
                clock: rl_clock,
            }),
        ),
    ]
}

pub(crate) struct Accuracy {
    pub(crate) scenario: String,
    pub(crate) ideal: u64,
    pub(crate) admitted: Vec<(&'static str, u64)>,
}

/// What the exact quota admits on the same polls: tokens as an exact fraction (numerator over
/// 10^9), refilled by `elapsed × rate`, capped at the burst.
pub(crate) fn exact_admissions(rate: u32, burst: u32, step: u64, span: u64) -> u64 {
    let (rate, cap, one) = (
        u128::from(rate),
        u128::from(burst) * 1_000_000_000,
        1_000_000_000u128,
    );
    let (mut num, mut n, mut t) = (cap, 0, 0);
    while t < span {
        if num >= one {
            num -= one;
            n += 1;
        }
        num = (num + u128::from(step) * rate).min(cap);
        t += step;
    }
    n
}

/// Polls every `step` ns for `span` ns; counts admissions against what the exact quota admits on
/// the same polls.
pub(crate) fn admitted_vs_ideal(rate: u32, burst: u32, step: u64, span: u64) -> Accuracy {
    let ideal = exact_admissions(rate, burst, step, span);
    let mut admitted = vec![];
    for (name, mut sim) in sims(rate, burst) {
        let mut n = 0;
        let mut t = 0;
        while t < span {
            n += sim.check().is_ok() as u64;
            sim.advance(step);
            t += step;
        }
        admitted.push((name, n));
    }
    Accuracy {
        scenario: format!(
            "{rate}/s, burst {burst}, polled every {step} ns for {} s",
            span as f64 / 1e9
        ),
        ideal,
        admitted,
    }
}

/// Sharded accuracy under skew: all load from one thread (one home shard), 1000/s with burst 100
/// over the default shard count, polled every 100 µs for 2 s; admitted against the global quota.
pub(crate) fn skewed_sharded() -> (usize, u64, u64) {
    use atomic_limiter::Clock as _;
    let clock = ManualClock::new();
    let q = Quota::per_second(1000).with_burst(100);
    let shards = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .next_power_of_two()
        .max(8);
    let s = atomic_limiter::Sharded::gcra_with_clock(q, shards, clock.clone());
    let mut admitted = 0;
    while clock.now() < 2_000_000_000 {
        admitted += s.check().is_allowed() as u64;
        clock.advance_nanos(100_000);
    }
    (
        s.shard_count(),
        admitted,
        exact_admissions(1000, 100, 100_000, 2_000_000_000),
    )
}

/// Share of advertised waits that earn a second denial when waited exactly, over `trials`.
pub(crate) fn retry_honesty(trials: u32) -> Vec<(&'static str, u32, u32)> {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let rates = [3u32, 7, 30, 100, 1000, 3_000_000, 7_000_000];
    let mut refused: Vec<(&'static str, u32, u32)> = vec![];
    for trial in 0..trials {
        let rate = rates[trial as usize % rates.len()];
        let burst = 1 + (rnd() % 4) as u32;
        let lead = rnd() % 3_000_000_000 / u64::from(rate).max(1);
        for (i, (name, mut sim)) in sims(rate, burst).into_iter().enumerate() {
            if refused.len() <= i {
                refused.push((name, 0, 0));
            }
            sim.advance(lead);
            // Drain, then ask once more: denied, with a wait.
            let mut wait = None;
            for _ in 0..=burst + 1 {
                if let Err(w) = sim.check() {
                    wait = Some(w);
                    break;
                }
            }
            let Some(w) = wait else { continue };
            sim.advance(u64::try_from(w.as_nanos()).unwrap_or(u64::MAX / 2));
            refused[i].2 += 1;
            if sim.check().is_err() {
                refused[i].1 += 1;
            }
        }
    }
    refused
}
