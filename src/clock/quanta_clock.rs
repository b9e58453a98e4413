use crate::clock::Clock;

/// The default clock: the CPU's time-stamp counter through [`quanta`], in nanoseconds since the
/// clock was made.
///
/// A reading is one `rdtsc` plus a multiply and shift to scale it (quanta calibrates the TSC
/// against the OS clock once per process). Where the TSC is unusable quanta falls back to the OS
/// monotonic clock by itself. quanta returns 0 for a raw reading below the origin (a TSC a few
/// cycles behind on another core), so a reading never underflows; the limiters treat it as a stall.
#[derive(Debug, Clone)]
pub struct QuantaClock {
    clock: quanta::Clock,
    origin: u64,
}

impl QuantaClock {
    /// A clock whose origin is now.
    pub fn new() -> QuantaClock {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        QuantaClock { clock, origin }
    }
}

impl Default for QuantaClock {
    fn default() -> QuantaClock {
        QuantaClock::new()
    }
}

impl Clock for QuantaClock {
    #[inline]
    fn now(&self) -> u64 {
        self.clock.delta_as_nanos(self.origin, self.clock.raw())
    }

    /// quanta reads the TSC only where it finds it stable, and the OS monotonic clock otherwise.
    #[inline]
    fn is_monotonic(&self) -> bool {
        true
    }
}
