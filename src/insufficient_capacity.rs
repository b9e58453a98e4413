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

impl InsufficientCapacity {
    /// `Ok` when `requested` tokens fit in `burst`, the error otherwise: the one check every
    /// limiter makes before touching its state.
    #[inline]
    pub(crate) fn check(requested: u32, burst: u32) -> Result<(), InsufficientCapacity> {
        if requested > burst {
            Err(InsufficientCapacity { requested, burst })
        } else {
            Ok(())
        }
    }
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
