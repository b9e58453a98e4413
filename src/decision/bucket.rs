//! [`BucketFigures`]: what a token bucket's decision leaves to work out, and the arithmetic that
//! turns it into counts and waits; with the fixed-point units the bucket counts in.

/// Fraction bits of the token count: tokens are counted in 1/1024ths.
pub(crate) const FRAC_BITS: u32 = 10;
/// One token in fixed point.
pub(crate) const UNIT: u64 = 1 << FRAC_BITS;
/// Fraction bits of the per-tick refill rate.
pub(crate) const RATE_FRAC: u32 = 53;

/// What a decision needs to answer `remaining`, `retry_after` and `reset_after` later: the
/// state it was made on, and the three parameters the answers use, kept small because a decision
/// is returned on the hot path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct BucketFigures {
    pub(crate) now_ns: u64,
    /// Units refilled per tick (the bucket's `BucketParams::rate`).
    pub(crate) rate: u64,
    /// Ticks from `now_ns`'s tick to the one refills count from (at most a stamp cycle, 2^53:
    /// the base lies ahead of now after a step back, never behind).
    pub(crate) ahead: u64,
    /// Units held at the base, after this decision (at most the cap, below 2^31).
    pub(crate) tokens: u32,
    /// Units this request lacked: 0 when allowed, positive when refused.
    pub(crate) need: u32,
    /// The bucket's burst (its cap is `burst × UNIT`).
    pub(crate) burst: u32,
    /// log2 of the tick in ns.
    pub(crate) shift: u8,
}

impl BucketFigures {
    /// The absolute base tick.
    #[inline]
    const fn base(&self) -> u128 {
        (self.now_ns >> self.shift) as u128 + self.ahead as u128
    }

    const fn cap(&self) -> u64 {
        self.burst as u64 * UNIT
    }

    /// The figures as a decision keeps them: `[now_ns, rate, ahead]`, `[tokens, need, burst]`,
    /// and `shift` in the small byte.
    #[inline(always)]
    pub(crate) const fn flat(self) -> ([u64; 3], [u32; 3], u8) {
        (
            [self.now_ns, self.rate, self.ahead],
            [self.tokens, self.need, self.burst],
            self.shift,
        )
    }

    /// The figures back from [`BucketFigures::flat`]'s form.
    #[inline(always)]
    pub(crate) const fn from_flat(words: [u64; 3], counts: [u32; 3], small: u8) -> BucketFigures {
        BucketFigures {
            now_ns: words[0],
            rate: words[1],
            ahead: words[2],
            tokens: counts[0],
            need: counts[1],
            burst: counts[2],
            shift: small,
        }
    }

    /// Whole tokens left after the decision.
    pub(crate) fn remaining(&self) -> u64 {
        u64::from(self.tokens) >> FRAC_BITS
    }

    /// Nanoseconds from `now_ns` until the refill since `base` reaches `more` units. Inlined into
    /// the decision's accessors, so that the figures are read from the decision in place (called,
    /// they were copied out to the stack first: 4 ns on a bucket's retry-after).
    #[inline(always)]
    fn ns_until(self, more: u64) -> u64 {
        if more == 0 {
            return 0;
        }
        let base = self.base();
        let rate = self.rate;
        // The first tick k with floor(k × rate / 2^RATE_FRAC) >= units(base) + more: k = base +
        // ceil((more × 2^RATE_FRAC - accrued) / rate), where `accrued` is the fraction of a unit
        // already on the grid at `base` (the product's low bits: those of its low words).
        let accrued = u128::from((base as u64).wrapping_mul(rate) & ((1 << RATE_FRAC) - 1));
        let numerator = ((more as u128) << RATE_FRAC) - accrued;
        // At most 63 (said so, the 128-bit shifts below need no test for a shift past a word).
        let shift = u32::from(self.shift) & 63;
        let tokens = u64::from(self.tokens);
        // A request that needs just the cap passes as soon as the *exact* refill reaches it (see
        // `decide`), which can be before the grid gets there, and never after: then the units
        // missing are the numerator, and the instant is ceil(numerator × 2^shift / rate) ns past
        // the base tick, one division (while the product fits; `exact_cap_at` splits it).
        let at = if tokens + more == self.cap() && shl_fits(numerator, shift) {
            let wide = numerator << shift;
            (base << shift) + div_ceil_wide(wide, rate)
        } else {
            // Up to 2^11 units (two tokens) the numerator fits 64 bits, the common case.
            let ticks = div_ceil_wide(numerator, rate);
            let at = (base + ticks).checked_shl(shift).unwrap_or(u128::MAX);
            if tokens + more >= self.cap() {
                at.min(self.exact_cap_at(accrued))
            } else {
                at
            }
        };
        let wait = at.saturating_sub(self.now_ns as u128);
        u64::try_from(wait).unwrap_or(u64::MAX)
    }

