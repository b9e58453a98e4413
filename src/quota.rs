use core::fmt;
use core::time::Duration;

const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// How many requests pass, how fast they come back, and how many may pass at once.
///
/// A quota reads "`rate` tokens every `per`, at most `burst` at once". A fresh limiter holds
/// `burst` tokens; one token returns every `period = per / rate`; a request for `n` tokens passes
/// if `n` tokens are there and takes them.
///
/// The period is kept as an exact fraction of a nanosecond, never truncated: `per_second(3)` has a
/// period of 333_333_333⅓ ns and a limiter built on it admits exactly three per second forever.
///
/// # Examples
///
/// The common forms, and the fallible one for values that come from configuration:
///
/// ```
/// use atomic_limiter::{Quota, QuotaError};
/// use std::time::Duration;
///
/// let api = Quota::per_second(100).with_burst(10);
/// assert_eq!(api.burst(), 10);
/// assert_eq!(api.period(), Duration::from_millis(10));
///
/// let slow = Quota::with_period(Duration::from_secs(2)); // one every 2 s, burst 1
/// assert_eq!(slow.burst(), 1);
///
/// let from_config = Quota::try_new(0, Duration::from_secs(1), 5);
/// assert_eq!(from_config, Err(QuotaError::ZeroRate));
/// ```
///
/// # Limits
///
/// Rates up to one token per nanosecond (10^9/s), periods up to `u64::MAX` ns (584 years) and
/// bursts up to [`Quota::MAX_BURST`] are accepted, as long as `burst × period` fits
/// [`Quota::MAX_WINDOW`]. Every rate in that range constructs: `per_second(n)` for any
/// `1 <= n <= 10^9`, and likewise per minute and per hour.
///
/// # Exact and rounded periods
///
/// The limiters keep time in units of `1/denominator` ns with a denominator of at most
/// [`Quota::MAX_DENOMINATOR`] (128), which keeps GCRA's idle horizon above a year. A period whose
/// lowest terms fit (`per_second(3)`: `10^9/3` ns; `per_second(7_000_000)`: `1000/7` ns) is kept
/// exactly ([`Quota::is_exact`]). Any other (`per_second(999)`: `10^6/999` ns) is rounded **up**
/// to the next multiple of 1/128 ns, so the limiter admits never more than asked and at most
/// `1/(128 × period in ns)` less:
///
/// | period (rate per second) | worst relative shortfall of a rounded quota |
/// |---|---|
/// | >= 1 ms (up to 1 000/s) | < 7.9 × 10^-9 |
/// | >= 1 µs (up to 10^6/s) | < 7.9 × 10^-6 |
/// | >= 100 ns (up to 10^7/s) | < 7.9 × 10^-5 |
/// | >= 1 ns (up to 10^9/s) | < 0.79 % |
///
/// ```
/// use atomic_limiter::Quota;
///
/// let from_config = Quota::per_second(999);
/// assert!(!from_config.is_exact());
/// // 1_001_001.001 ns asked; 1_001_001 + 1/128 ns kept: never faster than asked.
/// assert_eq!(from_config.period_fraction(), (128_128_129, 128));
/// assert!(Quota::per_second(3).is_exact());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    rate: u64,
    per_ns: u64,
    burst: u32,
    /// Numerator of the reduced period `per_ns / rate`: the period is `token / scale` ns.
    token: u64,
    /// Denominator of the reduced period: time is kept in units of `1 / scale` ns.
    scale: u64,
    /// Whether `token / scale` is exactly `per_ns / rate` (else it is rounded up).
    exact: bool,
}

const fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        let t = a % b;
        a = b;
        b = t;
    }
    a
}

impl Quota {
    /// The largest burst: `2^21 - 1` tokens (the token bucket's packed word holds 21 integer bits).
    pub const MAX_BURST: u32 = (1 << 21) - 1;

    /// The largest denominator of the period kept, in nanoseconds and in lowest terms; a period
    /// that needs a larger one is rounded up to a multiple of `1 / MAX_DENOMINATOR` ns.
    ///
    /// GCRA keeps time in units of `1 / denominator` ns in a wrapping `u64`; with
    /// [`Quota::MAX_WINDOW`] this bound keeps its idle and backwards-step horizon,
    /// `(2^63 - window) / denominator` ns, above one year.
    pub const MAX_DENOMINATOR: u64 = 128;

    /// The longest `burst × period`, in units of `1 / denominator` ns: `2^62` (146 years when the
    /// period is a whole number of nanoseconds).
    pub const MAX_WINDOW: u64 = 1 << 62;

