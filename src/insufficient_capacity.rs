use core::fmt;

/// A request for more tokens than the limiter's burst: it could never pass, however long the
/// caller waited, so it is refused without touching the limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InsufficientCapacity {
    /// The number of tokens asked for.
    pub requested: u32,
    /// The limiter's burst, the most one request can ever take.
    pub burst: u32,
}

impl fmt::Display for InsufficientCapacity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "request for {} tokens exceeds the burst of {}",
            self.requested, self.burst
        )
    }
}

impl core::error::Error for InsufficientCapacity {}
