//! The packed token bucket as pure arithmetic: old word and a clock reading in, new word and a
//! verdict out.
//!
//! # Layout of the state word
//!
//! The word is split where the quota needs it: the token field is just wide enough for
//! `burst × UNIT`, and the stamp takes every bit left, so small bursts get a long stamp cycle.
//!
//! | bits                     | name   | meaning |
//! |--------------------------|--------|---------|
//! | `0 .. token_bits`        | tokens | unsigned fixed point with [`FRAC_BITS`] fraction bits: [`UNIT`] = one token |
//! | `token_bits .. 64`       | stamp  | tick of the last refill, modulo `2^stamp_bits` |
//!
//! `token_bits` is the bit length of `burst × UNIT`: from 11 (burst 1) to [`MAX_TOKEN_BITS`] = 31
//! (burst `2^21 - 1`); `stamp_bits = 64 - token_bits`, from 53 down to 33.
//!
//! A tick is `2^shift` ns. `shift` is the largest with `tick <= period / UNIT` (so one tick refills
//! at most one unit: the time resolution matches the token resolution), raised if needed until a
//! full refill takes at most `2^stamp_bits / 16` ticks ([`FILL_FRACTION_BITS`]), so that the stamp
//! cycle is always at least sixteen fill times long.
//!
//! # Refill without drift
//!
//! The refill between ticks `a < b` is `units(b) - units(a)`, where `units(t) = floor(t × rate)`
//! on the *absolute* tick number and `rate` is the refill per tick as a 64-bit fixed-point fraction
//! rounded down. Because the floors are taken on absolute ticks, the refills of successive checks
//! add up to `units(last) - units(first)`: a fraction that does not make a whole unit yet is not
//! lost, it shows up at a later check. Polling every nanosecond refills exactly as much as polling
//! once.
//!
//! # Never ahead of exact time
//!
//! Counting on a grid keeps the fraction of a unit accrued since the last grid point. That is
//! right while the bucket is below its cap, but when a refill reaches the cap the exact bucket
//! drops that fraction along with the excess, at the exact nanosecond. So whenever a refill reaches
//! the cap, at creation, and when a full bucket is taken from before its stamp, the stamp moves to
//! the first tick whose whole units reach the exact position of that nanosecond
//! ([`BucketParams::rephase`]). Against the exact nanosecond model the bucket then never leads, and
//! trails by less than two units and a tick: it never admits a request the exact model would
//! refuse. The proof is in `docs/design.md`.
//!
//! # Clock steps and the idle horizon
//!
//! The elapsed ticks `e = (now_tick - stamp) mod 2^stamp_bits` (the cycle `C = 2^stamp_bits`)
//! are read by how far the reading can be trusted ([`Reading`]):
//!
//! | `e` | any clock | a monotonic clock | the same, on a fresh reading |
//! |---|---|---|---|
//! | `[0, C/2)` | an idle of `e` | an idle of `e` | an idle of `e` |
//! | `[C/2, 3C/4)` | an idle of `e` | stale or a wrap: read the clock again | an idle of `e` |
//! | `[3C/4, C - L)` | the clock stepped back | stale or a wrap: read the clock again | an idle of `e` |
//! | `[C - L, C)` | the clock stepped back | behind by less than `L`: a stall | a stall |
//!
//! A reading behind the stamp refills nothing and keeps the stamp, so the time is not counted
//! twice when the clock comes back. `L` ([`BucketParams::stall_from`]) covers a stamp re-phased a
//! few ticks ahead and cores whose clocks differ by up to a millisecond. On a monotonic clock a
//! reading far behind the stamp is either stale (taken by a thread that then waited) or an idle
//! that wrapped the cycle: a reading taken after the word was loaded cannot be stale, so it
//! tells them apart. `docs/design.md` has the numbers and what happens past the cycle.

use crate::clock::Reading;
use crate::decision::Detail;
use crate::quota::Quota;

/// Fraction bits of the token count: tokens are counted in 1/1024ths.
pub(crate) const FRAC_BITS: u32 = 10;
/// One token in fixed point.
pub(crate) const UNIT: u64 = 1 << FRAC_BITS;
/// The widest token field: 21 integer bits for `Quota::MAX_BURST`, and [`FRAC_BITS`].
pub(crate) const MAX_TOKEN_BITS: u32 = 31;
/// A full refill takes at most `2^-FILL_FRACTION_BITS` of the stamp cycle.
pub(crate) const FILL_FRACTION_BITS: u32 = 4;
/// Fraction bits of the per-tick refill rate.
const RATE_FRAC: u32 = 53;

/// A quota in token-bucket terms, with its word layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BucketParams {
    /// log2 of the tick in ns.
    pub(crate) shift: u32,
    /// Units refilled per tick, fixed point with [`RATE_FRAC`] fraction bits, rounded down.
    pub(crate) rate: u64,
    /// `burst × UNIT`.
    pub(crate) cap: u64,
    /// The most tokens one request may take.
    pub(crate) burst: u32,
    /// Width of the token field; the stamp field is the other `64 - token_bits`.
    pub(crate) token_bits: u32,
    /// The most the whole-unit refill can trail the exact refill by, in units: under one unit of
    /// rounding plus one tick's refill (`ceil(rate) + 1`).
    pub(crate) grid_lag: u64,
    /// The masks and thresholds of the layout, worked out once: the check's path then loads
    /// them instead of shifting by `token_bits` for each.
    masks: Masks,
}

/// [`BucketParams`]' layout figures, each a function of `token_bits` and `shift`, and the shifts
/// that bound a refill from below, of `rate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Masks {
    /// The low `token_bits` bits.
    tokens: u64,
    /// The low `64 - token_bits` bits: the stamp field, shifted down.
    stamp: u64,
    /// [`BucketParams::recheck_from`].
    recheck: u64,
    /// [`BucketParams::stall_from`]: compared with whenever a stamp re-phased into the next tick
    /// or two is read back.
    stall: u64,
    /// The nanoseconds into a tick: the low `shift` bits of a reading.
    into: u64,
    /// [`BucketParams::surely_refills`]' shift: `k + 1 - RATE_FRAC` for the rate's power of two,
    /// `2^k <= rate`, so that `(elapsed << up) >> 1 == floor(elapsed × 2^(k - RATE_FRAC))`.
    up: u32,
}

