//! The token bucket's arithmetic against exact models: layout, refill, carry and give-back.

use super::layout::*;
use super::refill::*;
use crate::clock::Reading;
use crate::decision::bucket::BucketFigures;
use crate::decision::bucket::{RATE_FRAC, UNIT, div_ceil_wide, shl_fits};
use crate::quota::Quota;
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

/// The shift test the retry-after uses agrees with the bit count it replaces, at every shift and
/// at both sides of each bound.
#[test]
fn a_shift_fits_exactly_when_the_leading_zeros_allow_it() {
    for shift in 0..=63u32 {
        let bound = 1u128
            .checked_shl(128 - shift)
            .map(|b| b - 1)
            .unwrap_or(u128::MAX);
        for x in [
            0,
            1,
            u128::from(u64::MAX),
            1 << 64,
            bound >> 1,
            bound,
            bound.wrapping_add(1),
            u128::MAX,
        ] {
            assert_eq!(
                shl_fits(x, shift),
                x.leading_zeros() >= shift,
                "{x} << {shift}"
            );
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

        /// The part of a tick's refill from one product is the wide one shifted down, rounded up;
        /// exactly divisible products included (a floor there would differ only at a unit's
        /// boundary, which the re-phase rarely meets).
        #[test]
        fn the_part_of_a_tick_is_the_wide_quotient(
            shift in 0u32..64,
            into in any::<u64>(),
            rate in any::<u64>(),
            exact in any::<bool>(),
        ) {
            let into = if shift == 0 { 0 } else { into >> (64 - shift) };
            // Half the cases on a product that 2^shift divides.
            let rate = if exact { rate & (u64::MAX << shift) } else { rate };
            let wide = (into as u128 * rate as u128).div_ceil(1u128 << shift);
            prop_assert_eq!(u128::from(part_of_tick(into, rate, shift)), wide);
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
