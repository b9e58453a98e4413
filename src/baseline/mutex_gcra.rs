use crate::clock::DefaultClockOrNone;
use std::sync::Mutex;

use crate::baseline::BaselineLock;
use crate::clock::Clock;
#[cfg(feature = "quanta")]
use crate::clock::DefaultClock;
use crate::decision::Decision;
use crate::gcra::math::{self, GcraParams, Outcome};
use crate::quota::Quota;
use crate::rate_limiter::{InsufficientCapacity, RateLimiter};

/// [`Gcra`](crate::Gcra)'s exact maths behind a lock: the same decisions, with a mutex where the
/// CAS was. For benchmarks and differential tests.
///
/// # Examples
///
/// It agrees with the lock-free limiter:
///
/// ```
/// use atomic_limiter::baseline::MutexGcra;
/// use atomic_limiter::{Gcra, ManualClock, Quota, RateLimiter};
///
/// let clock = ManualClock::new();
/// let locked: MutexGcra<_> = MutexGcra::with_clock(Quota::per_second(5), clock.clone());
/// let free = Gcra::with_clock(Quota::per_second(5), clock.clone());
/// for _ in 0..7 {
///     assert_eq!(locked.check(), free.check());
/// }
/// ```
#[derive(Debug)]
pub struct MutexGcra<C = DefaultClockOrNone, L = Mutex<u64>> {
    tat: L,
    params: GcraParams,
    quota: Quota,
    clock: C,
}

#[cfg(feature = "quanta")]
impl<L: BaselineLock<u64>> MutexGcra<DefaultClock, L> {
    /// A full limiter on the default clock.
    pub fn new(quota: Quota) -> MutexGcra<DefaultClock, L> {
        MutexGcra::with_clock(quota, DefaultClock::new())
    }
}

impl<C: Clock, L: BaselineLock<u64>> MutexGcra<C, L> {
    /// A full limiter on `clock`.
    pub fn with_clock(quota: Quota, clock: C) -> MutexGcra<C, L> {
        let params = GcraParams::new(&quota);
        MutexGcra {
            tat: L::new(params.units(clock.now())),
            params,
            quota,
            clock,
        }
    }

    fn run(&self, n: u32) -> Decision {
        let now = self.params.units(self.clock.now());
        let (allowed, after, wait) =
            self.tat
                .with(|tat| match math::decide(*tat, now, n, &self.params) {
                    Outcome::Allow { tat: new, after } => {
                        if n > 0 {
                            *tat = new;
                        }
                        (true, after, 0)
                    }
                    Outcome::Deny { after, wait } => (false, after, wait),
                });
        self.params
            .decision(allowed, after, wait, self.clock.resolution())
    }
}

impl<C: Clock, L: BaselineLock<u64>> RateLimiter for MutexGcra<C, L> {
    fn check(&self) -> Decision {
        self.run(1)
    }

    fn check_n(&self, n: u32) -> Result<Decision, InsufficientCapacity> {
        InsufficientCapacity::check(n, self.params.burst)?;
        Ok(self.run(n))
    }

    fn quota(&self) -> &Quota {
        &self.quota
    }
}
