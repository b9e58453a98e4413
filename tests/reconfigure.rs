//! `Reconfigurable`: quotas changed at run time, against the exact model and under threads.

mod common;

use atomic_limiter::algorithm::{GcraAlgorithm, Retunable, TokenBucketAlgorithm};
use atomic_limiter::{Carry, Clock, Decision, ManualClock, Quota, Reconfigurable};
use common::Model;
use proptest::prelude::*;
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::thread;
use std::time::{Duration, Instant};

type Tunable = Reconfigurable<GcraAlgorithm, ManualClock>;

#[derive(Debug, Clone)]
enum Op {
    Advance(u64),
    Check(u32),
    /// To quota `.0` of the run's list, carrying as `.1` says.
    Set(usize, Carry),
}

/// Quotas a run switches between: whole and fractional periods, small and large bursts, rates
/// from one an hour to millions a second.
fn quota() -> impl Strategy<Value = Quota> {
    (1u64..=1_000_000, 1u64..=128, 1u32..=40)
        .prop_filter_map("quota rejected", |(per_us, rate, burst)| {
            Quota::try_new(rate, Duration::from_micros(per_us), burst).ok()
        })
}

fn run() -> impl Strategy<Value = (Vec<Quota>, Vec<Op>)> {
    proptest::collection::vec(quota(), 2..5).prop_flat_map(|quotas| {
        let longest = quotas
            .iter()
            .map(|q| q.fill_time().as_nanos() as u64)
            .max()
            .unwrap_or(1);
        let count = quotas.len();
        let carry = prop_oneof![Just(Carry::Debt), Just(Carry::Proportional)];
        let op = prop_oneof![
            2 => (0u64..=3).prop_map(Op::Advance),
            3 => (0..=longest / 4).prop_map(Op::Advance),
            1 => (0..=longest.saturating_mul(2)).prop_map(Op::Advance),
            6 => (0u32..=41).prop_map(Op::Check),
            2 => (0..count, carry).prop_map(|(i, c)| Op::Set(i, c)),
        ];
        (Just(quotas), proptest::collection::vec(op, 1..150))
    })
}

