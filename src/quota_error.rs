use core::fmt;

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