    /// `rate` tokens every `per`, at most `burst` at once; the fallible constructor.
    ///
    /// # Errors
    ///
    /// A [`QuotaError`] naming the first rule the values break (see the type's `# Limits`).
    pub const fn try_new(rate: u64, per: Duration, burst: u32) -> Result<Quota, QuotaError> {
        let per_ns = per.as_nanos();
        if per_ns > u64::MAX as u128 {
            return Err(QuotaError::PeriodTooLong);
        }
        Self::try_from_nanos(rate, per_ns as u64, burst)
    }

    /// As [`Quota::try_new`], with the interval in nanoseconds.
    ///
    /// # Errors
    ///
    /// As [`Quota::try_new`].
    pub const fn try_from_nanos(rate: u64, per_ns: u64, burst: u32) -> Result<Quota, QuotaError> {
        if rate == 0 {
            return Err(QuotaError::ZeroRate);
        }
        if per_ns == 0 {
            return Err(QuotaError::ZeroPeriod);
        }
        if burst == 0 {
            return Err(QuotaError::ZeroBurst);
        }
        if burst > Self::MAX_BURST {
            return Err(QuotaError::BurstTooLarge { burst });
        }
        let g = gcd(per_ns, rate);
        let (mut token, mut scale) = (per_ns / g, rate / g);
        if token < scale {
            return Err(QuotaError::RateTooHigh);
        }
        let exact = scale <= Self::MAX_DENOMINATOR;
        if !exact {
            // Round the period up to the next multiple of 1/MAX_DENOMINATOR ns: never faster than
            // asked. rate > MAX_DENOMINATOR here, so the quotient is below per_ns: it fits.
            let d = Self::MAX_DENOMINATOR;
            let units = (per_ns as u128 * d as u128).div_ceil(rate as u128) as u64;
            let g = gcd(units, d);
            token = units / g;
            scale = d / g;
        }
        match token.checked_mul(burst as u64) {
            Some(w) if w <= Self::MAX_WINDOW => {}
            _ => return Err(QuotaError::WindowTooLong),
        }
        Ok(Quota {
            rate,
            per_ns,
            burst,
            token,
            scale,
            exact,
        })
    }

    const fn unwrap(r: Result<Quota, QuotaError>) -> Quota {
        match r {
            Ok(q) => q,
            Err(e) => panic!("{}", e.as_str()),
        }
    }

    /// The default burst for `n` per interval: `n`, saturated at [`Quota::MAX_BURST`].
    const fn default_burst(n: u64) -> u32 {
        if n > Self::MAX_BURST as u64 {
            Self::MAX_BURST
        } else {
            n as u32
        }
    }

    /// `n` per second, burst `n` (saturated at [`Quota::MAX_BURST`]).
    ///
    /// # Panics
    ///
    /// If `n` is zero, above 10^9, or its period breaks the `# Limits` above; in a `const` this
    /// is a compile error. Use [`Quota::try_new`] for values from outside the program.
    ///
    /// ```compile_fail
    /// use atomic_limiter::Quota;
    /// const NEVER: Quota = Quota::per_second(0); // error[E0080]: quota rate must be at least 1
    /// ```
    ///
    /// ```
    /// use atomic_limiter::Quota;
    /// const API: Quota = Quota::per_second(100).with_burst(10);
    /// assert_eq!(API.burst(), 10);
    /// ```
    pub const fn per_second(n: u64) -> Quota {
        Self::unwrap(Self::try_from_nanos(
            n,
            NANOS_PER_SECOND,
            Self::default_burst(n),
        ))
    }

    /// `n` per minute, burst `n` (saturated at [`Quota::MAX_BURST`]).
    ///
    /// # Panics
    ///
    /// As [`Quota::per_second`].
    pub const fn per_minute(n: u64) -> Quota {
        Self::unwrap(Self::try_from_nanos(
            n,
            60 * NANOS_PER_SECOND,
            Self::default_burst(n),
        ))
    }

    /// `n` per hour, burst `n` (saturated at [`Quota::MAX_BURST`]).
    ///
    /// # Panics
    ///
    /// As [`Quota::per_second`].
    pub const fn per_hour(n: u64) -> Quota {
        Self::unwrap(Self::try_from_nanos(
            n,
            3600 * NANOS_PER_SECOND,
            Self::default_burst(n),
        ))
    }

    /// One token every `period`, burst 1.
    ///
    /// # Panics
    ///
    /// If `period` is zero or longer than [`Quota::MAX_WINDOW`] ns (146 years).
    pub const fn with_period(period: Duration) -> Quota {
        Self::unwrap(Self::try_new(1, period, 1))
    }

