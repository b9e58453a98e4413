use core::time::Duration;

use crate::InsufficientCapacity;

/// Why a [`Throttle`](crate::Throttle) reservation was not made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThrottleError {
    /// More tokens than the burst: no slot could ever hold them.
    InsufficientCapacity(InsufficientCapacity),
    /// The slot is further off than the caller's maximum wait; nothing was reserved.
    WouldWait(Duration),
}

impl core::fmt::Display for ThrottleError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ThrottleError::InsufficientCapacity(e) => e.fmt(f),
            ThrottleError::WouldWait(d) => {
                write!(f, "the next slot is {d:?} away, past the maximum wait")
            }
        }
    }
}

impl core::error::Error for ThrottleError {}
