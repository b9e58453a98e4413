use std::sync::OnceLock;
use std::time::Duration;

use crate::clock::Clock;

/// How often the upkeep thread refreshes the coarse time, and so [`CoarseClock`]'s resolution.
const UPKEEP_INTERVAL: Duration = Duration::from_millis(1);

static UPKEEP: OnceLock<Option<quanta::Handle>> = OnceLock::new();

/// quanta's "recent" time: one load of a global that an upkeep thread refreshes every millisecond.
///
/// The cheapest clock there is, at the price of resolution: readings advance in steps of about
/// 1 ms (the upkeep interval, [`Clock::resolution`]), and trail real time by one step, or by more
/// when the upkeep thread is held off the CPU (on a loaded machine, several steps). Limiters stay
/// correct (a late reading only delays refills); a denial is checked once more on a precise
/// reading ([`Clock::now_fresh`], the TSC) before it is answered, and its retry-after is rounded
/// up to whole steps plus one, so waiting it is always enough. Admissions cost one load; only
/// denials pay for the precise reading.
///
/// The first `CoarseClock::new` in a process starts quanta's upkeep thread, which then runs for the
/// life of the process. If another part of the program already runs quanta's upkeep, that one is
/// used as it is.
#[derive(Debug, Clone)]
pub struct CoarseClock {
    clock: quanta::Clock,
    origin: quanta::Instant,
}

impl CoarseClock {
    /// A clock whose origin is now, starting the upkeep thread if it is not running.
    pub fn new() -> CoarseClock {
        // The handle is kept for the life of the process: dropping it would stop the thread.
        // Starting fails only when an upkeep thread already runs, which serves as well.
        UPKEEP.get_or_init(|| quanta::Upkeep::new(UPKEEP_INTERVAL).start().ok());
        let clock = quanta::Clock::new();
        let origin = clock.now();
        CoarseClock { clock, origin }
    }
}

impl Default for CoarseClock {
    fn default() -> CoarseClock {
        CoarseClock::new()
    }
}

impl Clock for CoarseClock {
    #[inline]
    fn now(&self) -> u64 {
        let d = self.clock.recent().saturating_duration_since(self.origin);
        u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
    }

    #[inline]
    fn resolution(&self) -> u64 {
        UPKEEP_INTERVAL.as_nanos() as u64
    }

    /// Both the recent time and the precise one come from one monotonic source.
    #[inline]
    fn is_monotonic(&self) -> bool {
        true
    }

    #[inline]
    fn now_fresh(&self) -> u64 {
        let d = self.clock.now().saturating_duration_since(self.origin);
        u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
    }
}
