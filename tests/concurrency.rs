//! Threads hammering one limiter on a frozen clock: exactly `burst` admissions, never one more.

use atomic_limiter::baseline::MutexGcra;
use atomic_limiter::{Gcra, ManualClock, Quota, RateLimiter, TokenBucket};
use std::sync::Barrier;
use std::thread;

fn threads() -> usize {
    2 * thread::available_parallelism().map_or(2, |n| n.get())
}

/// Runs `tries` checks of `n` tokens on each of `threads()` threads at once; returns tokens admitted.
fn hammer<L: RateLimiter + Sync + ?Sized>(limiter: &L, n: u32, tries: usize) -> u64 {
    let barrier = Barrier::new(threads());
    thread::scope(|s| {
        let handles: Vec<_> = (0..threads())
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    let mut tokens = 0u64;
                    for _ in 0..tries {
                        if limiter.check_n(n).unwrap().is_allowed() {
                            tokens += u64::from(n);
                        }
                    }
                    tokens
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    })
}

fn each_limiter(quota: Quota, mut f: impl FnMut(&str, &dyn RateLimiterSync)) {
    let clock = ManualClock::new();
    f("gcra", &Gcra::with_clock(quota, clock.clone()));
    f("bucket", &TokenBucket::with_clock(quota, clock.clone()));
    f("mutex-gcra", &MutexGcra::<_>::with_clock(quota, clock));
}

trait RateLimiterSync: RateLimiter + Sync {}
impl<T: RateLimiter + Sync> RateLimiterSync for T {}

#[test]
fn frozen_clock_admits_exactly_the_burst() {
    for round in 0..200u32 {
        let burst = 1 + round % 97 * 13;
        let quota = Quota::per_second(1_000).with_burst(burst);
        each_limiter(quota, |name, limiter| {
            let admitted = hammer(limiter, 1, burst as usize);
            assert_eq!(admitted, u64::from(burst), "{name}, round {round}");
        });
    }
}

#[test]
fn mixed_sizes_never_exceed_the_burst() {
    for round in 0..100u32 {
        let burst = 50 + round;
        let quota = Quota::per_second(10).with_burst(burst);
        each_limiter(quota, |name, limiter| {
            // Sizes 1..=7 from different threads: the total taken never exceeds the burst, and
            // what is left is less than the largest request that was still refused.
            let total: u64 = thread::scope(|s| {
                let hs: Vec<_> = (1..=threads() as u32)
                    .map(|t| {
                        s.spawn(move || {
                            let n = 1 + (t + round) % 7;
                            (0..burst)
                                .filter(|_| limiter.check_n(n).unwrap().is_allowed())
                                .count() as u64
                                * u64::from(n)
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).sum()
            });
            assert!(total <= u64::from(burst), "{name}: {total} > {burst}");
            let left = limiter.check_n(0).unwrap().remaining();
            assert_eq!(total + left, u64::from(burst), "{name}: tokens lost");
        });
    }
}

#[test]
fn limiters_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Gcra<ManualClock>>();
    assert_send_sync::<TokenBucket<ManualClock>>();
    assert_send_sync::<Gcra>();
    assert_send_sync::<TokenBucket>();
    assert_send_sync::<MutexGcra>();
}
