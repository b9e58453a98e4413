//! Fixed window and sliding window counter: against reference models written with plain division
//! and no packing, their documented worst cases, their waits, and threads.

use atomic_limiter::baseline::{MutexFixedWindow, MutexSlidingWindowCounter};
use atomic_limiter::{
    Clock, FixedWindow, ManualClock, Quota, RateLimiter, SlidingWindowCounter, SlidingWindowLog,
};
use proptest::prelude::*;
use std::collections::VecDeque;

mod common;
use common::{FixedModel, SlidingModel};
use std::sync::Barrier;
use std::thread;
use std::time::Duration;

fn quota() -> impl Strategy<Value = Quota> {
    (
        1u64..=50,
        prop_oneof![Just(1_000_000_000u64), 1u64..=10_000_000],
    )
        .prop_filter_map("quota", |(limit, w)| {
            Quota::try_new(limit, Duration::from_nanos(w), 1).ok()
        })
}

fn runs() -> impl Strategy<Value = (Quota, u64, Vec<(u64, u32)>)> {
    quota().prop_flat_map(|q| {
        let w = q.per().as_nanos() as u64;
        let limit = q.rate() as u32;
        (
            Just(q),
            any::<u64>().prop_map(|s| s >> 4),
            proptest::collection::vec((0..=w.saturating_mul(2) / 3, 0..=limit + 1), 1..150),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(512)
    ))]

    #[test]
    fn fixed_window_matches_its_model((q, start, ops) in runs()) {
        let clock = ManualClock::starting_at(start);
        let w = FixedWindow::with_clock(q, clock.clone()).unwrap();
        let twin: MutexFixedWindow<_> = MutexFixedWindow::with_clock(q, clock.clone()).unwrap();
        let mut m = FixedModel { limit: q.rate(), window: q.per().as_nanos() as u64, epoch: start, index: 0, count: 0 };
        matches_model(q, &clock, &ops, &w, &twin, |now, n| m.check(now, n))?;
    }

    #[test]
    fn sliding_counter_matches_its_model((q, start, ops) in runs()) {
        let clock = ManualClock::starting_at(start);
        let w = SlidingWindowCounter::with_clock(q, clock.clone()).unwrap();
        let twin: MutexSlidingWindowCounter<_> = MutexSlidingWindowCounter::with_clock(q, clock.clone()).unwrap();
        let mut m = SlidingModel { limit: q.rate(), window: q.per().as_nanos() as u64, epoch: start, index: 0, previous: 0, current: 0 };
        matches_model(q, &clock, &ops, &w, &twin, |now, n| m.check(now, n))?;
    }

    /// The log admits exactly what a plain deque of admission times admits.
    #[test]
    fn sliding_log_matches_a_deque((q, start, ops) in runs()) {
        let clock = ManualClock::starting_at(start);
        let log = SlidingWindowLog::with_clock(q, clock.clone()).unwrap();
        let (limit, w) = (q.rate(), q.per().as_nanos() as u64);
        let mut times: VecDeque<u64> = VecDeque::new();
        for (advance, n) in ops {
            clock.advance_nanos(advance);
            let now = clock.now();
            let d = log.check_n(n);
            if u64::from(n) > limit { prop_assert!(d.is_err()); continue; }
            let d = d.unwrap();
            times.retain(|&t| t + w > now);
            let ok = times.len() as u64 + u64::from(n) <= limit;
            if ok { times.extend(std::iter::repeat_n(now, n as usize)); }
            prop_assert_eq!(d.is_allowed(), ok);
            prop_assert_eq!(d.remaining(), limit - times.len() as u64);
        }
    }

    /// Any span of length W holds at most `2 × limit` admissions for the fixed window,
    /// `2 × limit - 1` for the sliding counter, and exactly at most `limit` for the log.
    #[test]
    fn no_span_of_one_window_exceeds_the_documented_bound((q, start, ops) in runs()) {
        let width = q.per().as_nanos() as u64;
        let limit = q.rate();
        let clock = ManualClock::starting_at(start);
        let fixed = FixedWindow::with_clock(q, clock.clone()).unwrap();
        let sliding = SlidingWindowCounter::with_clock(q, clock.clone()).unwrap();
        let log = SlidingWindowLog::with_clock(q, clock.clone()).unwrap();
        let mut logs = [VecDeque::<(u64, u64)>::new(), VecDeque::new(), VecDeque::new()];
        let bounds = [2 * limit, 2 * limit - 1, limit];
        for (advance, n) in ops {
            clock.advance_nanos(advance);
            if u64::from(n) > limit { continue; }
            let now = clock.now();
            let limiters: [&dyn RateLimiter; 3] = [&fixed, &sliding, &log];
            for (i, l) in limiters.into_iter().enumerate() {
                if l.check_n(n).unwrap().is_allowed() && n > 0 {
                    logs[i].push_back((now, u64::from(n)));
                }
                // Admissions in (now - W, now].
                while logs[i].front().is_some_and(|&(t, _)| t + width <= now) {
                    logs[i].pop_front();
                }
                let in_span: u64 = logs[i].iter().map(|&(_, k)| k).sum();
                prop_assert!(in_span <= bounds[i], "{} in a span of W, bound {}", in_span, bounds[i]);
            }
        }
    }

    /// Waiting exactly the advertised retry-after passes; one nanosecond less does not.
    #[test]
    fn retry_after_is_the_shortest_sufficient_wait((q, start, ops) in runs()) {
        for kind in 0..3 {
            let clock = ManualClock::starting_at(start);
            let l = window_limiter(kind, q, &clock);
            for &(advance, n) in &ops {
                clock.advance_nanos(advance);
                if u64::from(n) > q.rate() { continue; }
                let d = l.check_n(n).unwrap();
                if d.is_denied() {
                    let wait = d.retry_after().as_nanos() as u64;
                    prop_assert!(wait > 0);
                    clock.advance_nanos(wait - 1);
                    prop_assert!(l.check_n(n).unwrap().is_denied(), "kind {}: passed early", kind);
                    clock.advance_nanos(1);
                    prop_assert!(l.check_n(n).unwrap().is_allowed(), "kind {}: denied after retry_after", kind);
                }
            }
        }
    }
}

