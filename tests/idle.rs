//! What a limiter holds after long idles: the full burst, within the documented horizons.

mod common;

use atomic_limiter::{Clock, Gcra, ManualClock, Quota, RateLimiter, TokenBucket};
use common::bucket_wait_slack;
use std::time::Duration;

const SECOND: u64 = 1_000_000_000;
const IDLES: [(&str, u64); 5] = [
    ("1 s", SECOND),
    ("1 h", 3600 * SECOND),
    ("1 day", 86_400 * SECOND),
    ("1 year", 365 * 86_400 * SECOND),
    ("100 years", 100 * 365 * 86_400 * SECOND),
];

fn drained_then_idle(limiter: &impl RateLimiter, clock: &ManualClock, idle: u64) -> u64 {
    let burst = limiter.quota().burst();
    while limiter.check_n(0).unwrap().remaining() > 0 {
        let _ = limiter.check();
    }
    assert!(limiter.check().is_denied());
    clock.advance_nanos(idle);
    let full = limiter.check_n(burst).unwrap();
    if full.is_allowed() {
        u64::from(burst)
    } else {
        full.remaining()
    }
}

#[test]
fn full_burst_after_every_idle_for_common_quotas() {
    for quota in [
        Quota::per_second(100).with_burst(10),
        Quota::per_second(1),
        Quota::per_minute(600).with_burst(50),
        Quota::per_second(1000).with_burst(1 << 10),
    ] {
        for (label, idle) in IDLES {
            // Full once the fill time has passed; before that, exactly what has refilled.
            let refilled = (u128::from(idle) * u128::from(quota.rate()) / quota.per().as_nanos())
                .min(u128::from(quota.burst())) as u64;
            let clock = ManualClock::new();
            let gcra = Gcra::with_clock(quota, clock.clone());
            assert_eq!(
                drained_then_idle(&gcra, &clock, idle),
                refilled,
                "gcra {quota:?} after {label}"
            );
            let clock = ManualClock::new();
            let bucket = TokenBucket::with_clock(quota, clock.clone());
            if bucket.idle_horizon() <= Duration::from_nanos(idle) {
                // Past the horizon: the documented bound (never more than full), checked below.
                assert!(drained_then_idle(&bucket, &clock, idle) <= u64::from(quota.burst()));
                println!(
                    "{quota:?}: bucket horizon {:?} < {label}",
                    bucket.idle_horizon()
                );
                continue;
            }
            // The bucket trails exact time by its resolution (a few 1/1024ths of a period): at an
            // idle of exactly one fill time it is that much short of full.
            let lag = bucket_wait_slack(&quota, bucket.tick().as_nanos() as u64);
            assert_eq!(
                drained_then_idle(&bucket, &clock, idle + lag),
                refilled,
                "bucket {quota:?} after {label}"
            );
        }
    }
}

/// Past its idle horizon a token bucket reads the idle modulo its stamp cycle: it may hold fewer
/// tokens than a full burst (never more), and is full again within one cycle quarter plus a fill.
#[test]
fn beyond_the_bucket_horizon_is_never_more_than_full() {
    let quota = Quota::per_second(1_000_000_000).with_burst(1000);
    for (label, idle) in IDLES {
        let clock = ManualClock::new();
        let bucket = TokenBucket::with_clock(quota, clock.clone());
        let got = drained_then_idle(&bucket, &clock, idle);
        assert!(got <= 1000, "{label}: {got}");
        if Duration::from_nanos(idle) <= bucket.idle_horizon() {
            assert_eq!(got, 1000, "{label}: inside the horizon");
        } else {
            // Documented bound: after at most a backward tolerance plus one fill time it is full.
            let wait = bucket.backward_tolerance() + quota.fill_time();
            clock.advance(wait);
            assert!(
                bucket.check_n(1000).unwrap().is_allowed(),
                "{label}: not full after {wait:?}"
            );
        }
    }
}

#[test]
fn gcra_horizon_is_at_least_a_year_for_every_quota() {
    let clock = ManualClock::new();
    // The largest denominator with the largest window the quota allows.
    let worst = Quota::try_new(128, Duration::from_nanos(1_000_001), 1)
        .unwrap()
        .with_burst(((1u64 << 62) / 1_000_001) as u32 % Quota::MAX_BURST);
    assert_eq!(worst.period_fraction().1, 128);
    let g = Gcra::with_clock(worst, clock);
    assert!(g.horizon() > Duration::from_secs(365 * 86_400));
}

/// A manual clock that promises monotonic readings (the test only moves it forward), so the
/// bucket reads it as it reads the shipped clocks.
#[derive(Clone)]
struct Monotonic(ManualClock);

impl Clock for Monotonic {
    fn now(&self) -> u64 {
        self.0.now()
    }
    fn is_monotonic(&self) -> bool {
        true
    }
}

