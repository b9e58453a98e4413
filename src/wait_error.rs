use core::time::Duration;

use crate::InsufficientCapacity;

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