/// Runs `ops` through a window limiter and its mutex twin (identical answers) and a model (same
/// decisions and remaining counts).
fn matches_model(
    q: Quota,
    clock: &ManualClock,
    ops: &[(u64, u32)],
    limiter: &dyn RateLimiter,
    twin: &dyn RateLimiter,
    mut model: impl FnMut(u64, u64) -> (bool, u64),
) -> Result<(), TestCaseError> {
    for &(advance, n) in ops {
        clock.advance_nanos(advance);
        let d = limiter.check_n(n);
        prop_assert_eq!(d, twin.check_n(n), "lock-free and mutex twins disagree");
        if u64::from(n) > q.rate() {
            prop_assert!(d.is_err());
            continue;
        }
        let d = d.unwrap();
        let (ok, remaining) = model(clock.now(), u64::from(n));
        prop_assert_eq!(d.is_allowed(), ok);
        prop_assert_eq!(d.remaining(), remaining);
    }
    Ok(())
}

fn window_limiter(kind: u32, q: Quota, clock: &ManualClock) -> Box<dyn RateLimiter> {
    match kind {
        0 => Box::new(FixedWindow::with_clock(q, clock.clone()).unwrap()),
        1 => Box::new(SlidingWindowCounter::with_clock(q, clock.clone()).unwrap()),
        _ => Box::new(SlidingWindowLog::with_clock(q, clock.clone()).unwrap()),
    }
}

