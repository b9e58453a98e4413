use crate::quota::InsufficientCapacity;
use core::time::Duration;

use crate::sync::{Ordering, StaticAtomicU64};

/// How long to wait for a limiter at most, and how much random jitter to add to each sleep.
///
/// Jitter spreads callers that were refused together, so they do not all retry in the same
/// instant; a sleep is never shorter than the advertised `retry_after`, only up to `jitter` longer.
///
/// # Examples
///
/// ```
/// use atomic_limiter::Wait;
/// use std::time::Duration;
///
/// let w = Wait::up_to(Duration::from_secs(2)).with_jitter(Duration::from_millis(5));
/// assert_eq!(w.max_wait(), Duration::from_secs(2));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    max_wait: Duration,
    jitter: Duration,
}

impl Wait {
    /// Wait at most `max_wait` in total, no jitter.
    pub const fn up_to(max_wait: Duration) -> Wait {
        Wait {
            max_wait,
            jitter: Duration::ZERO,
        }
    }

    /// Add up to `jitter` (uniformly) to each sleep.
    pub const fn with_jitter(self, jitter: Duration) -> Wait {
        Wait { jitter, ..self }
    }

    /// The most time spent waiting before giving up.
    pub const fn max_wait(&self) -> Duration {
        self.max_wait
    }

    /// The sleep before the next try, for an advertised `retry_after`.
    pub(crate) fn sleep_for(&self, retry_after: Duration) -> Duration {
        // Never zero: a refusal always comes with a positive wait, but a sleep of nothing would spin.
        let base = retry_after.max(Duration::from_nanos(1));
        let jitter = u64::try_from(self.jitter.as_nanos()).unwrap_or(u64::MAX);
        let extra = match jitter {
            0 => return base,
            // Every u64 is in range: no modulus (jitter + 1 would overflow).
            u64::MAX => next_random(),
            j => next_random() % (j + 1),
        };
        base.saturating_add(Duration::from_nanos(extra))
    }
}

/// What a waiting loop does after one check.
pub(crate) enum Next {
    /// Granted: return it.
    Done(crate::decision::Decision),
    /// Refused: sleep this long, then try again.
    Sleep(Duration),
}

impl Wait {
    /// The waiting loops' one decision: done, sleep, or give up (`waited` so far).
    pub(crate) fn next(
        &self,
        checked: Result<crate::decision::Decision, crate::quota::InsufficientCapacity>,
        waited: Duration,
    ) -> Result<Next, crate::wait::WaitError> {
        let d = checked?;
        if d.is_allowed() {
            return Ok(Next::Done(d));
        }
        let nap = self.sleep_for(d.retry_after());
        if waited.saturating_add(nap) > self.max_wait {
            return Err(crate::wait::WaitError::TimedOut {
                waited,
                retry_after: d.retry_after(),
            });
        }
        Ok(Next::Sleep(nap))
    }
}

/// The waiting loop, on the caller's thread: `check` until granted, sleeping each refusal's
/// advertised wait (plus jitter) with `sleep`, giving up before a sleep that would pass the
/// maximum. Every limiter's `wait_n_with`, and `Keyed`'s, is this.
pub(crate) fn wait_with(
    mut check: impl FnMut() -> Result<crate::decision::Decision, crate::quota::InsufficientCapacity>,
    wait: Wait,
    mut sleep: impl FnMut(Duration),
) -> Result<crate::decision::Decision, crate::wait::WaitError> {
    let mut waited = Duration::ZERO;
    loop {
        match wait.next(check(), waited)? {
            Next::Done(d) => return Ok(d),
            Next::Sleep(nap) => {
                sleep(nap);
                waited = waited.saturating_add(nap);
            }
        }
    }
}

/// [`wait_with`] as a future: `sleep` makes the runtime's timer future, awaited between tries.
pub(crate) async fn until_with<S, F>(
    mut check: impl FnMut() -> Result<crate::decision::Decision, crate::quota::InsufficientCapacity>,
    wait: Wait,
    mut sleep: S,
) -> Result<crate::decision::Decision, crate::wait::WaitError>
where
    S: FnMut(Duration) -> F,
    F: core::future::Future<Output = ()>,
{
    let mut waited = Duration::ZERO;
    loop {
        match wait.next(check(), waited)? {
            Next::Done(d) => return Ok(d),
            Next::Sleep(nap) => {
                sleep(nap).await;
                waited = waited.saturating_add(nap);
            }
        }
    }
}

/// A cheap shared pseudo-random sequence for jitter (not for anything that needs secrecy).
pub(crate) fn next_random() -> u64 {
    static STATE: StaticAtomicU64 = StaticAtomicU64::new(0x9E37_79B9_7F4A_7C15);
    // Relaxed: only the value matters; each caller gets a distinct step of the sequence.
    let x = STATE.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
    // SplitMix64's finaliser.
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Why waiting for a limiter gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitError {
    /// More tokens than the burst: waiting could never help.
    InsufficientCapacity(InsufficientCapacity),
    /// The next try would have gone past the maximum wait.
    TimedOut {
        /// Time already spent sleeping.
        waited: Duration,
        /// The wait the limiter advertised at the last refusal.
        retry_after: Duration,
    },
}

impl From<InsufficientCapacity> for WaitError {
    fn from(e: InsufficientCapacity) -> WaitError {
        WaitError::InsufficientCapacity(e)
    }
}

impl core::fmt::Display for WaitError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            WaitError::InsufficientCapacity(e) => e.fmt(f),
            WaitError::TimedOut {
                waited,
                retry_after,
            } => write!(
                f,
                "gave up after waiting {waited:?}: the next try is {retry_after:?} away, past the maximum wait"
            ),
        }
    }
}

impl core::error::Error for WaitError {}
