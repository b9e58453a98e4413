use alloc::boxed::Box;
use std::sync::{Mutex, PoisonError};

use crate::clock::Clock;
#[cfg(feature = "quanta")]
use crate::clock::DefaultClock;
use crate::clock::{DefaultClockOrNone, is_coarse};
use crate::decision::Decision;
use crate::decision::{Detail, count32};
use crate::quota::InsufficientCapacity;
use crate::quota::{Quota, QuotaError};
use crate::rate_limiter::RateLimiter;
use crate::sync::{AtomicBool, Ordering};

/// Exact: at most `limit` admissions in **any** span of the window's length. A ring buffer of the
/// last `limit` admission times behind a mutex.
///
/// This is the one limiter here that locks, on purpose. A lock-free ring would need the claim of a
/// slot (a CAS on the head) and the write of its timestamp to be one step: between the two, a
/// thread `limit` admissions later reads the slot's old timestamp and admits on it, over the limit.
/// Packing a sequence number and a timestamp into one 64-bit slot leaves too few bits for either
/// over the ranges this crate promises. So the log is exact and locks; when a bound of
/// `2 × limit - 1` per span is acceptable, [`SlidingWindowCounter`](crate::SlidingWindowCounter)
/// is lock-free and 8 bytes. Memory: 8 bytes per unit of limit (at most 2^20).
///
/// # Examples
///
/// Three per second, in any second:
///
/// ```
/// use atomic_limiter::{ManualClock, Quota, SlidingWindowLog};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let log = SlidingWindowLog::with_clock(Quota::per_second(3), clock.clone()).unwrap();
/// assert!(log.check().is_allowed()); // t = 0
/// clock.advance(Duration::from_millis(600));
/// assert!(log.check_n(2).unwrap().is_allowed()); // t = 600 ms
/// let d = log.check();
/// assert!(d.is_denied());
/// assert_eq!(d.retry_after(), Duration::from_millis(400)); // when the first one is a second old
/// ```
#[derive(Debug)]
pub struct SlidingWindowLog<C = DefaultClockOrNone> {
    ring: Mutex<Ring>,
    limit: u64,
    window: u64,
    quota: Quota,
    clock: C,
}

/// The admission times still inside the window, oldest first, in a fixed ring.
#[derive(Debug)]
struct Ring {
    times: Box<[u64]>,
    /// Index of the oldest entry.
    head: usize,
    len: usize,
    /// The latest reading any check has decided at: the ring's notion of now, which never goes
    /// back, so the times stay in order.
    latest: u64,
}

impl Ring {
    fn at(&self, i: usize) -> u64 {
        self.times[(self.head + i) % self.times.len()]
    }
}

impl SlidingWindowLog<()> {
    /// The largest limit: the ring holds one `u64` per unit of limit.
    pub const MAX_LIMIT: u64 = 1 << 20;
}

#[cfg(feature = "quanta")]
impl SlidingWindowLog<DefaultClock> {
    /// At most `quota.rate()` admissions in any span of `quota.per()`, on the default clock
    /// ([`QuantaClock`](crate::QuantaClock)).
    ///
    /// # Errors
    ///
    /// [`QuotaError::LimitTooLarge`] above [`SlidingWindowLog::MAX_LIMIT`].
    pub fn new(quota: Quota) -> Result<Self, QuotaError> {
        SlidingWindowLog::with_clock(quota, DefaultClock::new())
    }
}

impl<C: Clock> SlidingWindowLog<C> {
    /// At most `quota.rate()` admissions in any span of `quota.per()` (the burst is not used).
    ///
    /// # Errors
    ///
    /// [`QuotaError::LimitTooLarge`] above [`SlidingWindowLog::MAX_LIMIT`].
    pub fn with_clock(quota: Quota, clock: C) -> Result<Self, QuotaError> {
        let limit = quota.rate();
        if limit > SlidingWindowLog::MAX_LIMIT {
            return Err(QuotaError::LimitTooLarge { limit });
        }
        Ok(SlidingWindowLog {
            ring: Mutex::new(Ring {
                times: alloc::vec![0; limit as usize].into_boxed_slice(),
                head: 0,
                len: 0,
                // Readings from before the limiter existed are steps back too.
                latest: clock.now(),
            }),
            limit,
            window: quota.per().as_nanos() as u64,
            quota,
            clock,
        })
    }

    /// The clock the log reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Asks for one admission.
    pub fn check(&self) -> Decision {
        self.run(1)
    }