/// The sliding counter's worst case is reached: the whole limit at the very end of one window,
/// then the weight lets nearly the whole limit in again before that span of W ends.
#[test]
fn sliding_counter_worst_case_is_reached_and_bounded() {
    let clock = ManualClock::new();
    let limit = 100;
    let w = SlidingWindowCounter::with_clock(Quota::per_second(limit), clock.clone()).unwrap();
    clock.set(999_999_999); // the last nanosecond of window 0
    assert!(w.check_n(limit as u32).unwrap().is_allowed());
    let mut in_span = limit;
    // Through window 1, up to 1 ns before the span that began at 999_999_999 ends.
    while clock.now() < 1_999_999_998 {
        clock.advance_nanos(1_000_000);
        in_span += w.check().is_allowed() as u64;
    }
    assert!(in_span < 2 * limit, "{in_span}");
    assert!(
        in_span >= 2 * limit - 2,
        "the worst case is {in_span}, not near 2 x limit"
    );
}

/// The fixed window's edge: the whole limit at the end of one window and again at the start of
/// the next.
#[test]
fn fixed_window_admits_twice_the_limit_across_an_edge() {
    let clock = ManualClock::starting_at(0);
    let w = FixedWindow::with_clock(Quota::per_second(10), clock.clone()).unwrap();
    clock.set(999_999_999);
    assert!(w.check_n(10).unwrap().is_allowed());
    clock.set(1_000_000_000);
    assert!(w.check_n(10).unwrap().is_allowed());
}

#[test]
fn clock_stepping_back_keeps_the_count() {
    for sliding in [false, true] {
        let clock = ManualClock::starting_at(5_000_000_000);
        let l: Box<dyn RateLimiter> = if sliding {
            Box::new(SlidingWindowCounter::with_clock(Quota::per_second(5), clock.clone()).unwrap())
        } else {
            Box::new(FixedWindow::with_clock(Quota::per_second(5), clock.clone()).unwrap())
        };
        clock.advance(Duration::from_millis(2500));
        assert!(l.check_n(5).unwrap().is_allowed());
        clock.rewind(Duration::from_secs(2));
        assert!(
            l.check().is_denied(),
            "sliding {sliding}: a step back reset the count"
        );
    }
}

#[test]
fn limits_too_large_are_typed_errors() {
    let q = Quota::try_new(2_000_000, Duration::from_secs(1), 1).unwrap();
    assert!(SlidingWindowCounter::with_clock(q, ManualClock::new()).is_err());
    assert!(SlidingWindowLog::with_clock(q, ManualClock::new()).is_err());
    assert!(FixedWindow::with_clock(q, ManualClock::new()).is_ok());
}

