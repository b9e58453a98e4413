//! A coarse clock whose upkeep thread falls behind under load still advertises waits that are
//! enough: waiting exactly the retry-after is never refused again.

use atomic_limiter::{
    CoarseClock, FixedWindow, Gcra, Keyed, Quota, RateLimiter, SlidingWindowCounter, Throttle,
    TokenBucket,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// Drains `limiter`, sleeps exactly the advertised retry-after, and counts how often the same
/// request is refused again.
fn refused_after_waiting(limiter: &dyn RateLimiter, rounds: u32) -> u32 {
    let mut again = 0;
    for _ in 0..rounds {
        let d = loop {
            let d = limiter.check();
            if d.is_denied() {
                break d;
            }
        };
        thread::sleep(d.retry_after());
        if limiter.check().is_denied() {
            again += 1;
        }
    }
    again
}

#[test]
fn waiting_the_retry_after_of_a_coarse_clock_passes_under_load() {
    // Threads spinning on every core, for a bounded time, hold the upkeep thread off the CPU.
    let stop = AtomicBool::new(false);
    let cores = thread::available_parallelism().map_or(2, |n| n.get());
    let deadline = Instant::now() + Duration::from_secs(20);
    thread::scope(|s| {
        for _ in 0..cores {
            s.spawn(|| {
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                }
            });
        }
        let q = Quota::per_second(500).with_burst(1);
        let clock = CoarseClock::new();
        let limiters: Vec<(&str, Box<dyn RateLimiter + Send + Sync>)> = vec![
            ("gcra", Box::new(Gcra::with_clock(q, clock.clone()))),
            (
                "bucket",
                Box::new(TokenBucket::with_clock(q, clock.clone())),
            ),
            ("throttle", Box::new(Throttle::with_clock(q, clock.clone()))),
            (
                "fixed window",
                Box::new(FixedWindow::with_clock(Quota::per_second(5), clock.clone()).unwrap()),
            ),
            (
                "sliding counter",
                Box::new(
                    SlidingWindowCounter::with_clock(Quota::per_second(5), clock.clone()).unwrap(),
                ),
            ),
        ];
        for (name, l) in &limiters {
            let rounds = if name.contains("window") || name.contains("sliding") {
                5
            } else {
                200
            };
            assert_eq!(refused_after_waiting(l.as_ref(), rounds), 0, "{name}");
        }
        let keyed = Keyed::new(q, 10, move |q| Gcra::with_clock(q, clock.clone()));
        for _ in 0..200 {
            let d = loop {
                let d = keyed.check_key(&1u8);
                if d.is_denied() {
                    break d;
                }
            };
            thread::sleep(d.retry_after());
            assert!(keyed.check_key(&1u8).is_allowed(), "keyed");
        }
        stop.store(true, Ordering::Relaxed);
    });
}