    /// Asks for `n` admissions at once, all or nothing; `n = 0` peeks.
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] if `n` exceeds the limit.
    pub fn check_n(&self, n: u32) -> Result<Decision, InsufficientCapacity> {
        InsufficientCapacity::check(n, self.limit as u32)?;
        Ok(self.run(n))
    }

    fn run(&self, n: u32) -> Decision {
        let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        self.run_locked(&mut ring, n)
    }

    /// [`SlidingWindowLog::run`] with the ring locked: the caller holds `ring`.
    fn run_locked(&self, ring: &mut Ring, n: u32) -> Decision {
        self.run_locked_inline(ring, n)
    }

    /// [`SlidingWindowLog::run_locked`], inlined where the decision is wrapped on its way out
    /// ([`SlidingWindowLog::check_live`]): built in place, instead of built in a temporary and
    /// copied (a copy that stalls on forwarding the temporary's narrower stores).
    #[inline(always)]
    fn run_locked_inline(&self, ring: &mut Ring, n: u32) -> Decision {
        let n = n as usize;
        // The clock is read under the lock: a reading taken before it could be older than entries
        // another thread has since dropped, and admit on a window that no longer holds.
        let d = self.decide(ring, self.clock.now(), n);
        if d.is_allowed() || !is_coarse(&self.clock) {
            return d;
        }
        // A denial on a coarse reading: decided again on a fresh one.
        self.decide(ring, self.clock.now_fresh(), n)
    }

    /// The check of a log that a reconfiguration may retire, for `n <= limit`: `None` once
    /// `retired` is set, which a change does under the ring's lock.
    #[cfg(feature = "std")]
    #[inline(always)]
    pub(crate) fn check_live(&self, n: u32, retired: &AtomicBool) -> Option<Decision> {
        // A panic cannot leave the ring half-updated in a way that over-admits (indices move only
        // after the writes), so a poisoned lock is still usable.
        let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        // Relaxed: set and read under the ring's lock only.
        if retired.load(Ordering::Relaxed) {
            return None;
        }
        Some(self.run_locked_inline(&mut ring, n))
    }

    /// Takes the log out of use (`retired` set, under its lock) and carries its admission times
    /// into `new`, which no other thread can see yet: the newest as many as the new limit allows
    /// are kept as they are ([`Carry::Debt`](crate::Carry::Debt)), or the count in the window is
    /// scaled to the new limit, rounded up, at most the limit
    /// ([`Carry::Proportional`](crate::Carry::Proportional); when that is more than the entries
    /// there are, the extra ones take the oldest entry's time, so they leave the window with it).
    /// A log decides by its newest `limit` entries alone, so dropping older ones changes nothing.
    /// `retire` is false only where a model wants the twin that leaves the old log in use.
    pub(crate) fn retire_into(
        &self,
        retired: &AtomicBool,
        new: &mut SlidingWindowLog<C>,
        proportional: bool,
        retire: bool,
        at: u64,
    ) {
        let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        if retire {
            // Relaxed: read under this lock only.
            retired.store(true, Ordering::Relaxed);
        }
        // Rolled to now as a peek would (entries past the window dropped).
        // A reading from before the lock: `decide` takes the latest of it and the log's own.
        let _ = self.decide(&mut ring, at, 0);
        let held = ring.len as u64;
        let target = if proportional {
            (u128::from(held) * u128::from(new.limit)).div_ceil(u128::from(self.limit)) as u64
        } else {
            held
        }
        .min(new.limit) as usize;
        let kept = target.min(ring.len);
        let first = ring.len - kept;
        let into = new.ring.get_mut().unwrap_or_else(PoisonError::into_inner);
        let oldest = if kept > 0 { ring.at(first) } else { 0 };
        for i in 0..target {
            into.times[i] = if i < target - kept {
                oldest
            } else {
                ring.at(first + i - (target - kept))
            };
        }
        into.head = 0;
        into.len = target;
        into.latest = into.latest.max(ring.latest);
    }

    /// The decision at `read` for `n <= limit`, with the ring locked. A reading behind the latest
    /// one is decided at the latest (a stalled clock); its waits count the difference.
    #[inline(always)]
    fn decide(&self, ring: &mut Ring, read: u64, n: usize) -> Decision {
        let now = read.max(ring.latest);
        ring.latest = now;
        let behind = now - read;
        // Drop what has left the window.
        while ring.len > 0 && ring.at(0).saturating_add(self.window) <= now {
            ring.head = (ring.head + 1) % ring.times.len().max(1);
            ring.len -= 1;
        }
        let cap = self.limit as usize;
        let allowed = ring.len + n <= cap;
        if allowed {
            for _ in 0..n {
                let slot = (ring.head + ring.len) % cap;
                ring.times[slot] = now;
                ring.len += 1;
            }
        }
        // When entry `i` leaves the window, from the reading: every entry still held is inside
        // the window, so a denial's wait is at least 1 ns.
        let gone_at = |i: usize| {
            ring.at(i)
                .saturating_add(self.window)
                .saturating_sub(now)
                .saturating_add(behind)
        };
        // Refused: the request passes once enough of the oldest entries have left the window.
        let retry_ns = if allowed {
            0
        } else {
            gone_at(ring.len + n - cap - 1)
        };
        let reset_ns = if ring.len == 0 {
            0
        } else {
            gone_at(ring.len - 1)
        };
        Decision::new(
            allowed,
            self.clock.resolution(),
            Detail::Eager {
                remaining: count32((cap - ring.len) as u64),
                retry_ns,
                reset_ns,
                limit: count32(self.limit),
            },
        )
    }
}

impl<C: Clock> RateLimiter for SlidingWindowLog<C> {
    fn check(&self) -> Decision {
        SlidingWindowLog::check(self)
    }

    fn check_n(&self, n: u32) -> Result<Decision, InsufficientCapacity> {
        SlidingWindowLog::check_n(self, n)
    }

    fn quota(&self) -> Quota {
        self.quota
    }
}
