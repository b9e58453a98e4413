//! [`TimeFigures`]: what a GCRA decision (a limiter, a throttle's meter, Redis's script) leaves to
//! work out, in GCRA units, and the arithmetic that turns them into counts and waits.

/// GCRA-style figures, in units of `1 / scale` ns.
///
/// In a decision's flat words (see [`TimeFigures::flat`]): `[after, wait, token]`, `[burst, 0,
/// 0]`, and `scale` in the small byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimeFigures {
    /// Time until the limiter is full again, after this decision.
    pub(crate) after: u64,
    /// Time until this request would pass (0 when allowed).
    pub(crate) wait: u64,
    /// Time one token takes to return.
    pub(crate) token: u64,
    /// The most tokens the limiter holds (a drained one fills in `burst × token`).
    pub(crate) burst: u32,
    /// Units per nanosecond (at most 128).
    pub(crate) scale: u8,
}

impl TimeFigures {
    /// The figures as a decision keeps them: three words, three counts and a byte.
    #[inline(always)]
    pub(crate) const fn flat(self) -> ([u64; 3], [u32; 3], u8) {
        (
            [self.after, self.wait, self.token],
            [self.burst, 0, 0],
            self.scale,
        )
    }

    /// The figures back from [`TimeFigures::flat`]'s form.
    #[inline(always)]
    pub(crate) const fn from_flat(words: [u64; 3], counts: [u32; 3], small: u8) -> TimeFigures {
        TimeFigures {
            after: words[0],
            wait: words[1],
            token: words[2],
            burst: counts[0],
            scale: small,
        }
    }

    /// Whole tokens left after the decision.
    pub(crate) fn remaining(self) -> u64 {
        (u64::from(self.burst) * self.token).saturating_sub(self.after) / self.token
    }

    /// Nanoseconds until the request would pass.
    #[inline(always)]
    pub(crate) fn wait_ns(self) -> u64 {
        units_to_ns(self.wait, u64::from(self.scale))
    }

    /// Nanoseconds until one more whole token is held (0 when full).
    pub(crate) fn next_token_ns(self) -> u64 {
        let full = u64::from(self.burst).saturating_mul(self.token);
        if self.after == 0 || self.token == 0 {
            return 0;
        }
        // `remaining` whole tokens are held; one more is, once the debt falls to
        // `(burst - remaining - 1)` tokens' worth.
        let remaining = full.saturating_sub(self.after) / self.token;
        let keep = u64::from(self.burst).saturating_sub(remaining + 1) * self.token;
        units_to_ns(self.after.saturating_sub(keep), u64::from(self.scale))
    }

    /// Nanoseconds until the limiter is full again.
    #[inline(always)]
    pub(crate) fn reset_ns(self) -> u64 {
        units_to_ns(self.after, u64::from(self.scale))
    }
}

/// GCRA units to whole nanoseconds, rounded up; no division for whole-nanosecond periods.
#[inline]
fn units_to_ns(units: u64, scale: u64) -> u64 {
    if scale == 1 {
        units
    } else {
        units.div_ceil(scale)
    }
}