/// `per_second(1_000_000)` with its default burst has a 17.2 s stamp cycle: after a drain and an
/// idle of 12.9 to 17.2 s it used to read the idle as a clock step back and admit nothing for up
/// to 4.3 s; `per_second(10^9)` after 8 s admitted 409M of ~1001M. On a monotonic clock every
/// idle up to the cycle is now read exactly.
#[test]
fn on_a_monotonic_clock_a_drained_bucket_refills_after_any_idle_within_its_cycle() {
    for (quota, idles_ms) in [
        (
            Quota::per_second(1_000_000),
            &[
                1_000u64, 4_300, 8_600, 12_000, 12_900, 13_500, 15_000, 16_500, 17_100,
            ][..],
        ),
        (
            Quota::per_second(1_000_000_000),
            &[1_000, 4_400, 6_000, 8_000, 8_500][..],
        ),
        (
            Quota::per_second(1000).with_burst(1 << 20),
            &[1_100_000, 7_000_000, 13_000_000, 17_000_000][..],
        ),
    ] {
        let clock = ManualClock::new();
        let bucket = TokenBucket::with_clock(quota, Monotonic(clock.clone()));
        let cycle = bucket.idle_horizon() + bucket.backward_tolerance();
        // The bucket trails exact time by its resolution: an idle of one fill time needs that too.
        let lag = bucket_wait_slack(&quota, bucket.tick().as_nanos() as u64);
        for &ms in idles_ms {
            let idle = Duration::from_millis(ms);
            assert!(
                idle < bucket.idle_horizon(),
                "{quota:?}: {idle:?} past the horizon"
            );
            let got = drained_then_idle(&bucket, &clock, idle.as_nanos() as u64 + lag);
            assert_eq!(
                got,
                u64::from(quota.burst()),
                "{quota:?}: after {idle:?} of a {cycle:?} cycle"
            );
        }
    }
}

/// Past the cycle the idle is read modulo it: within a fill time after a whole number of cycles
/// the bucket holds what refilled since (fewer, never more), and a millisecond before one it
/// stalls; either way it is full again within that millisecond and a fill time.
#[test]
fn on_a_monotonic_clock_past_its_cycle_a_bucket_is_never_more_than_full() {
    let quota = Quota::per_second(1_000_000);
    let clock = ManualClock::new();
    let bucket = TokenBucket::with_clock(quota, Monotonic(clock.clone()));
    let cycle = (bucket.idle_horizon() + bucket.backward_tolerance()).as_nanos() as u64;
    for idle in [
        cycle + 1_000_000,
        cycle + 500_000_000,
        3 * cycle - 500_000,
        5 * cycle + 100,
    ] {
        let got = drained_then_idle(&bucket, &clock, idle);
        assert!(got <= u64::from(quota.burst()), "{idle}: {got}");
        let wait = bucket.backward_tolerance() + quota.fill_time() + bucket.tick() * 8;
        clock.advance(wait);
        assert!(
            bucket.check_n(quota.burst()).unwrap().is_allowed(),
            "{idle}: not full {wait:?} later"
        );
    }
}

/// A clock whose next reading is a stale one (taken, say, by a thread that then waited), while
/// a fresh reading shows the real time.
#[derive(Clone)]
struct StaleOnce {
    real: ManualClock,
    stale: std::sync::Arc<std::sync::Mutex<Option<u64>>>,
}

impl Clock for StaleOnce {
    fn now(&self) -> u64 {
        self.stale
            .lock()
            .unwrap()
            .take()
            .unwrap_or_else(|| self.real.now())
    }
    fn now_fresh(&self) -> u64 {
        self.real.now()
    }
    fn is_monotonic(&self) -> bool {
        true
    }
}

/// A stale reading of any age up to half the stamp cycle, on a drained bucket, grants nothing:
/// the bucket reads the clock again rather than take it for a long idle.
#[test]
fn on_a_monotonic_clock_a_stale_reading_grants_nothing() {
    let quota = Quota::per_second(1_000_000);
    let real = ManualClock::starting_at(1 << 40);
    let stale = std::sync::Arc::new(std::sync::Mutex::new(None));
    let clock = StaleOnce {
        real: real.clone(),
        stale: stale.clone(),
    };
    let bucket = TokenBucket::with_clock(quota, clock);
    let cycle = (bucket.idle_horizon() + bucket.backward_tolerance()).as_nanos() as u64;
    assert!(bucket.check_n(quota.burst()).unwrap().is_allowed());
    for behind in [
        1u64,
        1_000_000,
        2_000_000,
        cycle / 4,
        cycle / 2 - 1_000_000,
        cycle / 2 - 1,
    ] {
        *stale.lock().unwrap() = Some(real.now() - behind);
        assert!(
            bucket.check().is_denied(),
            "a reading {behind} ns stale admitted from a drained bucket"
        );
    }
}

/// The horizon the bucket states is read exactly: drained, then idle for exactly
/// `idle_horizon()`, it is full, whatever the quota and wherever on the clock the idle starts
/// (per_second(10^9) from 2^33 ns once read one tick too long, and empty).
#[test]
fn an_idle_of_exactly_the_horizon_is_read_exactly() {
    let quotas = [
        Quota::per_second(1_000_000_000),
        Quota::per_second(1_000_000_000).with_burst(64),
        Quota::per_second(1_000_000_000).with_burst(1),
        Quota::per_second(3_000_000),
        Quota::per_second(1000).with_burst(1 << 10),
        Quota::per_second(100).with_burst(10),
        Quota::per_minute(7),
        Quota::per_second(1),
    ];
    let starts = [
        0,
        1,
        1 << 20,
        (1 << 33) - 1,
        1 << 33,
        (1 << 33) + 12_345,
        1 << 45,
    ];
    for quota in quotas {
        for start in starts {
            let clock = ManualClock::starting_at(start);
            let bucket = TokenBucket::with_clock(quota, clock.clone());
            while bucket.check().is_allowed() {}
            let horizon = bucket.idle_horizon();
            clock.advance(horizon);
            let left = bucket.check_n(0).unwrap().remaining();
            assert_eq!(
                left,
                u64::from(quota.burst()),
                "{quota:?} from {start} ns, idle {horizon:?}"
            );
        }
    }
}
