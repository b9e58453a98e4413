//! UTC calendar arithmetic for the calendar windows: which minute, hour, day, ISO week, month or
//! year an instant falls in, and when that period ends. Proleptic Gregorian, no leap seconds (as
//! Unix time counts), no time zones.
//!
//! Instants are nanoseconds since 1970-01-01T00:00:00Z, so years run from 1970 to 2554; the
//! arithmetic is on whole days, and each function is a few divisions with no table larger than
//! the months'.

/// Nanoseconds in a minute, an hour and a day.
pub(crate) const MINUTE_NS: u64 = 60_000_000_000;
pub(crate) const HOUR_NS: u64 = 60 * MINUTE_NS;
pub(crate) const DAY_NS: u64 = 24 * HOUR_NS;

/// Days before the first of each month, in a common year.
const BEFORE_MONTH: [u64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];

/// Whether `year` has a 29th of February.
pub(crate) const fn is_leap(year: u64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

/// Leap years in `[1, year]`.
const fn leaps_through(year: u64) -> u64 {
    year / 4 - year / 100 + year / 400
}

/// Days from 1970-01-01 to the first of January of `year` (at least 1970).
pub(crate) const fn days_before_year(year: u64) -> u64 {
    365 * (year - 1970) + leaps_through(year - 1) - leaps_through(1969)
}

/// Days from the first of January to the first of `month` (1 to 12) of a year.
pub(crate) const fn days_before_month(month: u64, leap: bool) -> u64 {
    BEFORE_MONTH[(month - 1) as usize] + (leap && month > 2) as u64
}

/// The year and month (1 to 12) of the day `days` after 1970-01-01.
pub(crate) const fn year_month(days: u64) -> (u64, u64) {
    // A year has at most 366 days: this guess is never past the true year, and falls short by
    // one year in 366 elapsed, a few steps at most.
    let mut year = 1970 + days / 366;
    while days_before_year(year + 1) <= days {
        year += 1;
    }
    let into = days - days_before_year(year);
    let leap = is_leap(year);
    let mut month = 12;
    while days_before_month(month, leap) > into {
        month -= 1;
    }
    (year, month)
}

/// A calendar period a window spans, in UTC.
///
/// # Examples
///
/// ```
/// use atomic_limiter::{Calendar, CalendarWindow, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// clock.set(1_796_256_000_000_000_000); // Thursday 2026-12-03T00:00:00Z
/// let weekly = CalendarWindow::with_clock(100, Calendar::Week, clock);
/// // The ISO week ends on Monday the 7th.
/// assert_eq!(weekly.check().reset_after(), Duration::from_secs(4 * 86_400));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Calendar {
    /// From second 0 of each minute.
    Minute,
    /// From the top of each hour.
    Hour,
    /// From midnight UTC.
    Day,
    /// From Monday midnight UTC, as ISO 8601 weeks begin.
    Week,
    /// From midnight UTC on the first of each month.
    Month,
    /// From midnight UTC on the first of January.
    Year,
}

impl Calendar {
    /// The period holding the instant `now_ns`: its index (periods since the one holding the
    /// epoch) and the instant it ends, in ns (saturating at `u64::MAX` past 2554).
    pub(crate) fn window(self, now_ns: u64) -> (u64, u64) {
        let end_day = |day: u64| day.saturating_mul(DAY_NS);
        let fixed = |len: u64| {
            let index = now_ns / len;
            (index, (index + 1).saturating_mul(len))
        };
        match self {
            Calendar::Minute => fixed(MINUTE_NS),
            Calendar::Hour => fixed(HOUR_NS),
            Calendar::Day => fixed(DAY_NS),
            Calendar::Week => {
                // 1970-01-01 was a Thursday: day `d` is in the week of Monday `d + 3 - (d + 3) % 7
                // - 3`, so weeks counted from Monday 1969-12-29 are `(d + 3) / 7`.
                let index = (now_ns / DAY_NS + 3) / 7;
                (index, end_day(index * 7 + 4))
            }
            Calendar::Month => {
                let (year, month) = year_month(now_ns / DAY_NS);
                let index = (year - 1970) * 12 + month - 1;
                let end = if month == 12 {
                    days_before_year(year + 1)
                } else {
                    days_before_year(year) + days_before_month(month + 1, is_leap(year))
                };
                (index, end_day(end))
            }
            Calendar::Year => {
                let (year, _) = year_month(now_ns / DAY_NS);
                (year - 1970, end_day(days_before_year(year + 1)))
            }
        }
    }

