//! An arbitrary run (clock advances of any size, steps back, checks of any size, peeks) applied to
//! `Gcra`, its mutex twin `MutexGcra`, `TokenBucket` and the exact reference model of
//! `tests/common`. While the clock only moves forward and the run stays inside the documented
//! horizons: GCRA equals the model in every decision and figure, and the bucket never admits what
//! the model refuses, refuses only within its resolution, and never advertises a wait shorter than
//! exact. Always, steps back included: GCRA equals its mutex twin, and nobody admits more than
//! `burst + (latest time - start) × rate / per`. The fixed window and the sliding window counter
//! run the same operations against their exact models, and, steps back included (timed at the
//! latest reading, where a stalled clock would stand), never admit more than their documented
//! bound within one window's span, never refuse a peek and never advertise a zero wait; the
//! sliding window log likewise, within exactly `limit`; and the throttle's waits match exact
//! arithmetic on the period the limiters keep (rounded quotas included).
#![no_main]

#[path = "../../tests/common/mod.rs"]
mod common;
mod shared;

use arbitrary::Arbitrary;
use atomic_limiter::baseline::MutexGcra;
use atomic_limiter::{
    Clock, FixedWindow, Gcra, ManualClock, RateLimiter, SlidingWindowCounter, SlidingWindowLog, Throttle,
    TokenBucket,
};
use common::{FixedModel, Model, SlidingModel, bucket_may_refuse, bucket_wait_slack};
use std::collections::VecDeque;
use libfuzzer_sys::fuzz_target;
use shared::QuotaSpec;

#[derive(Arbitrary, Debug)]
enum Op {
    Advance(u64),
    AdvanceSmall(u16),
    StepBack(u64),
    Check(u32),
    CheckSmall(u8),
    Peek,
}

#[derive(Arbitrary, Debug)]
struct Input {
    quota: QuotaSpec,
    start: u64,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let Some(quota) = input.quota.build() else {
        return;
    };
    let start = input.start;
    let clock = ManualClock::starting_at(start);
    let gcra = Gcra::with_clock(quota, clock.clone());
    let twin: MutexGcra<_> = MutexGcra::with_clock(quota, clock.clone());
    let bucket = TokenBucket::with_clock(quota, clock.clone());
    let mut model = Model::new(&quota, start);
    let mut bucket_model = Model::new(&quota, start);
    let tick = bucket.tick().as_nanos() as u64;
    let slack = bucket_wait_slack(&quota, tick);
    // Exact comparisons hold inside half the smaller horizon, with a clock that never stepped back.
    let horizon = gcra.horizon().min(bucket.idle_horizon()).as_nanos() as u64 / 2;
    // Steps back are kept within what both limiters tell apart from a long idle.
    let back_limit = gcra.horizon().min(bucket.backward_tolerance()).as_nanos() as u64;
    // The window limiters read the quota as `rate` per `per`; their exact models.
    let width = quota.per().as_nanos() as u64;
    let limit = quota.rate();
    let fixed = FixedWindow::with_clock(quota, clock.clone()).ok();
    let sliding = SlidingWindowCounter::with_clock(quota, clock.clone()).ok();
    let mut fixed_model = FixedModel { limit, window: width, epoch: start, index: 0, count: 0 };
    let mut sliding_model = SlidingModel { limit, window: width, epoch: start, index: 0, previous: 0, current: 0 };
    let log = SlidingWindowLog::with_clock(quota, clock.clone()).ok();
    let window_horizon = [
        fixed.as_ref().map(|w| w.horizon()),
        sliding.as_ref().map(|w| w.horizon()),
    ]
    .into_iter()
    .flatten()
    .min()
    .map_or(u64::MAX, |h| h.as_nanos() as u64 / 2);
    let mut log_model: VecDeque<u64> = VecDeque::new();
    let mut window_logs = [VecDeque::<(u64, u64)>::new(), VecDeque::new(), VecDeque::new()];
    // The latest reading each window limiter has decided on: where a clock that stalled instead
    // of stepping back would stand. (Not the harness's `latest`, which moves with readings no
    // check saw.)
    let mut window_seen = [start; 3];
    // The throttle, against exact arithmetic: tokens as a numerator over the interval that may go
    // negative (a queue); a reservation waits until it is back at zero.
    let throttle = Throttle::with_clock(quota, clock.clone());
    // Tokens counted over the period the limiters keep (`per / rate` when exact, else rounded
    // up): `num / token` tokens, refilled by `scale` per ns.
    let (token, scale) = quota.period_fraction();
    let (per_ns, rate) = (i128::from(token), i128::from(scale));
    let throttle_cap = i128::from(quota.burst()) * per_ns;
    let (mut throttle_num, mut throttle_last) = (throttle_cap, start);
    let mut exact = true;
    let mut latest = start;
    let (mut admitted_gcra, mut admitted_bucket) = (0u128, 0u128);

