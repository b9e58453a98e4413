//! The throttle (leaky bucket as a queue): exact spacing, unique slots under threads, honest refusals.

use atomic_limiter::{Clock, ManualClock, Quota, Reservation, Throttle, ThrottleError};
use proptest::prelude::*;
use std::sync::Barrier;
use std::thread;
use std::time::Duration;

/// A reservation's wait (the slot is kept), or the refusal.
fn waited<C: Clock>(
    r: Result<Reservation<'_, C>, ThrottleError>,
) -> Result<Duration, ThrottleError> {
    r.map(|r| r.wait())
}

const FOREVER: Duration = Duration::from_secs(3600 * 24 * 365);

proptest! {
    /// Against exact arithmetic on the period the throttle keeps (`per / rate`, rounded up when
    /// inexact): tokens as a numerator that may go negative (a queue); a reservation waits until
    /// the numerator is back at zero.
    #[test]
    fn waits_match_exact_arithmetic(
        rate in 1u64..=1000, burst in 1u32..=20,
        ops in proptest::collection::vec((0u64..=3_000_000_000, 1u32..=20), 1..100)
    ) {
        let q = Quota::try_new(rate, Duration::from_secs(1), burst).unwrap();
        let clock = ManualClock::new();
        let t = Throttle::with_clock(q, clock.clone());
        // `num / per` tokens, refilled by `rate` per ns: the kept period is `per / rate` ns.
        let (per, rate) = q.period_fraction();
        let per = i128::from(per);
        let cap = i128::from(burst) * per;
        let (mut num, mut last) = (cap, 0u64);
        for (advance, n) in ops {
            clock.advance_nanos(advance);
            let now = clock.now();
            num = (num + i128::from(now - last) * i128::from(rate)).min(cap);
            last = now;
            let got = waited(t.reserve_n(n, FOREVER));
            if n > burst {
                prop_assert!(matches!(got, Err(ThrottleError::InsufficientCapacity(_))));
                continue;
            }
            num -= i128::from(n) * per;
            let wait = if num >= 0 { 0 } else { ((-num) + i128::from(rate) - 1) / i128::from(rate) };
            prop_assert_eq!(got, Ok(Duration::from_nanos(wait as u64)));
        }
    }
}

/// Threads reserving at once on a frozen clock get distinct slots: the burst at once, then one per
/// period, none shared and none skipped.
#[test]
fn concurrent_reservations_get_distinct_evenly_spaced_slots() {
    let threads = 2 * thread::available_parallelism().map_or(2, |n| n.get());
    let per_thread = 200;
    let t = Throttle::with_clock(Quota::per_second(1000).with_burst(5), ManualClock::new());
    let barrier = Barrier::new(threads);
    let mut waits: Vec<Duration> = thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    (0..per_thread)
                        .map(|_| t.reserve(FOREVER).unwrap().wait())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    waits.sort();
    let expected: Vec<Duration> = (0..threads * per_thread)
        .map(|i| Duration::from_millis(i.saturating_sub(4) as u64))
        .collect();
    assert_eq!(waits, expected);
}

