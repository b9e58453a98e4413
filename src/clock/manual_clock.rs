use core::time::Duration;

use crate::clock::Clock;
use crate::sync::{Arc, AtomicU64, Ordering};

/// A clock that moves only when told to: for tests, simulations and model checks.
///
/// It starts at 0; clones share one time, so a test keeps a clone and moves the time of the
/// limiter it gave the other. It is built on the crate's private atomics, so under loom its
/// advances are interleaved with the checks like any other atomic step.
///
/// Arithmetic saturates: advancing past `u64::MAX` ns stays at `u64::MAX`, and stepping back past
/// 0 stays at 0. Stepping back is allowed on purpose, to test how limiters treat clocks that do.
///
/// # Examples
///
/// Moving time by hand:
///
/// ```
/// use atomic_limiter::{Clock, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let shared = clock.clone();
/// clock.advance(Duration::from_millis(5));
/// assert_eq!(shared.now(), 5_000_000);
/// shared.rewind(Duration::from_millis(1));
/// assert_eq!(clock.now(), 4_000_000);
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at 0 ns.
    pub fn new() -> ManualClock {
        ManualClock::starting_at(0)
    }

    /// A clock at `nanos`.
    pub fn starting_at(nanos: u64) -> ManualClock {
        ManualClock {
            nanos: Arc::new(AtomicU64::new(nanos)),
        }
    }

    /// Moves the time forward by `by`, saturating at `u64::MAX` ns.
    pub fn advance(&self, by: Duration) {
        self.advance_nanos(u64::try_from(by.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Moves the time forward by `by` nanoseconds, saturating at `u64::MAX`.
    pub fn advance_nanos(&self, by: u64) {
        // Relaxed: the clock is one location; any reader ordered after this store (by program order
        // or by the caller's own synchronisation) sees it by coherence, and nothing else is published.
        let _ = self
            .nanos
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_add(by))
            });
    }

    /// Moves the time backwards by `by`, saturating at 0: a clock that steps back.
    pub fn rewind(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        // Relaxed: as in `advance_nanos`.
        let _ = self
            .nanos
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_sub(by))
            });
    }

    /// Sets the time to `nanos`, forwards or backwards.
    pub fn set(&self, nanos: u64) {
        // Relaxed: as in `advance_nanos`.
        self.nanos.store(nanos, Ordering::Relaxed);
    }
}

impl Default for ManualClock {
    fn default() -> ManualClock {
        ManualClock::new()
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> u64 {
        // Relaxed: a single location read; see `advance_nanos`.
        self.nanos.load(Ordering::Relaxed)
    }
}
