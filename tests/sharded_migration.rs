//! A real thread that moves between CPUs, on the real clock: what a sharded limiter delivers.
//!
//! One thread asks 1.5 times the rate, paced by sleeping, and is pinned to another CPU every few
//! checks (unevenly: most checks on one CPU, so a limiter that kept each CPU to its own share
//! would deliver about 70 %). Each step asks a `Sharded` limiter and a single `Gcra` of the same
//! quota side by side, so a host stall costs both alike: the single limiter is the yardstick, and
//! the sharded one must deliver within a few tokens of it (its shards' fractional tokens and
//! their refill phases, under `shards` tokens, plus one request), never above the quota's bound.
#![cfg(all(target_os = "linux", target_env = "gnu"))]
// The affinity calls that move the thread; each block argued.
#![allow(unsafe_code)]

use atomic_limiter::{Gcra, QuantaClock, Quota, RateLimiter, Sharded};
use std::time::{Duration, Instant};

/// The CPUs this thread may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: `cpu_set_t` is plain data; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { core::mem::zeroed() };
    let size = core::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is a valid, writable `cpu_set_t` of `size` bytes; 0 is this thread.
    assert_eq!(unsafe { libc::sched_getaffinity(0, size, &mut set) }, 0);
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `cpu` is below `CPU_SETSIZE`, the set's capacity.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect()
}

