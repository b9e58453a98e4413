use std::sync::OnceLock;
use std::time::Duration;

use crate::clock::Clock;
use crate::sync::{Ordering, StaticAtomicU64};

/// How often the upkeep thread refreshes the coarse time, and so [`CoarseClock`]'s resolution.
const UPKEEP_INTERVAL: Duration = Duration::from_millis(1);

/// The coarse time: nanoseconds since [`Source::origin`] as of the upkeep thread's last pass.
static RECENT: StaticAtomicU64 = StaticAtomicU64::new(0);

/// The precise clock behind the coarse time, made once per process with the upkeep thread, or
/// `None` if that thread could not be started.
static SOURCE: OnceLock<Option<Source>> = OnceLock::new();

/// One calibration of the TSC, shared (copied) by the upkeep thread and every `CoarseClock`, so
/// that a coarse reading is an earlier value of the same function as a precise one: never ahead of
/// it.
#[derive(Debug, Clone)]
struct Source {
    clock: quanta::Clock,
    origin: u64,
}

impl Source {
    #[inline]
    fn now(&self) -> u64 {
        self.clock.delta_as_nanos(self.origin, self.clock.raw())
    }

    /// Starts the upkeep thread: `None` if the system refused it.
    fn start() -> Option<Source> {
        let clock = quanta::Clock::new();
        let source = Source {
            origin: clock.raw(),
            clock,
        };
        // Relaxed: a time, read on its own; no other memory is published with it.
        RECENT.store(source.now(), Ordering::Relaxed);
        let upkeep = source.clone();
        std::thread::Builder::new()
            .name("atomic-limiter-coarse-clock".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(UPKEEP_INTERVAL);
                    // Relaxed: as above. The only writer, so the time never steps back.
                    RECENT.store(upkeep.now(), Ordering::Relaxed);
                }
            })
            .ok()?;
        Some(source)
    }
}

/// A coarse time: one load of a global that an upkeep thread refreshes every millisecond.
///
/// The cheapest clock there is, at the price of resolution: readings advance in steps of about
/// 1 ms (the upkeep interval, [`Clock::resolution`]), and trail real time by one step, or by more
/// when the upkeep thread is held off the CPU (on a loaded machine, several steps). Limiters stay
/// correct (a late reading only delays refills); a denial is checked once more on a precise
/// reading ([`Clock::now_fresh`], the TSC through quanta) before it is answered, and its
/// retry-after is rounded up to whole steps plus one, so waiting it is always enough. Admissions
/// cost one load, inlined (no call, no conversion); only denials pay for the precise reading.
///
/// The first `CoarseClock::new` in a process starts the upkeep thread
/// (`atomic-limiter-coarse-clock`), which then runs for the life of the process. Should the system
/// refuse the thread, every `CoarseClock` reads the precise time instead.
#[derive(Debug, Clone)]
pub struct CoarseClock {
    source: Source,
    /// The coarse time when this clock was made: its readings count from there.
    origin: u64,
    /// No upkeep thread: every reading is precise.
    precise: bool,
}

impl CoarseClock {
    /// A clock whose origin is now, starting the upkeep thread if it is not running.
    pub fn new() -> CoarseClock {
        match SOURCE.get_or_init(Source::start) {
            Some(source) => CoarseClock {
                source: source.clone(),
                // Relaxed: a time, as above.
                origin: RECENT.load(Ordering::Relaxed),
                precise: false,
            },
            None => CoarseClock::precise(),
        }
    }

    /// Without an upkeep thread: a clock that reads the precise time, from its own origin.
    fn precise() -> CoarseClock {
        let clock = quanta::Clock::new();
        CoarseClock {
            source: Source {
                origin: clock.raw(),
                clock,
            },
            origin: 0,
            precise: true,
        }
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
        if self.precise {
            return self.now_fresh();
        }
        // Relaxed: a time, read on its own.
        RECENT.load(Ordering::Relaxed).saturating_sub(self.origin)
    }

    #[inline]
    fn resolution(&self) -> u64 {
        if self.precise {
            1
        } else {
            UPKEEP_INTERVAL.as_nanos() as u64
        }
    }

    /// Both the coarse time and the precise one come from one monotonic source.
    #[inline]
    fn is_monotonic(&self) -> bool {
        true
    }

    #[inline]
    fn now_fresh(&self) -> u64 {
        self.source.now().saturating_sub(self.origin)
    }
}

#[cfg(all(test, not(atomic_limiter_loom), not(miri)))]
mod tests {
    use super::*;

    /// Where the system refused the upkeep thread, the clock reads the precise time: it advances
    /// between two readings a millisecond apart, at a resolution of 1 ns.
    #[test]
    fn without_an_upkeep_thread_the_clock_reads_precise_time() {
        let clock = CoarseClock::precise();
        let first = clock.now();
        std::thread::sleep(Duration::from_millis(2));
        let second = clock.now();
        assert!(second >= first + 1_000_000, "{first} then {second} ns");
        assert!(clock.now() <= clock.now_fresh());
        assert_eq!(clock.resolution(), 1);
    }
}
