//! Where limiters get the time: a [`Clock`] returns monotonic nanoseconds as a `u64`.
//!
//! | clock | source | cost | resolution |
//! |---|---|---|---|
//! | [`QuantaClock`] (default) | TSC through `quanta` | a `rdtsc` and a multiply | 1 ns |
//! | [`CoarseClock`] | a time the crate's upkeep thread refreshes from `quanta`'s precise one | one load | the upkeep interval (1 ms) |
//! | [`StdClock`] | `std::time::Instant` | a vDSO `clock_gettime` | 1 ns |
//! | [`ManualClock`] | an atomic the test moves | one load | 1 ns |
//!
//! A denial made on a coarse reading is checked once more on a fresh one ([`Clock::now_fresh`]),
//! so a coarse clock whose upkeep falls behind under load never advertises a wait that is too
//! short.
//!
//! Limiters never trust a clock to be monotonic: a reading that stalls or steps backwards is
//! treated as "no time has passed" and never grants a token (see `docs/design.md`).

mod manual_clock;
pub use manual_clock::ManualClock;

#[cfg(feature = "std")]
mod std_clock;
#[cfg(feature = "std")]
pub use std_clock::StdClock;

#[cfg(feature = "std")]
mod utc_clock;
#[cfg(feature = "std")]
pub use utc_clock::UtcClock;

#[cfg(feature = "quanta")]
mod quanta_clock;
#[cfg(feature = "quanta")]
pub use quanta_clock::QuantaClock;

#[cfg(feature = "quanta")]
mod coarse_clock;
#[cfg(feature = "quanta")]
pub use coarse_clock::CoarseClock;

/// A source of monotonic time in nanoseconds.
///
/// `now` is read once per check, so it must be cheap and must not block, allocate or panic. Values
/// are nanoseconds from an origin of the clock's choosing; only differences matter.
pub trait Clock {
    /// The current time in nanoseconds.
    fn now(&self) -> u64;

    /// The step, in nanoseconds, in which `now` advances. Waits reported to callers are rounded
    /// up to it so that waiting the advertised time is always enough. Defaults to 1.
    #[inline]
    fn resolution(&self) -> u64 {
        1
    }

    /// Whether readings never go back: a reading taken after another, in any thread, is not
    /// smaller (up to differences between cores below a millisecond). The token bucket then
    /// reads a reading far behind its stamp as stale or as a long idle, and settles which with a
    /// fresh reading, instead of as a clock that stepped back (see
    /// [`TokenBucket::idle_horizon`](crate::TokenBucket::idle_horizon)). Defaults to `false`:
    /// a clock that may step back is read as one.
    #[inline]
    fn is_monotonic(&self) -> bool {
        false
    }

    /// A reading as fresh as the clock can give. A clock coarser than 1 ns may lag real time by
    /// more than its resolution (an upkeep thread held off the CPU); the limiters check a denial
    /// made on such a clock once more on this reading before answering, so that the retry-after
    /// they advertise is measured from real time. Defaults to [`Clock::now`].
    #[inline]
    fn now_fresh(&self) -> u64 {
        self.now()
    }
}

/// Whether denials made on `clock` are confirmed on [`Clock::now_fresh`]: a constant per clock
/// type, so the check compiles away for nanosecond clocks.
#[inline]
pub(crate) fn is_coarse<C: Clock + ?Sized>(clock: &C) -> bool {
    clock.resolution() > 1
}

/// How far a clock reading can be trusted (the token bucket's stamp is the one state that asks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// A clock that may step back.
    Any,
    /// A monotonic clock, read before the word was loaded (so possibly stale).
    Monotonic,
    /// A monotonic clock, read after the word was loaded.
    Fresh,
}

impl Reading {
    /// How a reading of `clock` is trusted; `fresh` when it was taken after the word was loaded.
    #[inline]
    pub(crate) fn of<C: Clock + ?Sized>(clock: &C, fresh: bool) -> Reading {
        match (clock.is_monotonic(), fresh) {
            (false, _) => Reading::Any,
            (true, false) => Reading::Monotonic,
            (true, true) => Reading::Fresh,
        }
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    #[inline]
    fn now(&self) -> u64 {
        (**self).now()
    }
    #[inline]
    fn resolution(&self) -> u64 {
        (**self).resolution()
    }
    #[inline]
    fn now_fresh(&self) -> u64 {
        (**self).now_fresh()
    }
    #[inline]
    fn is_monotonic(&self) -> bool {
        (**self).is_monotonic()
    }
}

/// The clock a limiter uses when none is given: [`QuantaClock`] with the `quanta` feature,
/// otherwise there is no default and limiters are built with `with_clock`.
#[cfg(feature = "quanta")]
pub type DefaultClock = QuantaClock;

/// Every limiter's default clock type parameter: [`DefaultClock`] where there is one, else
/// [`ManualClock`] (whose limiters are then built with `with_clock`, as without a default).
#[cfg(feature = "quanta")]
pub(crate) type DefaultClockOrNone = DefaultClock;
#[cfg(not(feature = "quanta"))]
pub(crate) type DefaultClockOrNone = ManualClock;