    for op in input.ops.iter().take(256) {
        let n = match *op {
            Op::Advance(ns) => {
                clock.advance_nanos(ns);
                None
            }
            Op::AdvanceSmall(ns) => {
                clock.advance_nanos(u64::from(ns));
                None
            }
            Op::StepBack(ns) => {
                // Keep the clock within the tolerance of the latest time it showed, cumulatively.
                let behind = latest - clock.now();
                let room = back_limit.saturating_sub(behind).max(1);
                clock.rewind(std::time::Duration::from_nanos(ns % room));
                exact = false;
                None
            }
            Op::Check(n) => Some(n),
            Op::CheckSmall(n) => Some(u32::from(n) % (quota.burst() + 2)),
            Op::Peek => Some(0),
        };
        let now = clock.now();
        latest = latest.max(now);
        if now.saturating_sub(start) >= horizon {
            exact = false;
        }
        let Some(n) = n else { continue };

        // Window limiters: exact while the clock only moved forward; the per-span bound always
        // (2 x limit for the fixed window's edge, 2 x limit - 1 for the sliding counter).
        let windows: [(Option<&dyn RateLimiter>, u64); 3] = [
            (fixed.as_ref().map(|l| l as &dyn RateLimiter), limit.saturating_mul(2)),
            (sliding.as_ref().map(|l| l as &dyn RateLimiter), limit.saturating_mul(2) - 1),
            (log.as_ref().map(|l| l as &dyn RateLimiter), limit),
        ];
        for (i, (l, bound)) in windows.into_iter().enumerate() {
            let Some(l) = l else { continue };
            let Ok(d) = l.check_n(n) else {
                assert!(u64::from(n) > limit);
                continue;
            };
            // Exact inside the window limiters' own horizon too (an idle past their index width
            // keeps old counts, as documented: fewer admissions, never more).
            if exact && now >= start && now - start < window_horizon {
                let (ok, remaining) = match i {
                    0 => fixed_model.check(now, u64::from(n)),
                    1 => sliding_model.check(now, u64::from(n)),
                    _ => {
                        log_model.retain(|&t| t.saturating_add(width) > now);
                        let ok = log_model.len() as u64 + u64::from(n) <= limit;
                        if ok {
                            log_model.extend(std::iter::repeat_n(now, n as usize));
                        }
                        (ok, limit - log_model.len() as u64)
                    }
                };
                assert_eq!((d.is_allowed(), d.remaining()), (ok, remaining), "window {i}");
            }
            assert!(n > 0 || d.is_allowed(), "window {i}: a peek was refused");
            assert!(d.is_allowed() || d.retry_after() > std::time::Duration::ZERO, "window {i}: a denial advertised no wait");
            // A reading behind the latest one decided on decides as a clock stalled there:
            // admissions are timed at that reading, and the bound holds over those times.
            window_seen[i] = window_seen[i].max(now);
            let seen = window_seen[i];
            if d.is_allowed() && n > 0 {
                window_logs[i].push_back((seen, u64::from(n)));
            }
            // Admissions in (seen - W, seen].
            window_logs[i].retain(|&(t, _)| t.saturating_add(width) > seen);
            let in_span: u64 = window_logs[i].iter().map(|&(_, k)| k).sum();
            assert!(in_span <= bound, "window {i}: {in_span} admitted within one window, bound {bound}");
        }

        // The throttle reserves instead of refusing; exact while the clock only moved forward and
        // the queue stays short (a year at most).
        let year = std::time::Duration::from_secs(365 * 86_400);
        let reserved = throttle.reserve_n(n, year).map(|r| r.wait());
        if exact && now >= start && n <= quota.burst() {
            let since = i128::from(now - throttle_last);
            throttle_num = (throttle_num + since * rate).min(throttle_cap);
            throttle_last = now;
            let after = throttle_num - i128::from(n) * per_ns;
            let wait_ns = if after >= 0 { 0 } else { (-after + rate - 1) / rate };
            // The wait in units of 1/scale ns (an integer), against the throttle's cap: the
            // caller's maximum, and at most 2^61 units (the documented queue bound).
            let wait_units = if after >= 0 { 0 } else { -after };
            let max_units = (year.as_nanos() as i128 * rate).min(1 << 61);
            if wait_units <= max_units {
                throttle_num = after;
                assert_eq!(reserved, Ok(std::time::Duration::from_nanos(wait_ns as u64)), "throttle wait");
            } else {
                assert!(reserved.is_err(), "throttle reserved past the maximum wait");
            }
        }

        let a = gcra.check_n(n);
        let b = twin.check_n(n);
        let c = bucket.check_n(n);
        assert_eq!(a, b, "GCRA and its mutex twin disagree");
        if n > quota.burst() {
            assert!(a.is_err() && c.is_err());
            continue;
        }
        let (a, c) = (a.unwrap(), c.unwrap());
        if n == 0 {
            assert!(a.is_allowed() && c.is_allowed(), "a peek was refused");
        }
        admitted_gcra += u128::from(n) * u128::from(a.is_allowed());
        admitted_bucket += u128::from(n) * u128::from(c.is_allowed());
        let bound = Model::admission_bound(&quota, start, latest);
        assert!(
            admitted_gcra <= bound,
            "GCRA admitted {admitted_gcra} > {bound}"
        );
        assert!(
            admitted_bucket <= bound,
            "bucket admitted {admitted_bucket} > {bound}"
        );

        if !exact {
            continue;
        }
        let m = model.check(now, n);
        assert_eq!(a.is_allowed(), m.allowed, "GCRA decision");
        assert_eq!(a.remaining(), m.remaining, "GCRA remaining");
        assert_eq!(
            a.retry_after().as_nanos(),
            u128::from(m.retry_ns),
            "GCRA retry_after"
        );
        assert_eq!(
            a.reset_after().as_nanos(),
            u128::from(m.reset_ns),
            "GCRA reset_after"
        );

        let (num, den) = bucket_model.tokens_at(now);
        let exact_allows = num >= i128::from(n) * den;
        assert!(
            !c.is_allowed() || exact_allows,
            "bucket admitted {n} with {num}/{den}"
        );
        if c.is_denied() && exact_allows {
            assert!(
                bucket_may_refuse(num, den, n, &quota, tick),
                "bucket refused {n} with {num}/{den}"
            );
        }
        let bm = bucket_model.apply(now, n, c.is_allowed());
        let within = |got: u128, exact: u64| {
            got >= u128::from(exact) && got <= u128::from(exact) + u128::from(slack)
        };
        if c.is_denied() {
            assert!(
                within(c.retry_after().as_nanos(), bm.retry_ns),
                "bucket retry_after"
            );
        }
        assert!(
            within(c.reset_after().as_nanos(), bm.reset_ns),
            "bucket reset_after"
        );
    }
});
