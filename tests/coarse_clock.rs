//! A coarse clock whose upkeep thread falls behind under load still advertises waits that are
//! enough: waiting exactly the retry-after is never refused again.

use atomic_limiter::{
    Clock, CoarseClock, FixedWindow, Gcra, Keyed, ManualClock, Quota, RateLimiter,
    SlidingWindowCounter, Throttle, TokenBucket,
};
use proptest::prelude::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

/// A coarse clock whose readings lag real time by a set amount (an upkeep thread held off the
/// CPU), its fresh reading the real time.
#[derive(Clone)]
struct Lagging {
    real: ManualClock,
    lag: Arc<AtomicU64>,
}

impl Clock for Lagging {
    fn now(&self) -> u64 {
        self.real
            .now()
            .saturating_sub(self.lag.load(Ordering::Relaxed))
    }
    fn now_fresh(&self) -> u64 {
        self.real.now()
    }
    fn resolution(&self) -> u64 {
        1_000_000
    }
    fn is_monotonic(&self) -> bool {
        true
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A token bucket on a lagging coarse clock refuses what the same bucket refuses on the same
    /// clock with no lag, with the same figures: a denial made on the lagging reading, carried to
    /// the fresh one or decided again there, answers as if made there. Lags up to 3 ms span many
    /// of the bucket's ticks (a 100/s quota ticks every 8 us).
    #[test]
    fn a_lagging_coarse_clock_decides_what_the_fresh_reading_decides(
        burst in 1u32..=8,
        per_second in prop_oneof![Just(1u64), Just(100), 1u64..=100_000],
        ops in prop::collection::vec((0u64..4_000_000, 0u64..=3_000_000, 1u32..=8), 1..200),
    ) {
        let quota = Quota::per_second(per_second).with_burst(burst);
        let start = 1u64 << 40;
        let (lagged_real, fresh_real) = (ManualClock::starting_at(start), ManualClock::starting_at(start));
        let lag = Arc::new(AtomicU64::new(0));
        let lagged = TokenBucket::with_clock(quota, Lagging { real: lagged_real.clone(), lag: lag.clone() });
        let fresh = TokenBucket::with_clock(
            quota,
            Lagging { real: fresh_real.clone(), lag: Arc::new(AtomicU64::new(0)) },
        );
        for (advance, behind, n) in ops {
            lagged_real.advance(Duration::from_nanos(advance));
            fresh_real.advance(Duration::from_nanos(advance));
            let n = n.min(burst);
            // An admission is made on the coarse reading itself; so that both buckets keep the
            // same state, the lag is applied only where the bucket refuses.
            let b = fresh.check_n(n).unwrap();
            lag.store(if b.is_allowed() { 0 } else { behind }, Ordering::Relaxed);
            let a = lagged.check_n(n).unwrap();
            prop_assert_eq!(a.is_allowed(), b.is_allowed());
            prop_assert_eq!(a.remaining(), b.remaining());
            prop_assert_eq!(a.retry_after(), b.retry_after());
            prop_assert_eq!(a.reset_after(), b.reset_after());
        }
    }
}

/// The coarse time advances with real time, within its resolution and the upkeep thread's lag,
/// and is never ahead of a later precise reading of the same clock (one calibration for both).
#[test]
fn the_coarse_time_follows_the_precise_one_and_never_passes_it() {
    let clock = CoarseClock::try_new().expect("the upkeep thread starts");
    let start = Instant::now();
    let first = clock.now();
    let mut steps = 0u32;
    let mut last = first;
    // Bounded: 50 ms of readings.
    while start.elapsed() < Duration::from_millis(50) {
        let coarse = clock.now();
        let after = clock.now_fresh();
        assert!(
            coarse <= after,
            "coarse {coarse} ns ahead of a later precise {after} ns"
        );
        assert!(
            coarse >= last,
            "the coarse time stepped back: {last} then {coarse} ns"
        );
        steps += u32::from(coarse > last);
        last = coarse;
    }
    let elapsed = start.elapsed().as_nanos() as u64;
    // The upkeep refreshes every millisecond; allow for a host that holds it off for 30 ms.
    assert!(
        last - first + 30_000_000 >= elapsed,
        "the coarse time advanced {} ns in {elapsed} ns",
        last - first
    );
    assert!(steps >= 5, "the coarse time moved {steps} times in 50 ms");
    assert_eq!(clock.resolution(), 1_000_000);
}