#[test]
fn a_refusal_reserves_nothing() {
    let clock = ManualClock::new();
    let t = Throttle::with_clock(Quota::per_second(10).with_burst(1), clock.clone());
    assert_eq!(waited(t.reserve(FOREVER)), Ok(Duration::ZERO));
    assert_eq!(
        waited(t.reserve(Duration::from_millis(99))),
        Err(ThrottleError::WouldWait(Duration::from_millis(100)))
    );
    assert_eq!(
        waited(t.reserve(Duration::from_millis(100))),
        Ok(Duration::from_millis(100))
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(waited(t.reserve(Duration::ZERO)), Ok(Duration::ZERO));
    assert!(clock.now() > 0);
}

#[test]
fn a_clock_stepping_back_grants_no_earlier_slot() {
    let clock = ManualClock::starting_at(10_000_000_000);
    let t = Throttle::with_clock(Quota::per_second(10).with_burst(1), clock.clone());
    assert_eq!(waited(t.reserve(FOREVER)), Ok(Duration::ZERO));
    clock.rewind(Duration::from_secs(5));
    // The next slot is still 100 ms after the first one, measured on the stepped-back clock.
    assert_eq!(waited(t.reserve(FOREVER)), Ok(Duration::from_millis(5100)));
}

proptest! {
    /// Reserving and refunding at random (the latest reservation, or any other not yet due): the
    /// slots actually used (reserved, not given back) never exceed the quota: the k-th used slot
    /// is at or after the time the k-th token exists, and no span of one period holds more than
    /// `burst` of them.
    #[test]
    fn refunds_never_push_past_the_quota(
        burst in 1u32..=5,
        ops in proptest::collection::vec((0u64..=60_000_000, 0u8..=3), 1..120)
    ) {
        let q = Quota::per_second(10).with_burst(burst);
        let clock = ManualClock::new();
        let t = Throttle::with_clock(q, clock.clone());
        let mut live: Vec<(u64, atomic_limiter::Reservation<'_, ManualClock>)> = vec![];
        let mut used: Vec<u64> = vec![];
        for (advance, op) in ops {
            clock.advance_nanos(advance);
            let now = clock.now();
            match op {
                // Give back the oldest reservation not yet due (abandoned before use).
                0 => {
                    if let Some(i) = live.iter().position(|(at, _)| *at > now) {
                        let (_, r) = live.remove(i);
                        r.refund();
                    }
                }
                // Give back the latest one.
                1 => {
                    if live.last().is_some_and(|(at, _)| *at > now) {
                        let (_, r) = live.pop().unwrap();
                        r.refund();
                    }
                }
                _ => {
                    let r = t.reserve(FOREVER).unwrap();
                    live.push((now + r.wait().as_nanos() as u64, r));
                }
            }
            // Reservations whose slot has come are used.
            live.retain(|(at, _)| if *at <= now { used.push(*at); false } else { true });
        }
        used.extend(live.iter().map(|(at, _)| *at));
        used.sort();
        for (k, &at) in used.iter().enumerate() {
            let available = u64::from(burst) + at / 100_000_000;
            prop_assert!((k as u64) < available, "slot {} at {} ns, only {} tokens by then", k + 1, at, available);
        }
        for w in used.windows(burst as usize + 1) {
            prop_assert!(w[burst as usize] - w[0] >= 100_000_000, "{} slots within one period: {:?}", burst + 1, w);
        }
    }
}

#[test]
fn a_refund_frees_the_slot_for_the_next_caller() {
    let t = Throttle::with_clock(Quota::per_second(10).with_burst(1), ManualClock::new());
    let a = t.reserve(FOREVER).unwrap();
    let b = t.reserve(FOREVER).unwrap();
    assert_eq!(
        (a.wait(), b.wait()),
        (Duration::ZERO, Duration::from_millis(100))
    );
    assert!(b.refund());
    assert_eq!(waited(t.reserve(FOREVER)), Ok(Duration::from_millis(100)));
    assert_eq!(waited(t.reserve(FOREVER)), Ok(Duration::from_millis(200)));
    // `a` has later reservations behind it: its slot is not handed out again.
    assert!(!a.refund());
    assert_eq!(waited(t.reserve(FOREVER)), Ok(Duration::from_millis(300)));
}

/// With burst 1 at 1/s, reserving A, B and C and giving B back used to move the next free slot
/// back to 2 s while C kept it: D landed at 2 s with C.
#[test]
fn a_refund_under_later_reservations_never_double_books_a_slot() {
    let t = Throttle::with_clock(Quota::per_second(1).with_burst(1), ManualClock::new());
    let [a, b, c] = [(); 3].map(|_| t.reserve(FOREVER).unwrap());
    assert_eq!(c.wait(), Duration::from_secs(2));
    assert!(!b.refund());
    assert_eq!(waited(t.reserve(FOREVER)), Ok(Duration::from_secs(3)));
    drop((a, c));
}

#[test]
fn a_guard_dropped_unused_gives_its_slot_back_and_a_committed_one_keeps_it() {
    let t = Throttle::with_clock(Quota::per_second(10).with_burst(1), ManualClock::new());
    t.reserve_guarded(1, FOREVER).unwrap().commit();
    drop(t.reserve_guarded(1, FOREVER).unwrap());
    assert_eq!(waited(t.reserve(FOREVER)), Ok(Duration::from_millis(100)));
}

/// An async task that holds a guard across an await and is cancelled there gives its slot back.
#[test]
fn a_cancelled_future_does_not_leak_its_slot() {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Waker};
    let t = Throttle::with_clock(Quota::per_second(10).with_burst(1), ManualClock::new());
    assert_eq!(waited(t.reserve(FOREVER)), Ok(Duration::ZERO));
    {
        let task = async {
            let slot = t.reserve_guarded(1, FOREVER).unwrap();
            // Waits for its slot: a timer that never fires here.
            std::future::pending::<()>().await;
            slot.commit();
        };
        let mut task = pin!(task);
        let mut cx = Context::from_waker(Waker::noop());
        assert!(task.as_mut().poll(&mut cx).is_pending());
    } // the task is dropped mid-wait
    assert_eq!(waited(t.reserve(FOREVER)), Ok(Duration::from_millis(100)));
}

#[test]
fn a_refund_never_makes_the_throttle_fuller_than_full() {
    let clock = ManualClock::new();
    let t = Throttle::with_clock(Quota::per_second(10).with_burst(2), clock.clone());
    let r = t.reserve(FOREVER).unwrap();
    clock.advance(Duration::from_secs(5)); // full again long since
    assert!(!r.refund(), "its time has passed: nothing to give back");
    assert_eq!(waited(t.reserve(FOREVER)), Ok(Duration::ZERO));
    assert_eq!(waited(t.reserve(FOREVER)), Ok(Duration::ZERO));
    assert_eq!(
        waited(t.reserve(FOREVER)),
        Ok(Duration::from_millis(100)),
        "still a burst of 2, not 3"
    );
}

/// As a `RateLimiter` the throttle is GCRA's meter on the same state: it admits what `Gcra` admits
/// and reserves nothing when refused.
#[test]
fn as_a_rate_limiter_it_is_the_meter() {
    use atomic_limiter::{Gcra, RateLimiter};
    let q = Quota::per_second(10).with_burst(3);
    let (c1, c2) = (ManualClock::new(), ManualClock::new());
    let t = Throttle::with_clock(q, c1.clone());
    let g = Gcra::with_clock(q, c2.clone());
    for step in 0..200u64 {
        let n = (step % 4) as u32;
        assert_eq!(RateLimiter::check_n(&t, n), g.check_n(n), "step {step}");
        c1.advance_nanos(step * 7_919_000 % 90_000_000);
        c2.advance_nanos(step * 7_919_000 % 90_000_000);
    }
    // A refused check reserved nothing: the next slot is still the one a reservation gets.
    while RateLimiter::check(&t).is_allowed() {}
    let d = RateLimiter::check(&t);
    assert_eq!(waited(t.reserve(FOREVER)), Ok(d.retry_after()));
}