    /// The same rate with another burst.
    ///
    /// # Panics
    ///
    /// If `burst` is zero, above [`Quota::MAX_BURST`], or makes the window too long; see
    /// [`Quota::try_with_burst`].
    pub const fn with_burst(self, burst: u32) -> Quota {
        Self::unwrap(self.try_with_burst(burst))
    }

    /// The same rate with another burst, fallibly.
    ///
    /// # Errors
    ///
    /// As [`Quota::try_new`].
    pub const fn try_with_burst(self, burst: u32) -> Result<Quota, QuotaError> {
        Self::try_from_nanos(self.rate, self.per_ns, burst)
    }

    /// Tokens per interval, as given.
    pub const fn rate(&self) -> u64 {
        self.rate
    }

    /// The interval the rate is counted over, as given.
    pub const fn per(&self) -> Duration {
        Duration::from_nanos(self.per_ns)
    }

    /// The most tokens one request, or a burst of requests, can take.
    pub const fn burst(&self) -> u32 {
        self.burst
    }

    /// The time one token takes to return, rounded down to whole nanoseconds for display; the
    /// limiters use the fraction [`Quota::period_fraction`].
    pub const fn period(&self) -> Duration {
        Duration::from_nanos(self.token / self.scale)
    }

    /// The period the limiters keep, as a fraction of nanoseconds `(numerator, denominator)` in
    /// lowest terms: exactly `per / rate` when [`Quota::is_exact`], else that rounded up to a
    /// multiple of `1 / MAX_DENOMINATOR` ns.
    pub const fn period_fraction(&self) -> (u64, u64) {
        (self.token, self.scale)
    }

    /// Whether the limiters keep the period exactly as `per / rate`. When not, it is rounded up
    /// by less than `1 / MAX_DENOMINATOR` ns (see the type's docs): the limiter admits slightly
    /// less than asked, never more.
    pub const fn is_exact(&self) -> bool {
        self.exact
    }

    /// The time a drained limiter takes to fill up again, rounded up to whole nanoseconds.
    pub const fn fill_time(&self) -> Duration {
        let w = self.token as u128 * self.burst as u128;
        Duration::from_nanos(w.div_ceil(self.scale as u128) as u64)
    }

    /// `burst × period` in units of `1/denominator` ns (never above [`Quota::MAX_WINDOW`]).
    pub(crate) const fn window_units(&self) -> u64 {
        self.token * self.burst as u64
    }
}

/// `100/s, burst 10`; an interval other than a second, a minute or an hour is written out
/// (`3 per 2s, burst 3`).
///
/// ```
/// use atomic_limiter::Quota;
/// use std::time::Duration;
///
/// assert_eq!(Quota::per_second(100).with_burst(10).to_string(), "100/s, burst 10");
/// assert_eq!(Quota::per_minute(7).to_string(), "7/min, burst 7");
/// let odd = Quota::try_new(3, Duration::from_secs(2), 3).unwrap();
/// assert_eq!(odd.to_string(), "3 per 2s, burst 3");
/// ```
impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.per_ns {
            NANOS_PER_SECOND => write!(f, "{}/s", self.rate)?,
            n if n == 60 * NANOS_PER_SECOND => write!(f, "{}/min", self.rate)?,
            n if n == 3600 * NANOS_PER_SECOND => write!(f, "{}/h", self.rate)?,
            _ => write!(f, "{} per {:?}", self.rate, self.per())?,
        }
        write!(f, ", burst {}", self.burst)
    }
}

/// In user terms: the rate as given, and the period the limiters keep, as a duration.
impl fmt::Debug for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Quota")
            .field("rate", &self.rate)
            .field("per", &self.per())
            .field("burst", &self.burst)
            .field("period", &self.period())
            .field("exact", &self.exact)
            .finish()
    }
}

/// Why a [`Quota`](crate::Quota) was rejected at construction.
///
/// Every limiter in this crate works exactly (GCRA) or within a documented resolution (token
/// bucket) for every quota that constructs; the rest are turned away here, with the reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum QuotaError {
    /// The rate was zero: a limiter that never refills is a closed gate, say so explicitly.
    ZeroRate,
    /// The refill interval (`per`) was zero.
    ZeroPeriod,
    /// The burst was zero: no request could ever pass.
    ZeroBurst,
    /// The burst exceeds [`Quota::MAX_BURST`](crate::Quota::MAX_BURST).
    BurstTooLarge {
        /// The burst asked for.
        burst: u32,
    },
    /// `per / rate` is shorter than one nanosecond, the clocks' resolution (more than 10^9 per
    /// second).
    RateTooHigh,
    /// `per` does not fit in `u64` nanoseconds (about 584 years).
    PeriodTooLong,
    /// `burst × period` (the time a drained limiter takes to fill) is longer than
    /// [`Quota::MAX_WINDOW`](crate::Quota::MAX_WINDOW) allows at this rate's resolution.
    WindowTooLong,
    /// A window limiter's limit (the quota's rate) is larger than its packed counters hold.
    LimitTooLarge {
        /// The limit asked for.
        limit: u64,
    },
}