    /// The first nanosecond at which the exact refill since `base` fills the bucket (never before
    /// `base` itself, where refills start): the least `t` with
    /// `tokens + position(t) - units(base) >= cap`, i.e. `t × rate >= (units(base) + cap - tokens)
    /// × 2^(RATE_FRAC + shift)`, computed relative to `base` to stay inside 128 bits.
    fn exact_cap_at(self, accrued: u128) -> u128 {
        let rate = self.rate as u128;
        let shift = u32::from(self.shift);
        // Units (fixed point) still to accrue after the base tick's own position.
        let missing = ((self.cap() - u64::from(self.tokens)) as u128) << RATE_FRAC;
        let missing = missing.saturating_sub(accrued);
        // ceil(missing × 2^shift / rate), split so that no product leaves 128 bits.
        let (q, r) = (missing / rate, missing % rate);
        let rel = (q << shift) + ((r << shift).div_ceil(rate));
        let base_ns = self.base() << shift;
        base_ns + rel
    }

    #[inline]
    pub(crate) fn wait_ns(self) -> u64 {
        self.ns_until(u64::from(self.need))
    }

    /// Nanoseconds until one more whole token is held (0 when full).
    pub(crate) fn next_token_ns(self) -> u64 {
        let tokens = u64::from(self.tokens);
        if tokens >= self.cap() {
            return 0;
        }
        self.ns_until(UNIT - tokens % UNIT)
    }

    #[inline]
    pub(crate) fn reset_ns(self) -> u64 {
        self.ns_until(self.cap().saturating_sub(u64::from(self.tokens)))
    }
}

/// Whether `x << shift` keeps every bit of `x`, for `shift <= 63`: the high word, shifted right by
/// `64 - shift` in two steps (so that `shift == 0` shifts by 64 without overflow), is zero. Not
/// `x.leading_zeros() >= shift`: on baseline x86-64 that is two `bsr`s and a `cmov`, and side by
/// side on a Zen 3 it made a bucket's refusal with its retry-after read 28 ns against 22.
#[inline(always)]
pub(crate) const fn shl_fits(x: u128, shift: u32) -> bool {
    ((x >> 64) as u64) >> (63 - shift) >> 1 == 0
}

/// `ceil(x / d)` for `d > 0`. When the quotient fits 64 bits (the high word below `d`: a wait
/// below 2^64 ns from its tick), one hardware division of the 128-bit `x` where there is one;
/// the compiler's 128-bit division is a call that divides again to find the remainder.
#[inline(always)]
#[allow(unsafe_code)]
pub(crate) fn div_ceil_wide(x: u128, d: u64) -> u128 {
    let (hi, lo) = ((x >> 64) as u64, x as u64);
    if hi == 0 {
        return u128::from(lo.div_ceil(d));
    }
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if hi < d {
        let (q, r): (u64, u64);
        // SAFETY: `div` divides rdx:rax by `d` into rax (quotient) and rdx (remainder); it faults
        // only when the quotient does not fit 64 bits, which `hi < d` rules out (and with it
        // `d == 0`). It reads and writes no memory, and no register but the two named.
        unsafe {
            core::arch::asm!(
                "div {d}",
                d = in(reg) d,
                inout("rax") lo => q,
                inout("rdx") hi => r,
                options(pure, nomem, nostack),
            );
        }
        return u128::from(q) + u128::from(r != 0);
    }
    x.div_ceil(u128::from(d))
}