impl BucketParams {
    pub(crate) const fn new(quota: &Quota) -> BucketParams {
        let (token, scale) = quota.period_fraction();
        let cap = quota.burst() as u64 * UNIT;
        let token_bits = u64::BITS - cap.leading_zeros();
        // Quota::MAX_BURST keeps the token field within MAX_TOKEN_BITS (and the stamp >= 33 bits).
        debug_assert!(token_bits <= MAX_TOKEN_BITS);
        let stamp_bits = 64 - token_bits;
        // The period is token/scale ns; the largest power-of-two tick of at most period/UNIT.
        let per_unit = UNIT as u128 * scale as u128;
        let mut shift = 0;
        while (per_unit << (shift + 1)) <= token as u128 {
            shift += 1;
        }
        // A full refill, burst × period ns, must take at most 2^(stamp_bits - 4) ticks.
        let fill_ns = quota.burst() as u128 * token as u128 / scale as u128;
        while (fill_ns >> shift) > (1u128 << (stamp_bits - FILL_FRACTION_BITS)) {
            shift += 1;
        }
        // rate = UNIT × 2^shift × scale / token units per tick, times 2^RATE_FRAC, rounded down.
        // At most UNIT × 2^RATE_FRAC = 2^63 when the tick is one period; saturate beyond (a tick
        // coarsened past the period, possible only for windows near Quota::MAX_WINDOW).
        let rate = (per_unit << (shift + RATE_FRAC)) / token as u128;
        let rate = if rate > u64::MAX as u128 {
            u64::MAX
        } else {
            rate as u64
        };
        let mut p = BucketParams {
            shift,
            rate,
            cap,
            burst: quota.burst(),
            token_bits,
            grid_lag: (rate >> RATE_FRAC) + 2,
            masks: Masks {
                tokens: 0,
                stamp: 0,
                recheck: 0,
                stall: 0,
                into: 0,
                up: 0,
            },
        };
        #[cfg(not(atomic_limiter_seeded_bug = "layout"))]
        let width = token_bits;
        // The fuzzers' teeth check: a token field one bit short.
        #[cfg(atomic_limiter_seeded_bug = "layout")]
        let width = token_bits - 1;
        p.masks.tokens = (1 << width) - 1;
        p.masks.stamp = u64::MAX >> token_bits;
        p.masks.recheck = 1 << (stamp_bits - 1);
        p.masks.stall = p.stall_threshold();
        p.masks.into = (1u64 << (shift & 63)) - 1;
        // A tick refills at least half a unit, so `k >= RATE_FRAC - 1`: the tick is the largest
        // power of two with `UNIT × tick <= period`, so twice it is past the period, and the
        // coarsening only lengthens it (`rate_is_at_least_half_a_unit_a_tick`).
        debug_assert!(rate >= 1 << (RATE_FRAC - 1));
        p.masks.up = (63 - (rate | 1).leading_zeros()).saturating_sub(RATE_FRAC - 1);
        p
    }

    /// Whether `elapsed` ticks surely refill at least `room` units, told from the rate's power of
    /// two without a multiply: the whole-unit refill over them is at least
    /// `floor(elapsed × rate / 2^RATE_FRAC)` (a difference of floors is at least the floor of the
    /// difference), and that is at least `floor(elapsed × 2^k / 2^RATE_FRAC)`. For `elapsed` below
    /// half the stamp cycle (at most 2^52 ticks), the shift up (at most 11) cannot overflow.
    #[inline(always)]
    const fn surely_refills(&self, elapsed: u64, room: u64) -> bool {
        (elapsed << (self.masks.up & 63)) >> 1 >= room
    }

    #[inline]
    const fn stamp_bits(&self) -> u32 {
        64 - self.token_bits
    }

    #[inline]
    const fn stamp_mask(&self) -> u64 {
        self.masks.stamp
    }

    #[inline]
    const fn token_mask(&self) -> u64 {
        self.masks.tokens
    }

    /// Elapsed readings at or above this many ticks are a clock that stepped back (any clock).
    #[inline]
    const fn backward_from(&self) -> u64 {
        3 << (self.stamp_bits() - 2)
    }

    /// Elapsed readings at or above this many ticks are a stall on a monotonic clock: the last
    /// `L` ticks of the cycle, `L` the larger of 8 ticks and 2^20 ns, at most a quarter cycle.
    #[inline]
    pub(crate) const fn stall_from(&self) -> u64 {
        self.masks.stall
    }

    /// [`BucketParams::stall_from`] worked out, once the stamp mask is.
    const fn stall_threshold(&self) -> u64 {
        let quarter = 1u64 << (self.stamp_bits() - 2);
        let ms = if self.shift >= 20 {
            0
        } else {
            1u64 << (20 - self.shift)
        };
        let l = if ms > 8 { ms } else { 8 };
        let l = if l < quarter { l } else { quarter };
        self.stamp_mask() + 1 - l
    }

    /// Elapsed readings at or above this many ticks, on a monotonic clock, are read again.
    #[inline]
    const fn recheck_from(&self) -> u64 {
        self.masks.recheck
    }

    /// Units refilled from tick 0 to `tick`, rounded down.
    #[inline]
    pub(crate) const fn units(&self, tick: u64) -> u128 {
        self.units_wide(tick as u128)
    }

    /// [`BucketParams::units`] for a tick that may lie past `u64::MAX` (a stamp a few ticks ahead
    /// of a clock at the end of time); below 2^65 ticks, so the product fits.
    #[inline]
    pub(crate) const fn units_wide(&self, tick: u128) -> u128 {
        (tick * self.rate as u128) >> RATE_FRAC
    }

    /// Puts a stamp (ticks, any width) and a token count into one word.
    #[inline]
    pub(crate) const fn pack(&self, stamp: u64, tokens: u64) -> u64 {
        self.pack_held(stamp, tokens & self.token_mask())
    }

    /// [`BucketParams::pack`] for a count already within the cap, whose width is the token
    /// field's: nothing to mask off.
    #[inline]
    pub(crate) const fn pack_held(&self, stamp: u64, tokens: u64) -> u64 {
        // The shift drops the stamp's bits past its field: the tick modulo the cycle.
        (stamp << self.token_bits) | tokens
    }

    /// `(now_tick, elapsed)`: the tick of `now_ns`, and the ticks from `stamp` to it, modulo the
    /// stamp cycle.
    #[inline(always)]
    pub(crate) const fn elapsed(&self, stamp: u64, now_ns: u64) -> (u64, u64) {
        let now_tick = now_ns >> self.shift;
        (now_tick, now_tick.wrapping_sub(stamp) & self.stamp_mask())
    }