    /// The script's code for the period (`calendar.lua`).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) const fn code(self) -> u64 {
        match self {
            Calendar::Minute => 0,
            Calendar::Hour => 1,
            Calendar::Day => 2,
            Calendar::Week => 3,
            Calendar::Month => 4,
            Calendar::Year => 5,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nanoseconds at midnight UTC of a date, from the day count alone.
    fn at(year: u64, month: u64, day: u64) -> u64 {
        (days_before_year(year) + days_before_month(month, is_leap(year)) + day - 1) * DAY_NS
    }

    #[test]
    fn months_end_on_the_first_of_the_next_in_leap_and_common_years() {
        let month_end = |t: u64| Calendar::Month.window(t).1;
        // February of a leap year ends on the 1st of March, after its 29th.
        assert_eq!(month_end(at(2024, 2, 29) + HOUR_NS), at(2024, 3, 1));
        assert_eq!(month_end(at(2023, 2, 28) + HOUR_NS), at(2023, 3, 1));
        // 2100 is no leap year, 2000 was.
        assert!(!is_leap(2100) && is_leap(2000) && is_leap(2024) && !is_leap(2023));
        assert_eq!(month_end(at(2100, 2, 28)), at(2100, 3, 1));
        // The last nanosecond of a 31-day month is in it; the next is in the next month.
        let jan_end = at(2026, 2, 1);
        assert_eq!(month_end(jan_end - 1), jan_end);
        assert_eq!(
            Calendar::Month.window(jan_end - 1).0 + 1,
            Calendar::Month.window(jan_end).0
        );
        // December rolls into January.
        assert_eq!(month_end(at(2026, 12, 31) + 5), at(2027, 1, 1));
        // The epoch's month is index 0; December 2026 is 56 years and 11 months on.
        assert_eq!(Calendar::Month.window(0).0, 0);
        assert_eq!(Calendar::Month.window(at(2026, 12, 3)).0, 56 * 12 + 11);
    }

    #[test]
    fn iso_weeks_begin_on_monday() {
        // 2026-12-03 is a Thursday: its week began on Monday the 30th of November and ends on
        // Monday the 7th of December.
        let (index, end) = Calendar::Week.window(at(2026, 12, 3) + 15 * HOUR_NS);
        assert_eq!(end, at(2026, 12, 7));
        assert_eq!(Calendar::Week.window(at(2026, 11, 30)).0, index);
        assert_eq!(Calendar::Week.window(at(2026, 11, 30) - 1).0, index - 1);
        // The epoch's Thursday is in week 0, which ends on Monday 1970-01-05.
        assert_eq!(Calendar::Week.window(0), (0, at(1970, 1, 5)));
    }

    #[test]
    fn fixed_periods_end_on_their_boundaries() {
        let t = at(2026, 12, 3) + 13 * HOUR_NS + 7 * MINUTE_NS + 42;
        assert_eq!(
            Calendar::Minute.window(t).1,
            at(2026, 12, 3) + 13 * HOUR_NS + 8 * MINUTE_NS
        );
        assert_eq!(Calendar::Hour.window(t).1, at(2026, 12, 3) + 14 * HOUR_NS);
        assert_eq!(Calendar::Day.window(t).1, at(2026, 12, 4));
        assert_eq!(Calendar::Year.window(t), (56, at(2027, 1, 1)));
        // The end of time saturates rather than wraps.
        assert_eq!(Calendar::Year.window(u64::MAX).1, u64::MAX);
    }
}
