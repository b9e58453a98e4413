//! Models 7 and 20, on the window limiters' packed counters.
#![cfg(atomic_limiter_loom)]

use atomic_limiter::{Decision, ManualClock, Quota, RateLimiter, loom_api};
use loom::sync::Arc;
use loom::thread;

/// Model 7: the window limiters' packed counters. Limit 2 per window, frozen clock, three threads
/// asking for one each: exactly 2 are admitted in every interleaving, for the fixed window and the
/// sliding window counter. The broken twins update the word with a load and a store.
use atomic_limiter::{FixedWindow, SlidingWindowCounter};

fn admits_exactly_the_limit<L: RateLimiter + Send + Sync + 'static>(
    make: fn(ManualClock) -> L,
    check: fn(&L) -> Decision,
) {
    loom::model(move || {
        let limiter = Arc::new(make(ManualClock::new()));
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let limiter = limiter.clone();
                thread::spawn(move || u32::from(check(&limiter).is_allowed()))
            })
            .collect();
        let admitted: u32 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(admitted, 2, "admitted in one window of limit 2");
    });
}

fn fixed(clock: ManualClock) -> FixedWindow<ManualClock> {
    FixedWindow::with_clock(Quota::per_second(2), clock).unwrap()
}

fn sliding(clock: ManualClock) -> SlidingWindowCounter<ManualClock> {
    SlidingWindowCounter::with_clock(Quota::per_second(2), clock).unwrap()
}

#[test]
fn model_7_fixed_window_admits_exactly_the_limit() {
    admits_exactly_the_limit(fixed, |l| l.check());
}

#[test]
#[should_panic(expected = "admitted in one window of limit 2")]
fn model_7_fixed_window_broken_twin_is_caught() {
    admits_exactly_the_limit(fixed, |l| loom_api::broken_check_n(l, 1));
}

#[test]
fn model_7_sliding_counter_admits_exactly_the_limit() {
    admits_exactly_the_limit(sliding, |l| l.check());
}

#[test]
#[should_panic(expected = "admitted in one window of limit 2")]
fn model_7_sliding_counter_broken_twin_is_caught() {
    admits_exactly_the_limit(sliding, |l| loom_api::broken_check_n(l, 1));
}

/// Model 20: `CalendarWindow`, limit 2 per UTC month, frozen clock on the last nanosecond of
/// February 2024, three threads asking for one each: exactly 2 admitted. The broken twin counts
/// with a load and a store, and admits 3.
fn calendar_admits_exactly_the_limit(broken: bool) {
    use atomic_limiter::{Calendar, CalendarWindow};
    loom::model(move || {
        let clock = ManualClock::new();
        clock.set(1_709_251_199_999_999_999);
        let window = Arc::new(CalendarWindow::with_clock(2, Calendar::Month, clock));
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let window = window.clone();
                thread::spawn(move || {
                    let admitted = if broken {
                        loom_api::calendar_broken_check(&window)
                    } else {
                        window.check().is_allowed()
                    };
                    u32::from(admitted)
                })
            })
            .collect();
        let admitted: u32 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(admitted, 2, "admitted in one month of limit 2");
    });
}

#[test]
fn model_20_calendar_window_admits_exactly_the_limit() {
    calendar_admits_exactly_the_limit(false);
}

#[test]
#[should_panic(expected = "admitted in one month of limit 2")]
fn model_20_broken_twin_is_caught() {
    calendar_admits_exactly_the_limit(true);
}