    /// Takes a word apart into (stamp, tokens).
    #[inline]
    pub(crate) const fn unpack(&self, word: u64) -> (u64, u64) {
        (word >> self.token_bits, word & self.token_mask())
    }

    /// The first state word at `now_ns`: full (see [`BucketParams::rephase`]).
    pub(crate) const fn full(&self, now_ns: u64) -> u64 {
        // The stamp field keeps the tick modulo its width, as always.
        self.pack(self.rephase(now_ns) as u64, self.cap)
    }

    /// Where to count refills from once the bucket is full at `now_ns`: the first tick whose whole
    /// unit count has reached the exact refill position `now × rate / tick`, rounded up. The exact
    /// bucket drops everything accrued before the instant it is full; a grid that kept the part of
    /// a unit accrued since its last whole unit (or since the start of the tick) would run ahead
    /// of it.
    ///
    /// Worked out relative to now's tick, whose position is `A = tick × rate`: the exact position
    /// lies `d = ceil(f × rate / 2^shift)` past it (`f` the nanoseconds into the tick), and tick
    /// `tick + k` has reached it when `k × rate` covers `d` and the fraction of a unit it holds,
    /// which depends only on `A`'s low bits. So one full product (`f × rate`) and one wrapping
    /// one, where the absolute positions took two full products. Walks forward by adding `rate`:
    /// the gap is under one unit plus one tick and a tick adds more than half a unit, so it stops
    /// within three steps (bounded at four regardless).
    #[inline]
    pub(crate) const fn rephase(&self, now_ns: u64) -> u128 {
        // At most 63 (said so, the shifts need no test for a shift past a word).
        let shift = self.shift & 63;
        let tick = now_ns >> shift;
        let into = now_ns & self.masks.into;
        let rate = self.rate as u128;
        // Rounded up, by shifting: `into × rate` is below 2^127, so the addition cannot overflow;
        // and `into` is below `2^shift`, so `d` is at most `rate`, a word.
        let d = ((into as u128 * rate + self.masks.into as u128) >> shift) as u64 as u128;
        let fraction = (1u64 << RATE_FRAC) - 1;
        let low = tick.wrapping_mul(self.rate) & fraction;
        let mut k = 0u64;
        let mut covered = 0u128;
        // Tick `tick + k` holds `(low + k × rate) mod 2^RATE_FRAC` of a unit past its whole count.
        while k < 4 && covered < d + ((low.wrapping_add(covered as u64) & fraction) as u128) {
            k += 1;
            covered += rate;
        }
        // Wide: at the end of time the next unit boundary lies past tick u64::MAX.
        tick as u128 + k as u128
    }

    /// The tick length in ns.
    pub(crate) const fn tick_ns(&self) -> u64 {
        1 << self.shift
    }

    /// How long an idle stays readable, in ns (saturating): 3/4 of the stamp cycle, or all of it
    /// but the stall margin on a monotonic clock, less one tick. The threshold's own count of
    /// elapsed ticks already reads as a stall (or a step back); an idle of `threshold - 1` whole
    /// ticks spans exactly that many from any phase of its first tick, one ns more can span the
    /// threshold.
    pub(crate) const fn idle_horizon_ns(&self, monotonic: bool) -> u64 {
        let ticks = if monotonic {
            self.stall_from()
        } else {
            self.backward_from()
        } - 1;
        let ns = (ticks as u128) << self.shift;
        if ns > u64::MAX as u128 {
            u64::MAX
        } else {
            ns as u64
        }
    }

    /// The largest backwards clock step told apart from a long idle, in ns (saturating), less
    /// the four ticks a re-phased stamp may sit ahead of the clock and one tick of rounding: a
    /// quarter of the stamp cycle, or the stall margin on a monotonic clock (whose readings only
    /// trail each other by stale reads, which a fresh reading settles).
    pub(crate) const fn backward_tolerance_ns(&self, monotonic: bool) -> u64 {
        let from = if monotonic {
            self.stall_from()
        } else {
            self.backward_from()
        };
        let ticks = self.stamp_mask() + 1 - from;
        let ns = ((ticks - 5) as u128) << self.shift;
        if ns > u64::MAX as u128 {
            u64::MAX
        } else {
            ns as u64
        }
    }
}