#[test]
fn frozen_clock_threads_admit_exactly_the_limit() {
    let threads = 2 * thread::available_parallelism().map_or(2, |n| n.get());
    for limit in [1u64, 7, 500] {
        let q = Quota::per_second(limit);
        let fixed = FixedWindow::with_clock(q, ManualClock::new()).unwrap();
        let sliding = SlidingWindowCounter::with_clock(q, ManualClock::new()).unwrap();
        let log = SlidingWindowLog::with_clock(q, ManualClock::new()).unwrap();
        let limiters: [&(dyn RateLimiter + Sync); 3] = [&fixed, &sliding, &log];
        for l in limiters {
            let barrier = Barrier::new(threads);
            let admitted: usize = thread::scope(|s| {
                let hs: Vec<_> = (0..threads)
                    .map(|_| {
                        s.spawn(|| {
                            barrier.wait();
                            (0..limit).filter(|_| l.check().is_allowed()).count()
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).sum()
            });
            assert_eq!(admitted as u64, limit);
        }
    }
}

/// Found by `cargo fuzz run differential` once it covered the windows: with a window longer than
/// half of `u64` nanoseconds, the sliding counter's reset-after (the rest of this window plus the
/// next) overflowed. It saturates now.
#[test]
fn sliding_counter_reset_after_saturates_for_huge_windows() {
    let q = Quota::try_from_nanos(65_535, 281_474_976_710_180 * 65_535, 1).unwrap();
    let clock = ManualClock::starting_at(u64::MAX);
    let w = SlidingWindowCounter::with_clock(q, clock).unwrap();
    let d = w.check_n(191).unwrap();
    assert!(d.is_allowed());
    assert_eq!(d.reset_after(), Duration::from_nanos(u64::MAX));
}

/// Past its horizon (the window index's width) the sliding counter reads the index modulo the
/// width: an idle of exactly `2^index_bits` windows looks like the same window, and the old counts
/// are kept: fewer admissions, never more, and a window later all is fresh again.
#[test]
fn past_the_horizon_old_counts_are_kept_never_more() {
    // Limit 1 000 000: 20-bit counts, a 24-bit index; 1 ms windows: a cycle of 2^24 ms.
    let q = Quota::try_new(1_000_000, Duration::from_millis(1), 1).unwrap();
    let clock = ManualClock::new();
    let w = SlidingWindowCounter::with_clock(q, clock.clone()).unwrap();
    assert_eq!(w.horizon(), Duration::from_millis((1 << 23) - 1));
    assert!(w.check_n(1_000_000).unwrap().is_allowed());
    // Exactly one index cycle later: read as the same window, the old count kept.
    clock.advance(Duration::from_millis(1 << 24));
    assert!(
        w.check().is_denied(),
        "the old count is kept: fewer admissions"
    );
    // Two windows on: both counts have slid out.
    clock.advance(Duration::from_millis(2));
    assert!(w.check().is_allowed());
}

/// Steps a window limiter through readings some of which are behind earlier ones, and checks each
/// admission against the limiter's rule at the latest reading so far (where a clock that stalled
/// instead of stepping back would stand), counted over the admissions made: it must pass there.
fn stepping_back_is_a_stall(seed: u64) -> Result<(), String> {
    let mut rng = seed;
    let mut next = move |m: u64| {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (rng >> 33) % m
    };
    let limit = next(20) + 1;
    let w = next(1000) + 21;
    let q = Quota::try_new(limit, Duration::from_nanos(w), 1).unwrap();
    let start = next(1 << 40) + 10_000;
    for kind in 0..3 {
        let clock = ManualClock::starting_at(start);
        let l = window_limiter(kind, q, &clock);
        let mut latest = start;
        // (time at the latest reading, tokens) of every admission.
        let mut admitted: Vec<(u64, u64)> = vec![];
        for _ in 0..300 {
            match next(4) {
                0 => clock.rewind(Duration::from_nanos(next(3000))),
                _ => clock.advance_nanos(next(600)),
            }
            latest = latest.max(clock.now());
            let n = next(limit + 1);
            let d = l.check_n(n as u32).unwrap();
            if n == 0 && d.is_denied() {
                return Err(format!("kind {kind}: a peek refused"));
            }
            if d.is_denied() {
                if d.retry_after() == Duration::ZERO {
                    return Err(format!("kind {kind}: a denial advertised no wait"));
                }
                continue;
            }
            let (t, k, e) = (latest - start, (latest - start) / w, (latest - start) % w);
            let in_window = |i: u64| {
                admitted
                    .iter()
                    .filter(|&&(a, _)| (a - start) / w == i)
                    .map(|&(_, m)| m)
                    .sum::<u64>()
            };
            let ok = match kind {
                0 => in_window(k) + n <= limit,
                1 => {
                    let previous = if k == 0 { 0 } else { in_window(k - 1) };
                    u128::from(previous) * u128::from(w - e)
                        + u128::from(in_window(k) + n) * u128::from(w)
                        <= u128::from(limit) * u128::from(w)
                }
                _ => {
                    let recent: u64 = admitted
                        .iter()
                        .filter(|&&(a, _)| a - start + w > t)
                        .map(|&(_, m)| m)
                        .sum();
                    recent + n <= limit
                }
            };
            if !ok {
                return Err(format!(
                    "kind {kind}: admitted {n} at {} (latest {t}) past the limit",
                    clock.now() as i128 - start as i128
                ));
            }
            admitted.push((latest, n));
        }
    }
    Ok(())
}

#[test]
fn window_readings_that_step_back_decide_as_a_stalled_clock() {
    for seed in 0..300 {
        stepping_back_is_a_stall(seed).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    }
}

/// The sliding counter just after a window edge: a reading 1 ns back, into the previous window,
/// must not lighten the previous window's weight, and a peek still passes.
#[test]
fn sliding_counter_reading_back_across_an_edge_is_a_stall() {
    let clock = ManualClock::new();
    let w = SlidingWindowCounter::with_clock(Quota::per_second(20), clock.clone()).unwrap();
    clock.set(500_000_000);
    assert!(w.check_n(20).unwrap().is_allowed());
    clock.set(1_000_000_000); // window 1 starts; the previous 20 weigh in whole
    assert!(w.check().is_denied());
    clock.set(999_999_999); // 1 ns back, into window 0's last nanosecond
    assert!(w.check_n(0).unwrap().is_allowed(), "a peek is refused");
    assert!(w.check().is_denied(), "a step back granted a token");
}

#[test]
fn waiting_the_retry_after_of_a_window_after_a_step_back_passes() {
    for kind in 0..3 {
        let clock = ManualClock::starting_at(10_000_000_000);
        let l = window_limiter(kind, Quota::per_second(5), &clock);
        clock.advance(Duration::from_millis(2500));
        assert!(l.check_n(5).unwrap().is_allowed());
        for back in [
            1u64,
            300_000_000,
            1_000_000_000,
            2_600_000_000,
            20_000_000_000,
        ] {
            let at = clock.now();
            clock.rewind(Duration::from_nanos(back));
            let d = l.check();
            assert!(d.is_denied(), "kind {kind} back {back}");
            assert!(d.retry_after() > Duration::ZERO, "kind {kind} back {back}");
            clock.advance(d.retry_after());
            assert!(
                l.check_n(0).unwrap().is_allowed() && l.check().is_allowed(),
                "kind {kind} back {back}: refused after waiting {:?}",
                d.retry_after()
            );
            // Fill it again, from the latest time, for the next step back.
            clock.set(clock.now().max(at));
            let _ = l.check_n(4);
        }
    }
}

#[test]
fn sliding_log_after_a_step_back_waits_without_spinning() {
    let clock = ManualClock::starting_at(5_000_000_000);
    let log = SlidingWindowLog::with_clock(Quota::per_second(3), clock.clone()).unwrap();
    assert!(log.check_n(3).unwrap().is_allowed());
    clock.rewind(Duration::from_millis(700));
    let mut sleeps = 0;
    let d = log
        .wait_n_with(
            1,
            atomic_limiter::Wait::up_to(Duration::from_secs(5)),
            |d| {
                sleeps += 1;
                assert!(sleeps < 3, "waiting spins");
                clock.advance(d);
            },
        )
        .unwrap();
    assert!(d.is_allowed());
    assert_eq!(sleeps, 1);
}

/// Each reading is kept by the thread that made it, so an admission can be timed exactly as the
/// log timed it.
#[derive(Clone)]
struct RecordingClock(atomic_limiter::StdClock);

thread_local! {
    static LAST_READING: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

impl atomic_limiter::Clock for RecordingClock {
    fn now(&self) -> u64 {
        let t = self.0.now();
        LAST_READING.with(|c| c.set(t));
        t
    }
}

#[test]
fn sliding_log_is_exact_under_real_threads() {
    let threads = 2 * thread::available_parallelism().map_or(2, |n| n.get());
    let (limit, window) = (50u64, 2_000_000u64);
    let q = Quota::try_new(limit, Duration::from_nanos(window), 1).unwrap();
    let log =
        SlidingWindowLog::with_clock(q, RecordingClock(atomic_limiter::StdClock::new())).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_millis(400);
    let mut times: Vec<u64> = thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = vec![];
                    for _ in 0..2_000_000 {
                        if std::time::Instant::now() > deadline {
                            break;
                        }
                        if log.check().is_allowed() {
                            mine.push(LAST_READING.with(|c| c.get()));
                        }
                    }
                    mine
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    times.sort_unstable();
    assert!(
        times.len() as u64 > 2 * limit,
        "too few admissions to judge"
    );
    // Any limit + 1 admissions span at least one window.
    for w in times.windows(limit as usize + 1) {
        assert!(
            w[limit as usize] - w[0] >= window,
            "{} admissions within {} ns",
            limit + 1,
            w[limit as usize] - w[0]
        );
    }
}