/// Lets this thread run only on `cpus` (the kernel moves it before the call returns).
fn pin(cpus: &[usize]) {
    // SAFETY: as above, all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { core::mem::zeroed() };
    for &cpu in cpus {
        // SAFETY: every `cpu` came from `allowed_cpus`, below `CPU_SETSIZE`.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    let size = core::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is a valid `cpu_set_t` of `size` bytes; 0 is this thread.
    assert_eq!(unsafe { libc::sched_setaffinity(0, size, &set) }, 0);
}

/// The CPU this thread runs on now.
fn cpu_now() -> usize {
    // SAFETY: no preconditions; it answers -1 on error, which the cast makes huge (and harmless:
    // it is only compared with the CPU the thread was pinned to).
    unsafe { libc::sched_getcpu() as usize }
}

/// What one run delivered, in tokens: in all, and in its second half (the rate, once the burst is
/// spent).
struct Run {
    sharded: u64,
    single: u64,
    sharded_late: u64,
    single_late: u64,
    /// `burst + rate × elapsed`: the most any limiter of the quota may admit.
    bound: f64,
    /// Checks made on a CPU other than the previous check's.
    moves: u64,
}

/// One thread, `window` long, asking `n` tokens a step of `sharded` and of a single GCRA of the
/// same quota; pinned to `cpus[1]` for one step in eight, to `cpus[0]` otherwise.
fn run<S: RateLimiter>(sharded: &S, quota: Quota, n: u32, window: Duration, cpus: &[usize]) -> Run {
    let single = Gcra::with_clock(quota, QuantaClock::new());
    let interval = Duration::from_nanos(1_000_000_000 * u64::from(n) * 2 / (3 * quota.rate()));
    let (mut got_sharded, mut got_single, mut moves, mut last_cpu) = (0u64, 0u64, 0u64, usize::MAX);
    let mut at_half = None;
    let start = Instant::now();
    let mut next = start;
    for step in 0u64.. {
        let elapsed = start.elapsed();
        if elapsed >= window {
            break;
        }
        if elapsed >= window / 2 && at_half.is_none() {
            at_half = Some((got_sharded, got_single));
        }
        let cpu = cpus[usize::from(step % 8 == 7 && cpus.len() > 1)];
        pin(&[cpu]);
        let on = cpu_now();
        moves += u64::from(on != last_cpu && last_cpu != usize::MAX);
        last_cpu = on;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        next += interval;
        if sharded.check_n(n).unwrap().is_allowed() {
            got_sharded += u64::from(n);
        }
        if single.check_n(n).unwrap().is_allowed() {
            got_single += u64::from(n);
        }
        let elapsed = start.elapsed().as_secs_f64();
        let bound = f64::from(quota.burst()) + quota.rate() as f64 * elapsed + 1.0;
        assert!(
            (got_sharded as f64) <= bound,
            "over-admitted: {got_sharded} tokens by {elapsed:.3} s"
        );
    }
    let elapsed = start.elapsed().as_secs_f64();
    pin(cpus);
    let (half_sharded, half_single) = at_half.unwrap_or_default();
    Run {
        sharded: got_sharded,
        single: got_single,
        sharded_late: got_sharded - half_sharded,
        single_late: got_single - half_single,
        bound: f64::from(quota.burst()) + quota.rate() as f64 * elapsed,
        moves,
    }
}

/// The test's teeth: each CPU kept to its own share, no stealing, no gathering.
struct NoStealing(Vec<Gcra>, usize);

impl RateLimiter for NoStealing {
    fn check(&self) -> atomic_limiter::Decision {
        self.0[usize::from(cpu_now() == self.1)].check()
    }

    fn check_n(
        &self,
        n: u32,
    ) -> Result<atomic_limiter::Decision, atomic_limiter::InsufficientCapacity> {
        self.0[usize::from(cpu_now() == self.1)].check_n(n)
    }

    fn quota(&self) -> Quota {
        self.0[0].quota()
    }
}

#[test]
fn a_thread_moving_between_cpus_gets_the_whole_rate() {
    let cpus = allowed_cpus();
    let cpus = &cpus[..cpus.len().min(2)];
    let window = Duration::from_millis(1000);
    for (shards, burst, n) in [
        (2usize, 100u32, 1u32),
        (2, 100, 25),
        (4, 100, 25),
        (2, 64, 16),
    ] {
        let quota = Quota::per_second(1000).with_burst(burst);
        let sharded = Sharded::gcra_with_clock(quota, shards, QuantaClock::new());
        let r = run(&sharded, quota, n, window, cpus);
        let what = format!("{} shards, burst {burst}, n {n}", sharded.shard_count());
        eprintln!(
            "{what}: in all, sharded {} and single {} tokens of at most {:.0}; in the second \
             half, sharded {} and single {} ({:.3}); {} moves between CPUs",
            r.sharded,
            r.single,
            r.bound,
            r.sharded_late,
            r.single_late,
            r.sharded_late as f64 / r.single_late as f64,
            r.moves
        );
        // The rate: once every shard has been drawn down, the same as a single limiter's.
        assert!(
            r.sharded_late as f64 >= 0.95 * r.single_late as f64,
            "{what}: the rate fell below 95 % of a single limiter's"
        );
        // In all: behind by at most the bursts of the shards the load did not start from (what
        // they discard while full), their fractional tokens, and one request.
        let home_share = sharded.shard_quotas().map(|q| q.burst()).max().unwrap();
        let lag = u64::from(burst - home_share) + sharded.shard_count() as u64 + u64::from(n);
        assert!(
            r.sharded + lag >= r.single,
            "{what}: sharded {} against single {}, more than {lag} behind",
            r.sharded,
            r.single
        );
    }
    // The same run catches a limiter that keeps each CPU to its share (where there are two CPUs
    // to move between).
    if cpus.len() > 1 {
        let quota = Quota::per_second(1000).with_burst(100);
        let half = Quota::per_second(500).with_burst(50);
        let broken = NoStealing(
            (0..2)
                .map(|_| Gcra::with_clock(half, QuantaClock::new()))
                .collect(),
            cpus[1],
        );
        let r = run(&broken, quota, 1, window, cpus);
        eprintln!(
            "no stealing: {} against single {} in the second half",
            r.sharded_late, r.single_late
        );
        assert!(
            (r.sharded_late as f64) < 0.95 * r.single_late as f64,
            "the harness no longer tells a limiter that strands tokens on a CPU"
        );
    }
}