/// `ceil(x / d)` for `d > 0`. When the quotient fits 64 bits (the high word below `d`: a wait
/// below 2^64 ns from its tick), one hardware division of the 128-bit `x` where there is one;
/// the compiler's 128-bit division is a call that divides again to find the remainder.
#[inline(always)]
#[allow(unsafe_code)]
fn div_ceil_wide(x: u128, d: u64) -> u128 {
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

/// What a decision needs to answer `remaining`, `retry_after` and `reset_after` later: the
/// state it was made on, and the three parameters the answers use, kept small because a decision
/// is returned on the hot path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct BucketFigures {
    pub(crate) now_ns: u64,
    /// Units refilled per tick ([`BucketParams::rate`]).
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
    /// The figures of a decision at `now_ns` made on a base tick, the units held after it and the
    /// units the request lacked.
    #[inline(always)]
    const fn new(
        now_ns: u64,
        base: u128,
        tokens: u64,
        need: u64,
        p: &BucketParams,
    ) -> BucketFigures {
        // `refilled` never puts the base behind now's tick, nor more than a cycle (2^53 ticks)
        // ahead; saturating all the same.
        let ahead = base.saturating_sub((now_ns >> p.shift) as u128);
        BucketFigures {
            now_ns,
            rate: p.rate,
            ahead: if ahead > u64::MAX as u128 {
                u64::MAX
            } else {
                ahead as u64
            },
            // Both at most the cap, `burst × UNIT` < 2^31 (`MAX_TOKEN_BITS`).
            tokens: tokens as u32,
            need: need as u32,
            burst: p.burst,
            shift: p.shift as u8,
        }
    }

    /// The absolute base tick.
    #[inline]
    const fn base(&self) -> u128 {
        (self.now_ns >> self.shift) as u128 + self.ahead as u128
    }

    const fn cap(&self) -> u64 {
        self.burst as u64 * UNIT
    }

    /// The figures as a decision's detail.
    #[inline(always)]
    pub(crate) const fn detail(self) -> Detail {
        Detail::Bucket {
            now_ns: self.now_ns,
            rate: self.rate,
            ahead: self.ahead,
            tokens: self.tokens,
            need: self.need,
            burst: self.burst,
            shift: self.shift,
        }
    }

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
        let at = if tokens + more == self.cap() && numerator.leading_zeros() >= shift {
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

/// What one step decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Store `word`.
    Allow { word: u64, figures: BucketFigures },
    /// Store nothing.
    Deny { figures: BucketFigures },
    /// Nothing decided: read the clock again and decide on [`Reading::Fresh`].
    Recheck,
}

/// The bucket refilled to `now_ns`: `(base, held, stamp)`, the absolute tick refills count from,
/// the units held, and the stamp to store with them; `None` when the reading must be taken again.
///
/// The two common cases are decided here, inlined into the check: a reading less than half a
/// cycle past the stamp that leaves the bucket clearly below its cap, or full on the grid. The
/// rest (a clock behind the stamp, a long idle, a bucket within the grid's lag of its cap) is
/// [`refilled_rare`], which decides every case the same way.
#[inline(always)]
const fn refilled(
    word: u64,
    now_ns: u64,
    p: &BucketParams,
    reading: Reading,
) -> Option<(u128, u64, u64)> {
    let (stamp, tokens) = p.unpack(word);
    let (now_tick, elapsed) = p.elapsed(stamp, now_ns);
    if elapsed < p.recheck_from() {
        let room = p.cap - tokens;
        // Full for sure, told without the products (a stream below its quota finds its bucket
        // full on most checks): the same answer as the test on the refill below.
        if elapsed <= now_tick && p.surely_refills(elapsed, room) {
            return Some(full_at(now_ns, p));
        }
        // As in `refilled_rare`: the same units, the same tests, in the same order.
        let refill = grid_refill(now_tick, elapsed, p);
        if refill + p.grid_lag < room {
            return Some((now_tick as u128, tokens + refill, now_tick));
        }
        if refill >= room {
            return Some(full_at(now_ns, p));
        }
    } else if elapsed >= p.stall_from() && tokens < p.cap {
        // A stamp a little ahead (re-phased, or another core's): behind for every reading,
        // nothing refilled, the stamp kept; a bucket below its cap never re-anchors.
        let ahead = p.stamp_mask() - elapsed + 1;
        return Some((now_tick as u128 + ahead as u128, tokens, stamp));
    }
    refilled_rare(word, now_ns, p, reading)
}

/// [`refilled`] in full, every case: out of line, so that the check's common path stays short.
#[cold]
#[inline(never)]
const fn refilled_rare(
    word: u64,
    now_ns: u64,
    p: &BucketParams,
    reading: Reading,
) -> Option<(u128, u64, u64)> {
    let (stamp, tokens) = p.unpack(word);
    let (now_tick, elapsed) = p.elapsed(stamp, now_ns);
    // The common case, a reading less than half a cycle past the stamp, is one comparison; the
    // thresholds that depend on how far the reading is trusted are worked out only past it.
    let behind = elapsed >= p.recheck_from() && {
        let behind_from = match reading {
            Reading::Any => p.backward_from(),
            Reading::Monotonic | Reading::Fresh => p.stall_from(),
        };
        // Stale, or an idle past half the cycle? Only a reading taken after the word can tell.
        if matches!(reading, Reading::Monotonic) && elapsed < behind_from {
            return None;
        }
        elapsed >= behind_from
    };
    // Did the clock step back behind the stamp? Then refill nothing and keep the stamp.
    Some(if behind {
        let behind = p.stamp_mask() - elapsed + 1;
        let stamp_abs = now_tick as u128 + behind as u128;
        // Refills count from a stamp still ahead (set when the bucket was last full, or before the
        // clock stepped back). Still full? Then a take re-anchors at the exact position of now, if
        // that is later than the stamp, as the exact bucket restarts its refill at the take.
        let from = p.rephase(now_ns);
        if tokens == p.cap && from > stamp_abs {
            (from, tokens, from as u64)
        } else {
            (stamp_abs, tokens, stamp)
        }
    } else {
        // elapsed <= now_tick for any stamp this clock could have written; a clock stepped back
        // further than the backward tolerance can break that (a stamp far ahead read as a long
        // idle, as documented): count from tick 0 then, rather than underflow.
        let stamp_abs = now_tick.saturating_sub(elapsed);
        // At most elapsed × UNIT + 1 < 2^63: fits.
        let at_now = now_tick as u128 * p.rate as u128;
        let from_units = p.units(stamp_abs);
        let refill = ((at_now >> RATE_FRAC) - from_units) as u64;
        // Far from the cap (further below than the grid can trail the exact refill)? Then the
        // whole-unit refill is all there is to it.
        if refill + p.grid_lag < p.cap - tokens {
            (now_tick as u128, tokens + refill, now_tick)
        } else {
            // Near the cap: is the *exact* bucket full? (Surely, if the grid already is.)
            let exact = now_ns as u128 * p.rate as u128;
            let full = refill >= p.cap - tokens
                || ((tokens as u128) << RATE_FRAC) + (exact >> p.shift) - (from_units << RATE_FRAC)
                    >= (p.cap as u128) << RATE_FRAC;
            if full {
                full_at(now_ns, p)
            } else {
                (now_tick as u128, tokens + refill, now_tick)
            }
        }
    })
}

/// The bucket full at `now_ns`, for both paths of [`refilled`]. The exact bucket drops the excess
/// and everything accrued before this nanosecond; so must the grid, or it would run ahead of exact
/// time: the next refill counts from the first tick at or past the exact position (a stamp in the
/// future reads as "no refill yet").
#[inline(always)]
const fn full_at(now_ns: u64, p: &BucketParams) -> (u128, u64, u64) {
    #[cfg(not(atomic_limiter_seeded_bug = "bucket"))]
    let from = p.rephase(now_ns);
    // The fuzzers' teeth check: no re-phase, so the part of a unit accrued on the grid is kept at
    // the cap (the lead the property tests first found).
    #[cfg(atomic_limiter_seeded_bug = "bucket")]
    let from = (now_ns >> p.shift) as u128;
    (from, p.cap, from as u64)
}

/// Whether a denial that left `held` units, decided at `made_ns`, is the step's answer on the same
/// word at `later_ns` too (each read as `Reading::of` has it: a denial is never a recheck, and
/// where the two kinds of reading differ a monotonic one asks for a recheck). Every case of
/// [`refilled`] that can deny depends on the reading only through its tick, but the one near the
/// cap, which also asks where the exact bucket stands within the tick: a denial that left the
/// bucket further below its cap than the grid can trail never came from it.
#[inline(always)]
pub(crate) const fn denial_stands(
    held: u64,
    made_ns: u64,
    later_ns: u64,
    p: &BucketParams,
) -> bool {
    made_ns >> p.shift == later_ns >> p.shift && held + p.grid_lag < p.cap
}

/// The step's answer on the same word at `later_ns`, a later tick than the denial at `made_ns`
/// that left `held` units and lacked `need` (its base `ahead` ticks past its reading's), when it
/// is a denial again: `None` where only the step can tell.
///
/// The later tick refills from the base as the step would (nothing while the base is still
/// ahead), and the step reads it the same way while the bucket stays further below its cap
/// than the grid can trail ([`denial_stands`]) and the request still lacks something: a denial
/// never comes from an idle near a threshold of the stamp's cycle (an idle of a sixteenth of the
/// cycle fills the bucket), and a stamp ahead stays ahead until the reading reaches it. Up to
/// 2^20 ticks later (a coarse clock lags by milliseconds), which keeps the refill within a word.
#[inline(always)]
pub(crate) const fn denial_carried(
    (ahead, held, need): (u64, u64, u64),
    made_ns: u64,
    later_ns: u64,
    p: &BucketParams,
) -> Option<(u64, u64, u64)> {
    let made = made_ns >> p.shift;
    let later = later_ns >> p.shift;
    if later <= made || later - made >= 1 << 20 || held + p.grid_lag >= p.cap {
        return None;
    }
    let Some(base) = made.checked_add(ahead) else {
        return None;
    };
    if later < base {
        return Some((base - later, held, need));
    }
    // `units(later) - units(base)` from one full product where `BucketParams::units` takes two
    // (the second cost a coarse denial at 100/s about 0.07x of GCRA's time): the base's own
    // position enters only through the part of a unit it holds, the low bits of a wrapping
    // product.
    let accrued = base.wrapping_mul(p.rate) & ((1 << RATE_FRAC) - 1);
    let refill = (((later - base) as u128 * p.rate as u128 + accrued as u128) >> RATE_FRAC) as u64;
    if refill >= need || held + refill + p.grid_lag >= p.cap {
        return None;
    }
    Some((0, held + refill, need - refill))
}

/// Whether the step at `now_ns` refuses `n` tokens on `word`, told from an upper bound on the
/// refill (one product) where the step's refill takes two: a request that lacks more than that
/// bound and the grid's lag is refused on [`refilled`]'s common path, which [`refused`] then
/// retraces for the figures, only when they are read. Over `elapsed` ticks the whole-unit refill
/// is a difference of floors, at most `floor(elapsed × rate / 2^RATE_FRAC) + 1`.
///
/// Asked first: a bucket that holds the cost answers at its first comparison, so an admission
/// pays two instructions for it.
#[inline(always)]
pub(crate) const fn surely_refused(word: u64, now_ns: u64, n: u32, p: &BucketParams) -> bool {
    let (stamp, tokens) = p.unpack(word);
    let cost = n as u64 * UNIT;
    if tokens >= cost {
        return false;
    }
    let (_, elapsed) = p.elapsed(stamp, now_ns);
    // A stamp a little ahead: nothing refilled, on every reading.
    if elapsed >= p.stall_from() {
        return true;
    }
    // Below the cycle (2^53 ticks), so the bound is a word even for a saturated rate; the sum is
    // asked only below half of it, where it is below 2^63. A stamp read as lying before tick 0
    // refills from tick 0, less than the bound.
    let most = ((elapsed as u128 * p.rate as u128) >> RATE_FRAC) as u64 + 1;
    elapsed < p.recheck_from() && tokens + most + p.grid_lag < cost
}

/// The figures of the refusal [`surely_refused`] told, as [`refilled`] works them out in the
/// two cases that function tells: a stamp ahead (nothing refilled, refills counting from the
/// stamp), and the common path (the refill, below the room less the grid's lag, neither surely
/// fills the bucket nor brings it near its cap).
#[inline(always)]
pub(crate) const fn refused(word: u64, now_ns: u64, n: u32, p: &BucketParams) -> BucketFigures {
    let (stamp, tokens) = p.unpack(word);
    let (now_tick, elapsed) = p.elapsed(stamp, now_ns);
    let (base, held) = if elapsed >= p.stall_from() {
        let ahead = p.stamp_mask() - elapsed + 1;
        (now_tick as u128 + ahead as u128, tokens)
    } else {
        (now_tick as u128, tokens + grid_refill(now_tick, elapsed, p))
    };
    // Below the cost where `surely_refused` holds; within the cap and at least one unit lacking
    // all the same, so that no figure can come out of range.
    let held = if held < p.cap { held } else { p.cap };
    let need = (n as u64 * UNIT).saturating_sub(held);
    let need = if need == 0 { 1 } else { need };
    BucketFigures::new(now_ns, base, held, need, p)
}

/// The whole units refilled over the `elapsed` ticks up to `now_tick`, counted from tick 0 if
/// they reach back past it.
#[inline(always)]
const fn grid_refill(now_tick: u64, elapsed: u64, p: &BucketParams) -> u64 {
    let stamp_abs = now_tick.saturating_sub(elapsed);
    // At most elapsed × UNIT + 1 < 2^63: fits.
    let at_now = now_tick as u128 * p.rate as u128;
    ((at_now >> RATE_FRAC) - p.units(stamp_abs)) as u64
}

/// One token-bucket step for `n <= burst` tokens at `now_ns`.
#[inline(always)]
pub(crate) const fn decide(
    word: u64,
    now_ns: u64,
    n: u32,
    p: &BucketParams,
    reading: Reading,
) -> Outcome {
    let Some((base, held, stamp)) = refilled(word, now_ns, p, reading) else {
        return Outcome::Recheck;
    };
    let cost = n as u64 * UNIT;
    if held >= cost {
        Outcome::Allow {
            word: p.pack_held(stamp, held - cost),
            figures: BucketFigures::new(now_ns, base, held - cost, 0, p),
        }
    } else {
        Outcome::Deny {
            figures: BucketFigures::new(now_ns, base, held, cost - held, p),
        }
    }
}

/// The units the grid may run ahead of the exact refill, just after a carry puts the stamp at
/// the tick that holds the change's instant: up to a tick's refill (one unit, the tick being at
/// most a unit) counted before that instant, up to one unit already accrued on the grid at that
/// tick, and one unit for the rate rounded down on the way in.
const CARRY_MARGIN: u64 = 3;

/// The word that carries `word`, read at `now_ns`, over to the bucket `to` at the same instant.
/// What the bucket lacks of full (its debt) is kept as time, or as its share of the cap
/// (`proportional`); either way the new bucket holds [`CARRY_MARGIN`] less than that, so that its
/// grid, counted from the change's tick, is never ahead of the exact bucket carried the same way.
/// A full bucket stays full, re-phased as at creation.
pub(crate) fn carry(
    word: u64,
    now_ns: u64,
    from: &BucketParams,
    to: &BucketParams,
    proportional: bool,
) -> u64 {
    // A fresh reading: the change read the clock after it took the word.
    let Some((base, held, _)) = refilled(word, now_ns, from, Reading::Fresh) else {
        return to.pack(now_ns >> to.shift, 0);
    };
    if held >= from.cap {
        return to.full(now_ns);
    }
    let missing = u128::from(from.cap - held);
    let carried = if proportional {
        (missing * u128::from(to.cap)).div_ceil(u128::from(from.cap))
    } else {
        // The debt as time: until refills start (a stamp still ahead), then the missing units at
        // the old rate; in new units at the new rate, rounded up.
        let start = (base << from.shift).saturating_sub(u128::from(now_ns));
        // Whole ticks (rounded up), then ns: `missing << RATE_FRAC` < 2^84, and a tick of 2^shift
        // ns may take the product past 128 bits only for quotas whose debt is centuries.
        let ticks = (missing << RATE_FRAC).div_ceil(u128::from(from.rate.max(1)));
        let refill_ns = ticks.saturating_mul(1 << from.shift);
        let debt_ns = start.saturating_add(refill_ns);
        debt_ns
            .saturating_mul(u128::from(to.rate))
            .div_ceil(1u128 << (RATE_FRAC + to.shift))
    };
    let held = u128::from(to.cap).saturating_sub(carried + u128::from(CARRY_MARGIN));
    // Below the cap, so within the token field.
    to.pack(now_ns >> to.shift, held as u64)
}

/// Gives back `cost` units taken moments ago and never used: added to the units held as of the
/// stamp (so never past the cap), then refilled to `now_ns` with the same cap test as a check, so a
/// bucket made full by the return re-phases like any other. `None` when nothing changes.
#[inline]
pub(crate) const fn give_back(word: u64, now_ns: u64, cost: u64, p: &BucketParams) -> Option<u64> {
    let (stamp, tokens) = p.unpack(word);
    let sum = tokens + cost;
    let topped = p.pack(stamp, if sum > p.cap { p.cap } else { sum });
    // A step back is read as one (the conservative reading): a give-back never needs another.
    let Some((_, held, stamp)) = refilled(topped, now_ns, p, Reading::Any) else {
        return None;
    };
    let new = p.pack(stamp, held);
    if new == word { None } else { Some(new) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::time::Duration;

    /// The hardware division's path and the portable one agree at the edges of its range.
    #[test]
    fn a_wide_ceiling_division_is_the_exact_one() {
        let ds = [
            1u64,
            2,
            3,
            (1 << 52) + 1,
            (1 << 63) - 25,
            u64::MAX - 1,
            u64::MAX,
        ];
        for d in ds {
            for hi in [0u64, 1, d / 2, d.saturating_sub(1), d, u64::MAX] {
                for lo in [0u64, 1, d - 1, d, u64::MAX - 1, u64::MAX] {
                    let x = (u128::from(hi) << 64) | u128::from(lo);
                    assert_eq!(div_ceil_wide(x, d), x.div_ceil(u128::from(d)), "{x} / {d}");
                }
            }
        }
    }

    #[test]
    fn layout_round_trips() {
        for burst in [1, 10, 1000, Quota::MAX_BURST] {
            let p = BucketParams::new(&Quota::per_second(1).with_burst(burst));
            let stamp_max = u64::MAX >> p.token_bits;
            for (s, t) in [
                (0, 0),
                (stamp_max, p.cap),
                (12345, p.cap / 3),
                (stamp_max / 2, 7),
            ] {
                assert_eq!(p.unpack(p.pack(s, t)), (s, t), "burst {burst}");
            }
        }
    }

    #[test]
    fn field_widths_follow_the_burst() {
        assert_eq!(BucketParams::new(&Quota::per_second(1)).token_bits, 11);
        assert_eq!(BucketParams::new(&Quota::per_second(10)).token_bits, 14);
        let max = BucketParams::new(&Quota::per_second(1000).with_burst(Quota::MAX_BURST));
        assert_eq!(max.token_bits, MAX_TOKEN_BITS);
    }

    #[test]
    fn tick_is_at_most_a_unit() {
        let one_per_sec = BucketParams::new(&Quota::per_second(1));
        // 2^19 ns = 524 µs <= 1 s / 1024 = 976 µs < 2^20 ns.
        assert_eq!(one_per_sec.shift, 19);
        let fast = BucketParams::new(&Quota::per_second(7_000_000));
        assert_eq!(fast.shift, 0);
        let century = BucketParams::new(&Quota::with_period(Duration::from_secs(3_153_600_000)));
        assert!(century.units(1) <= 1);
    }

    /// `surely_refills` shifts down by one, counting on a tick to refill at least half a unit:
    /// at the finest and coarsest periods, the largest and smallest bursts, and periods a
    /// nanosecond either side of a tick's power of two.
    #[test]
    fn rate_is_at_least_half_a_unit_a_tick() {
        let windows = [
            1,
            1023,
            1024,
            1025,
            2047,
            2048,
            2049,
            1 << 30,
            (1 << 31) - 1,
        ];
        let extremes = [
            Quota::MAX_WINDOW,
            Quota::MAX_WINDOW / 1024,
            Quota::MAX_WINDOW - 1,
        ];
        for per_ns in windows.into_iter().chain(extremes) {
            for burst in [1, 2, 1000, Quota::MAX_BURST] {
                for rate in [1, 3, 128, 1_000_000_000] {
                    let Ok(q) = Quota::try_from_nanos(rate, per_ns, burst) else {
                        continue;
                    };
                    let p = BucketParams::new(&q);
                    assert!(p.rate >= 1 << (RATE_FRAC - 1), "{q:?}: rate {}", p.rate);
                }
            }
        }
    }

    #[test]
    fn rephase_lands_on_the_first_tick_at_or_past_the_exact_position() {
        for q in [
            Quota::per_second(1),
            Quota::per_second(3),
            Quota::per_second(7_000_000),
        ] {
            let p = BucketParams::new(&q);
            for now in [0u64, 1, 2, 3, 1000, 123_456_789, 1 << 40, 1 << 60, u64::MAX] {
                let to = p.rephase(now);
                let tick = (now >> p.shift) as u128;
                assert!(to >= tick && to - tick <= 3, "{q:?} {now}");
                // The unit count at the new stamp has reached the exact position (rounded up) ...
                assert!(
                    p.units_wide(to) << RATE_FRAC
                        >= (now as u128 * p.rate as u128).div_ceil(1 << p.shift),
                    "{q:?} {now}"
                );
                // ... and no earlier tick would do.
                if to > tick {
                    assert!(
                        p.units_wide(to - 1) << RATE_FRAC
                            < (now as u128 * p.rate as u128).div_ceil(1 << p.shift),
                        "{q:?} {now}"
                    );
                }
            }
        }
    }

    // Pure arithmetic, so nothing for Miri to see; and proptest's file of failing seeds needs the
    // working directory, which Miri's isolation hides.
    #[cfg(not(miri))]
    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// Any quota a bucket takes: `rate` per `per_ns`, from a fraction of a nanosecond to hours
        /// a token, bursts up to the largest (ticks coarsened to keep sixteen fills per cycle).
        fn any_quota() -> impl Strategy<Value = Quota> {
            (
                prop_oneof![Just(1u64), 1u64..=1_000_000_000],
                1u64..=10_000_000_000_000,
                prop_oneof![1u32..=100, 1u32..=Quota::MAX_BURST],
            )
                .prop_filter_map("not a quota", |(rate, per_ns, burst)| {
                    Quota::try_from_nanos(rate, per_ns, burst).ok()
                })
        }

        /// Readings near the start of time, near its end, on a tick's edges, or anywhere.
        fn reading() -> impl Strategy<Value = u64> {
            prop_oneof![
                0u64..4096,
                (0u64..4096).prop_map(|k| u64::MAX - k),
                (any::<u64>(), 0u64..3).prop_map(|(t, k)| (t >> 20 << 20).wrapping_sub(k)),
                any::<u64>(),
            ]
        }

        /// [`BucketParams::rephase`] as first written, on absolute positions: two full products.
        fn rephase_on_absolute_positions(p: &BucketParams, now_ns: u64) -> u128 {
            let tick = now_ns >> p.shift;
            let mut at_tick = tick as u128 * p.rate as u128;
            let target = (now_ns as u128 * p.rate as u128).div_ceil(1 << p.shift);
            let whole = !((1u128 << RATE_FRAC) - 1);
            let mut to = tick as u128;
            while at_tick & whole < target && to - (tick as u128) < 4 {
                to += 1;
                at_tick += p.rate as u128;
            }
            to
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(4096))]

            /// The re-phase worked out relative to now's tick lands on the tick the absolute
            /// positions give.
            #[test]
            fn the_relative_rephase_is_the_absolute_one(q in any_quota(), now in reading()) {
                let p = BucketParams::new(&q);
                prop_assert_eq!(p.rephase(now), rephase_on_absolute_positions(&p, now));
            }

            /// A tick refills at least half a unit, whatever the quota.
            #[test]
            fn a_tick_refills_half_a_unit(q in any_quota()) {
                let p = BucketParams::new(&q);
                prop_assert!(p.rate >= 1 << (RATE_FRAC - 1), "rate {}", p.rate);
            }

            /// Ticks that surely refill the room do refill at least that much, from any stamp.
            #[test]
            fn a_sure_refill_is_one(
                q in any_quota(),
                stamp in any::<u64>(),
                elapsed in prop_oneof![0u64..5000, any::<u64>()],
                room in any::<u64>(),
            ) {
                let p = BucketParams::new(&q);
                let elapsed = elapsed % p.recheck_from();
                let stamp = (stamp >> p.shift).min(u64::MAX - elapsed);
                let room = room % (p.cap + 1);
                if p.surely_refills(elapsed, room) {
                    let refill = p.units(stamp + elapsed) - p.units(stamp);
                    prop_assert!(refill >= u128::from(room), "{} < {}", refill, room);
                }
            }
        }

        /// Periods from a nanosecond to hours (ticks from 1 ns to seconds), bursts to 5 000.
        fn quota() -> impl Strategy<Value = Quota> {
            (1u64..=10_000_000_000_000, 1u32..=5000).prop_map(|(period_ns, burst)| {
                Quota::with_period(Duration::from_nanos(period_ns)).with_burst(burst)
            })
        }

        /// A share: often exactly all, often nearly all (a bucket near its cap, a request of the
        /// whole burst), else anything.
        fn share() -> impl Strategy<Value = f64> {
            prop_oneof![Just(1.0), 0.95f64..=1.0, 0.0f64..=1.0]
        }

        /// Where the reading falls: a few ticks past the stamp, a few short of the cycle (a stamp
        /// ahead), within a few ticks of the one that fills the bucket, a few short of three
        /// quarters of the cycle (where a clock that may step back reads a step back), or
        /// anywhere.
        #[derive(Debug, Clone, Copy)]
        enum Lead {
            Past(u64),
            Short(u64),
            Filling(u64),
            Quarter(u64),
            Any(u64),
        }

        /// Whether a clock can write `stamp`: a stamp is a tick of some reading, or a re-phase at
        /// most four ticks past one, and with ticks of 2^shift ns the readings of a `u64` reach
        /// tick `u64::MAX >> shift` only. Where the stamp's cycle is longer, a stamp past that
        /// (read at a tick near 0 as an idle longer than the clock has run) is no word a bucket
        /// holds.
        fn reachable(p: &BucketParams, stamp: u64) -> bool {
            let last = (u64::MAX >> p.shift) + 4;
            p.stamp_mask() <= last || stamp <= last
        }

        /// The reading's tick, from any `tick`, and the stamp `lead` ticks before it in the
        /// cycle (`Filling` counts from the tick whose refill brings `lack` units, give or take a
        /// few); `None` for a stamp no clock can write.
        fn placed(p: &BucketParams, lead: Lead, tick: u64, lack: u64) -> Option<(u64, u64)> {
            let lead = match lead {
                Lead::Past(k) | Lead::Any(k) => k,
                Lead::Short(k) => p.stamp_mask() - k,
                Lead::Quarter(k) => p.backward_from() - 1 - k,
                Lead::Filling(k) => {
                    let ticks = (u128::from(lack) << RATE_FRAC) / u128::from(p.rate.max(1));
                    (ticks as u64 + k).saturating_sub(6)
                }
            };
            let tick = tick >> p.shift;
            let stamp = tick.wrapping_sub(lead) & p.stamp_mask();
            reachable(p, stamp).then_some((tick, stamp))
        }

        fn lead() -> impl Strategy<Value = Lead> {
            prop_oneof![
                (0u64..64).prop_map(Lead::Past),
                (0u64..64).prop_map(Lead::Short),
                (0u64..12).prop_map(Lead::Filling),
                (0u64..64).prop_map(Lead::Quarter),
                any::<u64>().prop_map(Lead::Any),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(4096))]

            /// A denial that `denial_stands` at a later reading, or that `denial_carried` carries
            /// to it, is exactly the step's answer there, on a monotonic clock (a stale reading,
            /// then a fresh one) and on one that may step back.
            #[test]
            fn a_denial_that_stands_is_the_answer_at_the_later_reading(
                q in quota(),
                tick in any::<u64>(),
                fill in share(),
                asked in share(),
                lead in lead(),
                within in any::<(u64, u64)>(),
                apart in prop_oneof![Just(0u32), Just(2u32), 0u32..=20],
                monotonic in any::<bool>(),
            ) {
                let p = BucketParams::new(&q);
                let tokens = (p.cap as f64 * fill) as u64;
                let n = ((f64::from(q.burst()) * asked).ceil() as u32).clamp(1, q.burst());
                // `Filling`: near the tick whose refill reaches the cap.
                let Some((tick, stamp)) = placed(&p, lead, tick, p.cap - tokens) else {
                    return Ok(());
                };
                let word = p.pack(stamp, tokens);
                // Two readings: in the same tick, across the next edge, or up to 2^21 ticks apart
                // (a coarse clock's reading that lags a few milliseconds spans many short ticks).
                let span = 1u64 << p.shift;
                let made = (tick << p.shift) | (within.0 % span);
                let later = made.saturating_add(within.1 % span.saturating_mul(2 << apart));
                let (first, second) = if monotonic {
                    (Reading::Monotonic, Reading::Fresh)
                } else {
                    (Reading::Any, Reading::Any)
                };
                let Outcome::Deny { figures } = decide(word, made, n, &p, first) else {
                    return Ok(());
                };
                let denial = (figures.ahead, u64::from(figures.tokens), u64::from(figures.need));
                let carried = if denial_stands(denial.1, made, later, &p) {
                    Some(denial)
                } else {
                    denial_carried(denial, made, later, &p)
                };
                if let Some((ahead, held, need)) = carried {
                    let again = decide(word, later, n, &p, second);
                    let expected = Outcome::Deny {
                        figures: BucketFigures {
                            now_ns: later,
                            ahead,
                            tokens: held as u32,
                            need: need as u32,
                            ..figures
                        },
                    };
                    prop_assert_eq!(again, expected);
                }
            }

            /// A refusal told for sure is the step's refusal with the step's figures, however far
            /// the reading is trusted.
            #[test]
            fn a_sure_refusal_is_the_steps(
                q in quota(),
                tick in any::<u64>(),
                fill in share(),
                asked in share(),
                lead in lead(),
                within in any::<u64>(),
            ) {
                let p = BucketParams::new(&q);
                let tokens = (p.cap as f64 * (1.0 - fill)) as u64;
                let n = ((f64::from(q.burst()) * asked).ceil() as u32).clamp(1, q.burst());
                let cost = u64::from(n) * UNIT;
                // `Filling`: near the tick where the bound stops telling, the refill lacking only
                // the grid's lag.
                let lack = cost.saturating_sub(tokens + p.grid_lag);
                let Some((tick, stamp)) = placed(&p, lead, tick, lack) else {
                    return Ok(());
                };
                let word = p.pack(stamp, tokens);
                let now = (tick << p.shift) | (within & p.masks.into);
                if surely_refused(word, now, n, &p) {
                    let expected = Outcome::Deny { figures: refused(word, now, n, &p) };
                    for reading in [Reading::Any, Reading::Monotonic, Reading::Fresh] {
                        prop_assert_eq!(decide(word, now, n, &p, reading), expected);
                    }
                }
            }
        }
    }

    /// A drained bucket read a little later is refused for sure, and the figures are the step's;
    /// read once it has refilled, it is not.
    #[test]
    fn a_drained_bucket_is_surely_refused_until_it_refills() {
        let p = BucketParams::new(&Quota::per_second(100).with_burst(1));
        let drained_at = 5_000_000_000;
        let word = p.pack(drained_at >> p.shift, 0);
        let soon = drained_at + 1_000_000;
        assert!(surely_refused(word, soon, 1, &p));
        let Outcome::Deny { figures } = decide(word, soon, 1, &p, Reading::Monotonic) else {
            panic!("a drained bucket admitted");
        };
        assert_eq!(refused(word, soon, 1, &p), figures);
        assert!(
            figures.tokens > 0,
            "a millisecond refills a tenth of a token"
        );
        assert!(!surely_refused(word, drained_at + 10_000_000, 1, &p));
        assert!(
            !surely_refused(word, soon, 0, &p),
            "a peek is never refused"
        );
    }

    #[test]
    fn big_bursts_coarsen_the_tick_to_keep_sixteen_fills_per_cycle() {
        let q = Quota::per_second(1000).with_burst(1 << 20);
        let p = BucketParams::new(&q);
        let fill_ticks = q.fill_time().as_nanos() >> p.shift;
        assert!(fill_ticks <= 1u128 << (p.stamp_bits() - FILL_FRACTION_BITS));
        assert!(p.idle_horizon_ns(false) >= 16 * 3 / 4 * q.fill_time().as_nanos() as u64);
    }
}
