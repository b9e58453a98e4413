//! Calendar windows against the `time` crate's calendar: every period's boundary over instants
//! from 1970 to 2262, and a calendar window's decisions against a model that counts per period
//! as `time` names it.

use std::collections::HashMap;
use std::time::Duration;

use atomic_limiter::{Calendar, CalendarWindow, ManualClock};
use proptest::prelude::*;
use time::{Date, Month, OffsetDateTime, Time};

/// The period holding `t` (ns since the epoch) as `time` tells it: a name, and its end in ns.
fn reference(period: Calendar, t: u64) -> (String, u64) {
    let at = OffsetDateTime::from_unix_timestamp_nanos(i128::from(t)).unwrap();
    let date = at.date();
    let midnight = |d: Date| d.with_time(Time::MIDNIGHT).assume_utc();
    let (name, end) = match period {
        Calendar::Minute => {
            let start = at.replace_nanosecond(0).unwrap().replace_second(0).unwrap();
            (format!("{start}"), start + time::Duration::MINUTE)
        }
        Calendar::Hour => {
            let start = at.replace_time(Time::from_hms(at.hour(), 0, 0).unwrap());
            (format!("{start}"), start + time::Duration::HOUR)
        }
        Calendar::Day => (format!("{date}"), midnight(date.next_day().unwrap())),
        Calendar::Week => {
            let back = i64::from(date.weekday().number_days_from_monday());
            let monday = date - time::Duration::days(back);
            (
                format!("{monday}"),
                midnight(monday + time::Duration::days(7)),
            )
        }
        Calendar::Month => {
            let (y, m) = (date.year(), date.month());
            let next = if m == Month::December {
                Date::from_calendar_date(y + 1, Month::January, 1)
            } else {
                Date::from_calendar_date(y, m.next(), 1)
            };
            (format!("{y}-{m}"), midnight(next.unwrap()))
        }
        Calendar::Year => {
            let y = date.year();
            (
                format!("{y}"),
                midnight(Date::from_calendar_date(y + 1, Month::January, 1).unwrap()),
            )
        }
        _ => unreachable!("a period the test does not know"),
    };
    (name, u64::try_from(end.unix_timestamp_nanos()).unwrap())
}

fn period() -> impl Strategy<Value = Calendar> {
    prop_oneof![
        Just(Calendar::Minute),
        Just(Calendar::Hour),
        Just(Calendar::Day),
        Just(Calendar::Week),
        Just(Calendar::Month),
        Just(Calendar::Year),
    ]
}

/// Instants up to 2262 (what `time` and an i64 of ns both hold), near boundaries as often as not,
/// and in the century years whose leap rule is the exception (2000 is leap; 2100 and 2200 are not).
fn instant() -> impl Strategy<Value = u64> {
    let century = (
        prop_oneof![Just(2000), Just(2100), Just(2200)],
        0u64..366 * 86_400_000_000_000,
    )
        .prop_map(|(year, into)| {
            let start = Date::from_calendar_date(year, Month::January, 1).unwrap();
            let start = start
                .with_time(Time::MIDNIGHT)
                .assume_utc()
                .unix_timestamp_nanos();
            u64::try_from(start).unwrap() + into
        });
    prop_oneof![
        century,
        0u64..(i64::MAX as u64),
        // Within a second of a midnight: where days, weeks, months and years turn.
        (0u64..106_000, 0u64..2_000_000_000).prop_map(|(day, ns)| {
            (day * 86_400_000_000_000 + ns).saturating_sub(1_000_000_000)
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(512),
        ..ProptestConfig::default()
    })]

    /// A check's `reset_after` runs to the end of the period `time` names, for every period.
    #[test]
    fn each_period_ends_where_the_calendar_says(p in period(), t in instant()) {
        let clock = ManualClock::new();
        clock.set(t);
        let window = CalendarWindow::with_clock(3, p, clock);
        let d = window.check();
        let (_, end) = reference(p, t);
        prop_assert_eq!(d.reset_after(), Duration::from_nanos(end - t), "{:?} at {}", p, t);
    }

    /// Random advances and requests: every decision is the model's, which counts per period as
    /// `time` names it (a clock that only moves forward).
    #[test]
    fn a_calendar_window_counts_per_calendar_period(
        p in period(),
        start in 0u64..4_000_000_000_000_000_000,
        steps in prop::collection::vec((0u64..4_000_000_000_000_000, 0u32..6, 0u8..4), 1..80),
    ) {
        let clock = ManualClock::new();
        let limit = 7;
        let window = CalendarWindow::with_clock(limit, p, clock.clone());
        let mut counts: HashMap<String, u32> = HashMap::new();
        let mut t = start;
        for &(advance, n, scale) in &steps {
            // Advances from nanoseconds to weeks.
            t += advance >> (scale * 12);
            clock.set(t);
            let d = window.check_n(n).unwrap();
            let (name, end) = reference(p, t);
            let count = counts.entry(name).or_default();
            let allowed = *count + n <= limit;
            if allowed {
                *count += n;
            }
            prop_assert_eq!(d.is_allowed(), allowed, "{:?} at {}", p, t);
            prop_assert_eq!(d.remaining(), u64::from(limit - *count));
            let wait = if allowed { Duration::ZERO } else { Duration::from_nanos(end - t) };
            prop_assert_eq!(d.retry_after(), wait);
        }
    }
}

/// A clock stepped back into an earlier period keeps the later one and its count: a period that
/// ended is never reopened.
#[test]
fn a_clock_stepped_back_reopens_no_period() {
    let clock = ManualClock::new();
    let feb_29_2024 = 1_709_164_800_000_000_000; // midnight UTC
    let mar_1 = feb_29_2024 + 86_400_000_000_000;
    clock.set(mar_1);
    let window = CalendarWindow::with_clock(2, Calendar::Month, clock.clone());
    assert!(window.check_n(2).unwrap().is_allowed());
    // Back into February (a failover to a host whose clock trails): March's count stands.
    clock.set(mar_1 - 1);
    assert!(window.check().is_denied());
}