impl QuotaError {
    /// The message, as a `&'static str` usable in `const` panics.
    pub const fn as_str(&self) -> &'static str {
        match self {
            QuotaError::ZeroRate => "quota rate must be at least 1",
            QuotaError::ZeroPeriod => "quota period must be longer than zero",
            QuotaError::ZeroBurst => "quota burst must be at least 1",
            QuotaError::BurstTooLarge { .. } => "quota burst exceeds Quota::MAX_BURST (2^21 - 1)",
            QuotaError::RateTooHigh => "quota rate exceeds one token per nanosecond",
            QuotaError::PeriodTooLong => "quota period does not fit in u64 nanoseconds",
            QuotaError::WindowTooLong => {
                "quota burst x period is too long to represent (see Quota::MAX_WINDOW)"
            }
            QuotaError::LimitTooLarge { .. } => {
                "window limit (the quota's rate) is larger than the window limiter's counters hold"
            }
        }
    }
}

impl fmt::Display for QuotaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuotaError::BurstTooLarge { burst } => write!(f, "{} (got {burst})", self.as_str()),
            QuotaError::LimitTooLarge { limit } => write!(f, "{} (got {limit})", self.as_str()),
            _ => f.write_str(self.as_str()),
        }
    }
}

impl core::error::Error for QuotaError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduces_the_period() {
        let q = Quota::per_second(7_000_000);
        assert_eq!(q.period_fraction(), (1000, 7));
        let q = Quota::per_second(3);
        assert_eq!(q.period_fraction(), (1_000_000_000, 3));
        assert_eq!(Quota::per_second(1_000_000_000).period_fraction(), (1, 1));
    }

    #[test]
    fn rejects_with_typed_errors() {
        let s = Duration::from_secs(1);
        assert_eq!(Quota::try_new(0, s, 1), Err(QuotaError::ZeroRate));
        assert_eq!(
            Quota::try_new(1, Duration::ZERO, 1),
            Err(QuotaError::ZeroPeriod)
        );
        assert_eq!(Quota::try_new(1, s, 0), Err(QuotaError::ZeroBurst));
        assert_eq!(
            Quota::try_new(1, s, 1 << 21),
            Err(QuotaError::BurstTooLarge { burst: 1 << 21 })
        );
        assert_eq!(
            Quota::try_new(1_000_000_001, s, 1),
            Err(QuotaError::RateTooHigh)
        );
        assert_eq!(
            Quota::try_new(1, Duration::MAX, 1),
            Err(QuotaError::PeriodTooLong)
        );
        let century = Duration::from_secs(100 * 365 * 86_400);
        assert!(Quota::try_new(1, century, 1).is_ok());
        assert_eq!(
            Quota::try_new(1, century, 2),
            Err(QuotaError::WindowTooLong)
        );
        assert!(Quota::try_new(1_000_000_000, s, Quota::MAX_BURST).is_ok());
        assert!(Quota::try_new(1, s, 1 << 20).is_ok());
    }

    #[test]
    fn default_burst_saturates() {
        assert_eq!(Quota::per_second(1_000_000_000).burst(), Quota::MAX_BURST);
        assert_eq!(Quota::per_minute(60).burst(), 60);
    }

    #[test]
    #[should_panic(expected = "quota rate must be at least 1")]
    fn per_second_zero_panics() {
        let _ = Quota::per_second(core::hint::black_box(0));
    }

    #[test]
    fn errors_display() {
        let e = Quota::try_new(1, Duration::from_secs(1), 1 << 21).unwrap_err();
        assert!(e.to_string().contains("2097152"));
    }

    #[test]
    fn inexact_periods_round_up_to_the_resolution() {
        let q = Quota::per_second(999);
        assert!(!q.is_exact());
        let (t, s) = q.period_fraction();
        assert_eq!(s, 128);
        // t/128 >= 10^9/999 > (t - 1)/128.
        assert!(u128::from(t) * 999 >= 128 * 1_000_000_000);
        assert!(u128::from(t - 1) * 999 < 128 * 1_000_000_000);
        assert!(Quota::per_second(7_000_000).is_exact());
        assert!(Quota::per_second(1_000_000_000).is_exact());
    }
}

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
