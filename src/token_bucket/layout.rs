//! The packed token bucket's word and parameters: its layout, its ticks and its clock rules;
//! the arithmetic on it is pure (old word and a clock reading in, new word and a verdict out).
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

use crate::decision::bucket::{RATE_FRAC, UNIT};
use crate::quota::Quota;

/// The widest token field: 21 integer bits for `Quota::MAX_BURST`, and [`FRAC_BITS`].
pub(crate) const MAX_TOKEN_BITS: u32 = 31;
/// A full refill takes at most `2^-FILL_FRACTION_BITS` of the stamp cycle.
pub(crate) const FILL_FRACTION_BITS: u32 = 4;

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
    pub(super) masks: Masks,
}

/// [`BucketParams`]' layout figures, each a function of `token_bits` and `shift`, and the shifts
/// that bound a refill from below, of `rate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Masks {
    /// The low `token_bits` bits.
    pub(super) tokens: u64,
    /// The low `64 - token_bits` bits: the stamp field, shifted down.
    pub(super) stamp: u64,
    /// [`BucketParams::recheck_from`].
    pub(super) recheck: u64,
    /// [`BucketParams::stall_from`]: compared with whenever a stamp re-phased into the next tick
    /// or two is read back.
    pub(super) stall: u64,
    /// The nanoseconds into a tick: the low `shift` bits of a reading.
    pub(super) into: u64,
    /// [`BucketParams::surely_refills`]' shift: `k + 1 - RATE_FRAC` for the rate's power of two,
    /// `2^k <= rate`, so that `(elapsed << up) >> 1 == floor(elapsed × 2^(k - RATE_FRAC))`.
    pub(super) up: u32,
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
    pub(super) const fn surely_refills(&self, elapsed: u64, room: u64) -> bool {
        (elapsed << (self.masks.up & 63)) >> 1 >= room
    }

    #[inline]
    pub(super) const fn stamp_bits(&self) -> u32 {
        64 - self.token_bits
    }

    #[inline]
    pub(super) const fn stamp_mask(&self) -> u64 {
        self.masks.stamp
    }

    #[inline]
    pub(super) const fn token_mask(&self) -> u64 {
        self.masks.tokens
    }

    /// Elapsed readings at or above this many ticks are a clock that stepped back (any clock).
    #[inline]
    pub(super) const fn backward_from(&self) -> u64 {
        3 << (self.stamp_bits() - 2)
    }

    /// Elapsed readings at or above this many ticks are a stall on a monotonic clock: the last
    /// `L` ticks of the cycle, `L` the larger of 8 ticks and 2^20 ns, at most a quarter cycle.
    #[inline]
    pub(crate) const fn stall_from(&self) -> u64 {
        self.masks.stall
    }

    /// [`BucketParams::stall_from`] worked out, once the stamp mask is.
    pub(super) const fn stall_threshold(&self) -> u64 {
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
    pub(super) const fn recheck_from(&self) -> u64 {
        self.masks.recheck
    }

    /// Units refilled from tick 0 to `tick`, rounded down.
    #[inline]
    pub(crate) const fn units(&self, tick: u64) -> u128 {
        self.units_wide(tick as u128)
    }

    /// How far the exact refill position of `now_ns` (`now × rate / tick`) lies past the whole
    /// units counted at tick `from`, in `2^-RATE_FRAC` of a unit: negative for a tick whose units
    /// are past it (a stamp ahead). Held tokens plus this is the exact bucket the word stands for.
    #[inline]
    pub(crate) const fn position_past(&self, now_ns: u64, from: u128) -> i128 {
        // Below 2^128 (a reading and the rate are words), and shifted down by at least nothing;
        // a tick below 2^65 keeps the units below 2^75, so both fit an `i128`.
        let position = (now_ns as u128 * self.rate as u128) >> (self.shift & 63);
        position as i128 - ((self.units_wide(from) << RATE_FRAC) as i128)
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
        let d = part_of_tick(into, self.rate, shift) as u128;
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

/// `ceil(into × rate / 2^shift)` for `into` below `2^shift`: the refill of the first `into` ns of
/// a tick, in `2^-RATE_FRAC` of a unit, at most `rate`. The high word of one product (`into` moved
/// to the top of a word, where it fits), up one where the low word is not zero: no wide shift, on
/// the path of an admission to a full bucket, whose compare-and-swap waits for it.
#[inline(always)]
pub(crate) const fn part_of_tick(into: u64, rate: u64, shift: u32) -> u64 {
    let top = (into << 1) << (63 - (shift & 63));
    let product = top as u128 * rate as u128;
    (product >> 64) as u64 + (product as u64 != 0) as u64
}
