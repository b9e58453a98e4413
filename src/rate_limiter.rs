use core::future::Future;
use core::time::Duration;

use crate::decision::Decision;
use crate::quota::{InsufficientCapacity, Quota};
use crate::wait::{Wait, WaitError};

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
    fn quota(&self) -> Quota;

    /// Waits until `n` tokens are granted, sleeping with `sleep` between tries: each refusal's
    /// `retry_after` (plus the jitter of `wait`), never a busy loop, and nothing held while
    /// sleeping. `sleep` is how time passes: `std::thread::sleep` on threads (see
    /// [`RateLimiter::wait_n`]), or advancing a [`ManualClock`](crate::ManualClock) in tests.
    ///
    /// # Errors
    ///
    /// [`WaitError::InsufficientCapacity`] if `n` exceeds the burst; [`WaitError::TimedOut`] if the
    /// next sleep would take the total past `wait.max_wait()`.
    fn wait_n_with(
        &self,
        n: u32,
        wait: Wait,
        sleep: impl FnMut(Duration),
    ) -> Result<Decision, WaitError>
    where
        Self: Sized,
    {
        crate::wait::wait_with(|| self.check_n(n), wait, sleep)
    }

    /// [`RateLimiter::wait_n_with`] on the calling thread, with `std::thread::sleep`.
    ///
    /// # Errors
    ///
    /// As [`RateLimiter::wait_n_with`].
    #[cfg(feature = "std")]
    fn wait_n(&self, n: u32, wait: Wait) -> Result<Decision, WaitError>
    where
        Self: Sized,
    {
        self.wait_n_with(n, wait, std::thread::sleep)
    }

    /// [`RateLimiter::wait_n`] for one token.
    ///
    /// # Errors
    ///
    /// As [`RateLimiter::wait_n_with`].
    #[cfg(feature = "std")]
    fn wait(&self, wait: Wait) -> Result<Decision, WaitError>
    where
        Self: Sized,
    {
        self.wait_n(1, wait)
    }

    /// [`RateLimiter::until_n_ready_with`] for one token.
    ///
    /// # Errors
    ///
    /// As [`RateLimiter::wait_n_with`].
    fn until_ready_with<S, F>(
        &self,
        wait: Wait,
        sleep: S,
    ) -> impl Future<Output = Result<Decision, WaitError>>
    where
        Self: Sized,
        S: FnMut(Duration) -> F,
        F: Future<Output = ()>,
    {
        self.until_n_ready_with(1, wait, sleep)
    }

    /// The asynchronous form of [`RateLimiter::wait_n_with`], bound to no runtime: `sleep` makes
    /// the runtime's timer future (`|d| tokio::time::sleep(d)`, `|d| async_io::Timer::after(d)`,
    /// ...), awaited between tries. Nothing is held across an await but the limiter reference.
    ///
    /// # Errors
    ///
    /// As [`RateLimiter::wait_n_with`].
    fn until_n_ready_with<S, F>(
        &self,
        n: u32,
        wait: Wait,
        sleep: S,
    ) -> impl Future<Output = Result<Decision, WaitError>>
    where
        Self: Sized,
        S: FnMut(Duration) -> F,
        F: Future<Output = ()>,
    {
        crate::wait::until_with(move || self.check_n(n), wait, sleep)
    }
}
