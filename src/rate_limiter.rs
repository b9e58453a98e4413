use crate::{Decision, InsufficientCapacity, Quota};

/// What every limiter in this crate does, so that benches, tests and wrappers are generic over the
/// algorithm with static dispatch.
///
/// Implementations are `Send + Sync` where their clock is, are checked through `&self`, and never
/// lock (the `baseline` mutex twins excepted), allocate or panic on a check.
///
/// # Examples
///
/// A function that serves any limiter:
///
/// ```
/// use atomic_limiter::{Gcra, ManualClock, Quota, RateLimiter, TokenBucket};
///
/// fn admit(limiter: &impl RateLimiter, cost: u32) -> bool {
///     limiter.check_n(cost).is_ok_and(|d| d.is_allowed())
/// }
///
/// let clock = ManualClock::new();
/// let quota = Quota::per_second(10);
/// assert!(admit(&Gcra::with_clock(quota, clock.clone()), 10));
/// assert!(admit(&TokenBucket::with_clock(quota, clock.clone()), 10));
/// assert!(!admit(&Gcra::with_clock(quota, clock), 11));
/// ```
pub trait RateLimiter {
    /// Asks for one token.
    fn check(&self) -> Decision;

    /// Asks for `n` tokens at once: all or nothing. `n = 0` is allowed and takes nothing (a peek).
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] if `n` exceeds the burst: such a request could never pass, and the
    /// limiter is left untouched.
    fn check_n(&self, n: u32) -> Result<Decision, InsufficientCapacity>;

    /// The quota the limiter enforces.
    fn quota(&self) -> &Quota;
}