/// Runs `ops` through a reconfigurable limiter on the algorithm `A` and through the exact model
/// (carried the same way; a debt past the new capacity counts as empty when `at_most_empty`),
/// giving each check within the burst to `judge` with the model at that instant; and checks that
/// since each change admissions never exceed what the quota in force allows (burst + elapsed ×
/// rate).
fn against_the_model<A: Retunable + 'static>(
    quotas: &[Quota],
    ops: &[Op],
    at_most_empty: bool,
    mut judge: impl FnMut(&Decision, &mut Model, u64, u32) -> Result<(), TestCaseError>,
) -> Result<(), TestCaseError> {
    let clock = ManualClock::starting_at(1_000_000);
    let limiter: Reconfigurable<A, ManualClock> =
        Reconfigurable::with_clock(quotas[0], clock.clone());
    let mut model = Model::new(&quotas[0], clock.now());
    let (mut quota, mut since, mut admitted) = (quotas[0], clock.now(), 0u128);
    for op in ops {
        let now = clock.now();
        match *op {
            Op::Advance(ns) => clock.advance_nanos(ns),
            Op::Set(i, carry) => {
                limiter.set_quota(quotas[i], carry);
                let proportional = carry == Carry::Proportional;
                model = model.reconfigured_as(now, &quotas[i], proportional, at_most_empty);
                (quota, since, admitted) = (quotas[i], now, 0);
                prop_assert_eq!(limiter.quota(), quota);
            }
            Op::Check(n) => {
                let d = limiter.check_n(n);
                if n > quota.burst() {
                    prop_assert!(d.is_err());
                    continue;
                }
                let d = d.unwrap();
                judge(&d, &mut model, now, n)?;
                if d.is_allowed() {
                    admitted += u128::from(n);
                }
                prop_assert!(
                    admitted <= Model::admission_bound(&quota, since, now),
                    "{} admitted since the change to {:?}",
                    admitted,
                    quota
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(512)
    ))]

    /// GCRA: every decision, figures included, is the exact model's, through any sequence of
    /// checks and quota changes (either carry).
    #[test]
    fn checks_and_changes_match_the_exact_model((quotas, ops) in run()) {
        against_the_model::<GcraAlgorithm>(&quotas, &ops, false, |d, model, now, n| {
            let m = model.check(now, n);
            prop_assert_eq!(d.is_allowed(), m.allowed, "decision at {} for {}", now, n);
            prop_assert_eq!(d.remaining(), m.remaining);
            prop_assert_eq!(d.retry_after().as_nanos(), m.retry_ns as u128);
            prop_assert_eq!(d.reset_after().as_nanos(), m.reset_ns as u128);
            Ok(())
        })?;
    }

    /// The token bucket: it never admits what the exact model (carried the same way, a debt past
    /// the new burst counting as empty, and following the bucket's own admissions) refuses.
    #[test]
    fn a_reconfigured_bucket_is_never_ahead_of_the_exact_model((quotas, ops) in run()) {
        against_the_model::<TokenBucketAlgorithm>(&quotas, &ops, true, |d, model, now, n| {
            let (num, den) = model.tokens_at(now);
            let exact_allows = n == 0 || num >= i128::from(n) * den;
            prop_assert!(!d.is_allowed() || exact_allows,
                "admitted {} at {} with {}/{} tokens", n, now, num, den);
            model.apply(now, n, d.is_allowed());
            Ok(())
        })?;
    }
}

/// Threads check a frozen clock's burst while another changes the quota over and over (to the
/// same figures, so the carried state must equal the old one exactly): exactly the burst is
/// admitted, whatever the interleaving. An admission lost in a change (made on a retired cell
/// after its word was carried) would show as one more.
#[test]
fn racing_changes_neither_lose_nor_add_admissions() {
    let burst = 1_000u32;
    let quota = Quota::per_second(1).with_burst(burst);
    for (round, carry) in [Carry::Debt, Carry::Proportional]
        .repeat(25)
        .into_iter()
        .enumerate()
    {
        let limiter = Tunable::with_clock(quota, ManualClock::new());
        let checkers = 3;
        let start = Barrier::new(checkers + 1);
        let done = AtomicBool::new(false);
        let admitted = AtomicU64::new(0);
        // The checkers keep checking until the changer has made 100 changes (or 2 s pass), so
        // the two always overlap.
        let made = AtomicU64::new(0);
        let deadline = Instant::now() + Duration::from_secs(2);
        let changes = thread::scope(|s| {
            let changer = s.spawn(|| {
                start.wait();
                while !done.load(Relaxed) {
                    limiter.set_quota(quota, carry);
                    made.fetch_add(1, Relaxed);
                }
                made.load(Relaxed)
            });
            let hs: Vec<_> = (0..checkers)
                .map(|_| {
                    s.spawn(|| {
                        start.wait();
                        let mut checks = 0;
                        while checks < 2 * burst
                            || (made.load(Relaxed) < 100 && Instant::now() < deadline)
                        {
                            if limiter.check().is_allowed() {
                                admitted.fetch_add(1, Relaxed);
                            }
                            checks += 1;
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
            done.store(true, Relaxed);
            changer.join().unwrap()
        });
        assert_eq!(
            admitted.load(Relaxed),
            u64::from(burst),
            "round {round}, {carry:?}"
        );
        assert!(changes > 0);
    }
}

/// A change of quota is seen by the next check, and a smaller burst refuses what no longer fits.
#[test]
fn a_smaller_burst_refuses_what_no_longer_fits() {
    let clock = ManualClock::new();
    let limiter = Tunable::with_clock(Quota::per_second(10), clock.clone());
    assert!(limiter.check_n(10).unwrap().is_allowed());
    limiter.set_quota(Quota::per_second(2), Carry::Proportional);
    assert!(limiter.check_n(3).is_err());
    // Empty, proportionally: both of the new two tokens are owed, half a second each.
    let d = limiter.check();
    assert!(d.is_denied());
    assert_eq!(d.retry_after(), Duration::from_millis(500));
}

/// Adversarial changes: a clock that steps back between checks and changes, the extreme quotas
/// (one token a century, a thousand a second with the largest burst, a billion a second with
/// burst 1), and both
/// algorithms. Nothing panics or overflows (a request for `u32::MAX` tokens included), and after
/// each change no more is admitted than the quota in force allows within 1.5 s of it: for the
/// century quota, its one token (a stepped-back clock grants nothing extra).
#[test]
fn changes_under_a_stepping_clock_and_extreme_quotas_stay_within_the_quota() {
    let century = Duration::from_secs(100 * 365 * 24 * 3600);
    let quotas = [
        Quota::with_period(century),
        Quota::per_second(1_000).with_burst(Quota::MAX_BURST),
        Quota::per_second(1_000_000_000).with_burst(1),
    ];
    fn run<A: Retunable + 'static>(quotas: &[Quota]) {
        let clock = ManualClock::starting_at(1 << 40);
        let limiter: Reconfigurable<A, ManualClock> =
            Reconfigurable::with_clock(quotas[0], clock.clone());
        for round in 0..300u64 {
            let quota = quotas[(round % 3) as usize];
            let carry = if round % 2 == 0 {
                Carry::Debt
            } else {
                Carry::Proportional
            };
            limiter.set_quota(quota, carry);
            // Back a second, or on by up to a second and a half.
            let step = (round * 7_919 % 2_500) * 1_000_000;
            if step < 1_000_000_000 {
                clock.set(clock.now() - 1_000_000_000);
            } else {
                clock.advance_nanos(step - 1_000_000_000);
            }
            let admitted = (0..8).filter(|_| limiter.check().is_allowed()).count() as u128;
            // The readings here never pass the change's instant by more than 1.5 s.
            let bound = Model::admission_bound(&quota, 0, 1_500_000_000);
            assert!(
                admitted <= bound,
                "round {round}: {admitted} admitted on {quota:?}"
            );
            let _ = limiter.check_n(u32::MAX);
        }
    }
    run::<GcraAlgorithm>(&quotas);
    run::<TokenBucketAlgorithm>(&quotas);
}
