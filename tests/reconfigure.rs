//! `Reconfigurable`: quotas changed at run time, against the exact model and under threads.

mod common;

use atomic_limiter::algorithm::{
    Continuous, Fixed, GcraAlgorithm, Retunable, Sliding, TokenBucketAlgorithm, WindowAlgorithm,
};
use atomic_limiter::{
    Carry, Clock, Decision, ManualClock, Quota, Reconfigurable, ReconfigurableSharded,
};
use common::{FixedModel, Model, SlidingModel};
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
    /// A check of `.0` tokens at the model's edge: the last nanosecond before the model holds
    /// them, where a limiter the least ahead of it admits (`.1` false); or the first where the
    /// limiter must admit (`.1` true: the model holds them, plus the limiter's documented lag).
    Edge(u32, bool),
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
    run_of(quota(), 41, 3)
}

/// 2 to 4 of the quotas `quota` gives, and checks of up to `most` tokens, advances (some long
/// enough to fill the slowest) and changes between them; checks at the model's edge with a
/// weight of `edges` (against 6 for checks).
fn run_of(
    quota: impl Strategy<Value = Quota>,
    most: u32,
    edges: u32,
) -> impl Strategy<Value = (Vec<Quota>, Vec<Op>)> {
    proptest::collection::vec(quota, 2..5).prop_flat_map(move |quotas| {
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
            6 => (0u32..=most).prop_map(Op::Check),
            edges => (1u32..=most, any::<bool>()).prop_map(|(n, after)| Op::Edge(n, after)),
            2 => (0..count, carry).prop_map(|(i, c)| Op::Set(i, c)),
        ];
        (Just(quotas), proptest::collection::vec(op, 1..150))
    })
}

/// Runs `ops` through a reconfigurable limiter on the algorithm `A` and through the exact model
/// (`model` at the start, changed by `reconfigure` as the limiter is), giving each check within the
/// burst to `judge` with the model at that instant; and checks that since each change admissions
/// never exceed what the quota in force allows (burst + elapsed × rate).
fn against_the_model<A: Retunable + Continuous + 'static>(
    quotas: &[Quota],
    ops: &[Op],
    model: Model,
    edge: impl Fn(&mut Model, u64, u32, bool) -> u64,
    mut reconfigure: impl FnMut(&mut Model, u64, &Quota, bool) -> Model,
    mut judge: impl FnMut(&Decision, &mut Model, u64, u32) -> Result<(), TestCaseError>,
) -> Result<(), TestCaseError> {
    let clock = ManualClock::starting_at(START);
    let limiter: Reconfigurable<A, ManualClock> =
        Reconfigurable::with_clock(quotas[0], clock.clone());
    // Changed by one closure and judged by the other, never at once.
    let model = std::cell::RefCell::new(model);
    within_the_quota(
        quotas,
        ops,
        &clock,
        |n| limiter.check_n(n),
        |now, n, after| edge(&mut model.borrow_mut(), now, n, after),
        |now, q, carry| {
            limiter.set_quota(*q, carry);
            let proportional = carry == Carry::Proportional;
            let next = reconfigure(&mut model.borrow_mut(), now, q, proportional);
            model.replace(next);
            limiter.quota()
        },
        |d, now, n| judge(d, &mut model.borrow_mut(), now, n),
    )
}

/// Runs `ops` through a limiter (`check`, and `set`, which changes the quota at `now` and answers
/// the quota now in force), giving each answer within the burst to `judge`, and checks that since
/// each change admissions never exceed what the quota in force allows (burst + elapsed × rate).
/// `edge` answers how long from `now` until the model holds what an `Op::Edge` asks (0 without a
/// model): the check falls then, or one nanosecond before for the side that must refuse.
fn within_the_quota(
    quotas: &[Quota],
    ops: &[Op],
    clock: &ManualClock,
    check: impl Fn(u32) -> Result<Decision, atomic_limiter::InsufficientCapacity>,
    edge: impl Fn(u64, u32, bool) -> u64,
    mut set: impl FnMut(u64, &Quota, Carry) -> Quota,
    mut judge: impl FnMut(&Decision, u64, u32) -> Result<(), TestCaseError>,
) -> Result<(), TestCaseError> {
    let (mut quota, mut since, mut admitted) = (quotas[0], clock.now(), 0u128);
    for op in ops {
        let mut now = clock.now();
        match *op {
            Op::Advance(ns) => clock.advance_nanos(ns),
            Op::Set(i, carry) => {
                (quota, since, admitted) = (quotas[i], now, 0);
                prop_assert_eq!(set(now, &quota, carry), quota);
            }
            Op::Check(n) | Op::Edge(n, _) => {
                if let Op::Edge(_, after) = *op {
                    let until = edge(now, n, after);
                    clock.advance_nanos(if after {
                        until
                    } else {
                        until.saturating_sub(1)
                    });
                    now = clock.now();
                }
                let d = check(n);
                if n > quota.burst() {
                    prop_assert!(d.is_err());
                    continue;
                }
                let d = d.unwrap();
                judge(&d, now, n)?;
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
        let model = Model::new(&quotas[0], START);
        // Admitted from the very nanosecond the model holds the tokens, not one before.
        let edge = |m: &mut Model, now, n, _| m.ns_until(now, i128::from(n) * m.per());
        against_the_model::<GcraAlgorithm>(&quotas, &ops, model, edge,
            |m, now, q, proportional| m.reconfigured(now, q, proportional),
            |d, model, now, n| {
                let m = model.check(now, n);
                prop_assert_eq!(d.is_allowed(), m.allowed, "decision at {} for {}", now, n);
                prop_assert_eq!(d.remaining(), m.remaining);
                prop_assert_eq!(d.retry_after().as_nanos(), m.retry_ns as u128);
                prop_assert_eq!(d.reset_after().as_nanos(), m.reset_ns as u128);
                Ok(())
            })?;
    }

    /// The token bucket against the exact model: [`bucket_against_the_model`].
    #[test]
    fn a_reconfigured_bucket_is_never_ahead_of_the_exact_model((quotas, ops) in run()) {
        bucket_against_the_model(&quotas, &ops)?;
    }
}

/// The property's runs that found faults, each as it shrank: the same checks, run every time
/// whatever the strategy generates (a saved seed replays only the strategy it was saved with).
#[test]
fn the_bucket_runs_that_found_faults_pass() {
    use Op::*;
    let ms = |rate, us, burst| Quota::try_new(rate, Duration::from_micros(us), burst).unwrap();
    let runs = [
        // Carried into an empty bucket stamped at the instant's tick, then refilled 21 ms: two
        // admitted at 1.9998 tokens exact.
        (
            vec![ms(57, 26_122, 18), ms(98, 517_260, 38)],
            vec![
                Advance(14_199_466),
                Set(1, Carry::Debt),
                Advance(116_129_777),
                Check(2),
                Set(0, Carry::Debt),
                Set(1, Carry::Proportional),
                Advance(21_111_589),
                Check(2),
                Check(2),
            ],
        ),
        // A word with its stamp ahead holds its units until the stamp: units added there for the
        // part of a unit before the stamp were admitted at once (8 at 7.9993 exact).
        (
            vec![ms(32, 1_933, 21), ms(84, 387_623, 37)],
            vec![
                Advance(32_638_038),
                Check(8),
                Set(1, Carry::Debt),
                Check(14),
                Advance(42_447_941),
                Check(18),
                Set(0, Carry::Proportional),
                Check(8),
            ],
        ),
        // A quota whose 1 ns tick refills more than a unit, entered nearly full after empty.
        (
            vec![ms(1, 1, 1), ms(84, 3_029, 37)],
            vec![
                Advance(2_986_083),
                Set(1, Carry::Debt),
                Check(1),
                Set(0, Carry::Debt),
                Set(1, Carry::Debt),
                Set(0, Carry::Proportional),
                Check(1),
            ],
        ),
    ];
    for (quotas, ops) in runs {
        if let Err(e) = bucket_against_the_model(&quotas, &ops) {
            panic!("{e} in {quotas:?}, {ops:?}");
        }
    }
}

/// A change from 59 per 5.7 ms to 8 per 736 ms and back, with 8 tokens exact: the slow quota's
/// unit (90 µs) is most of a token of the fast one (96 µs), and the round trip may cost under one
/// of them, so 7 pass. Carried in whole ticks of the slow quota with three of its units held back,
/// 3 passed (the property above allows that much lag between these quotas, so it cannot tell).
#[test]
fn a_change_to_a_slow_quota_and_back_costs_under_a_unit_of_it() {
    let fast = Quota::try_new(59, Duration::from_micros(5_656), 38).unwrap();
    let slow = Quota::try_new(8, Duration::from_micros(735_745), 12).unwrap();
    for start in [START, START + 1, START + 7, START + 40_000, START + 65_535] {
        let clock = ManualClock::starting_at(start);
        let bucket: Reconfigurable<TokenBucketAlgorithm, _> =
            Reconfigurable::with_clock(fast, clock.clone());
        assert!(bucket.check_n(30).unwrap().is_allowed());
        bucket.set_quota(slow, Carry::Debt);
        bucket.set_quota(fast, Carry::Debt);
        let passed = (0..8).take_while(|_| bucket.check().is_allowed()).count();
        assert!(passed >= 7, "{passed} passed from {start} ns");
    }
}

/// The token bucket through `ops`: it never admits what the exact model (carried the same way, a
/// debt past the new burst counting as empty, and following the bucket's own admissions) refuses,
/// and never refuses what that model could serve past the lag the bucket may have gathered: its
/// grid's own, and what each change added and what the bucket lagged by before it, carried as the
/// debt is (as time or as a share) through the later ones. The model counts in units 2^20 times
/// finer than a period's and rounds its carries down, so it is never below the exact count.
fn bucket_against_the_model(quotas: &[Quota], ops: &[Op]) -> Result<(), TestCaseError> {
    let quota = std::cell::Cell::new(quotas[0]);
    // The lag the changes so far added, in the current model's units.
    let carried = std::cell::Cell::new(0i128);
    let model = Model::new(&quotas[0], START).finer(FINE);
    // The most the bucket may trail the model by now, in its units.
    let lag = |m: &Model| carried.get() + grid_lag(&quota.get(), m);
    // Not one nanosecond early; admitted once the model holds the tokens and the lag.
    let edge = |m: &mut Model, now, n, after: bool| {
        let slack = if after { lag(m) } else { 0 };
        m.ns_until(now, i128::from(n) * m.per() + slack)
    };
    let reconfigure = |m: &mut Model, now, q: &Quota, proportional| {
        let next = m.reconfigured_above(now, q, proportional, FINE);
        // The lag so far (the changes', and the old bucket's since it was last full), carried as
        // the debt is; what the change adds; and a fine unit for the model's own rounding down. No
        // bucket trails by more than its capacity (the check is moot past that).
        let before = carried.get() + rephase_lag(&quota.get(), m);
        let lag = m.carry_units(&next, before, proportional, true);
        carried.set((lag + change_lag(q, &next) + 2).min(next.cap()));
        quota.set(*q);
        next
    };
    let judge = |d: &Decision, model: &mut Model, now, n| {
        let (num, den) = model.tokens_at(now);
        let exact_allows = n == 0 || num >= i128::from(n) * den;
        prop_assert!(
            !d.is_allowed() || exact_allows,
            "admitted {} at {} with {}/{} tokens",
            n,
            now,
            num,
            den
        );
        let lag = lag(model);
        prop_assert!(
            d.is_allowed() || num < i128::from(n) * den + lag,
            "refused {} at {} with {}/{} tokens, a lag of {} allowed",
            n,
            now,
            num,
            den,
            lag
        );
        model.apply(now, n, d.is_allowed());
        Ok(())
    };
    against_the_model::<TokenBucketAlgorithm>(quotas, ops, model, edge, reconfigure, judge)
}

/// The clock's reading when a run starts.
const START: u64 = 1_000_000;

/// How much finer than a period's the token bucket's model counts.
const FINE: i128 = 1 << 20;

/// How far the token bucket's grid may trail the exact count on its own, in `model`'s units: two
/// units (1/1024 of a token each) and two ticks' refill. A fresh bucket trails by under two units
/// and a tick; a carried one, by under a unit and a tick past the lag its change left.
fn grid_lag(quota: &Quota, model: &Model) -> i128 {
    2 * unit(model) + 2 * tick_refill(quota, model)
}

/// How much a change to `quota` may add to the lag, in `model`'s units: under a unit for the tokens
/// rounded down, and, for a bucket left near empty (stamped at the first tick whose whole units
/// reach the change's position), under a unit and a tick's refill more.
fn change_lag(quota: &Quota, model: &Model) -> i128 {
    2 * unit(model) + tick_refill(quota, model)
}

/// How far behind the exact count a bucket on `quota` starts counting when it is full, in
/// `model`'s units: a full bucket's stamp is the first tick whose whole units reach the instant's
/// exact position, under a unit and a tick's refill past it.
fn rephase_lag(quota: &Quota, model: &Model) -> i128 {
    unit(model) + tick_refill(quota, model)
}

/// One unit (1/1024 of a token) in `model`'s units, rounded up.
fn unit(model: &Model) -> i128 {
    (model.per() + 1023) / 1024
}

/// One tick's refill of the token bucket on `quota`, in `model`'s units.
fn tick_refill(quota: &Quota, model: &Model) -> i128 {
    let tick = atomic_limiter::TokenBucket::with_clock(*quota, ManualClock::new()).tick();
    i128::try_from(tick.as_nanos()).unwrap() * model.rate()
}

/// Threads check a frozen clock's burst while another changes the quota over and over (to the
/// same figures, so the carried state must equal the old one exactly): exactly the burst is
/// admitted, whatever the interleaving. An admission lost in a change (made on a retired cell
/// after its word was carried) would show as one more. GCRA, 50 rounds; 20 rounds each of the
/// windows, the exact log and a throttle reserving without waiting (a limit of 1 000 per
/// second), and of a burst of 1 000 over four
/// shards (shard `i` carried into shard `i`, steals from other shards included; a gather of
/// several tokens that a change interrupts counts what it took as spent, so only single tokens
/// are held to an exact total). One test, so that the scenarios do not crowd each other's threads
/// off the two cores this runs on.
#[test]
fn racing_changes_neither_lose_nor_add_admissions() {
    let quota = Quota::per_second(1).with_burst(1_000);
    race_changes(
        50,
        || Tunable::with_clock(quota, ManualClock::new()),
        |l| l.check().is_allowed(),
        |l, carry| l.set_quota(quota, carry),
    );
    race_changes(
        20,
        || ReconfigurableSharded::<GcraAlgorithm, _>::with_clock(quota, 4, ManualClock::new()),
        |l| l.check().is_allowed(),
        |l, carry| l.set_quota(quota, carry),
    );
    let quota = Quota::per_second(1_000);
    race_changes(
        20,
        || {
            Reconfigurable::<WindowAlgorithm<Fixed>, _>::try_with_clock(quota, ManualClock::new())
                .unwrap()
        },
        |l| l.check().is_allowed(),
        |l, carry| l.try_set_quota(quota, carry).unwrap(),
    );
    race_changes(
        20,
        || {
            Reconfigurable::<WindowAlgorithm<Sliding>, _>::try_with_clock(quota, ManualClock::new())
                .unwrap()
        },
        |l| l.check().is_allowed(),
        |l, carry| l.try_set_quota(quota, carry).unwrap(),
    );
    race_changes(
        20,
        || {
            atomic_limiter::ReconfigurableThrottle::with_clock(
                quota.with_burst(1_000),
                ManualClock::new(),
            )
        },
        |l| l.reserve(Duration::ZERO).is_ok(),
        |l, carry| l.set_quota(quota.with_burst(1_000), carry),
    );
    race_changes(
        20,
        || atomic_limiter::ReconfigurableLog::try_with_clock(quota, ManualClock::new()).unwrap(),
        |l| l.check().is_allowed(),
        |l, carry| l.try_set_quota(quota, carry).unwrap(),
    );
}

/// Three threads check a limiter of 1 000 on a frozen clock while a fourth changes it with
/// `change` over and over, `rounds` rounds alternating the carries: exactly 1 000 must be
/// admitted.
/// `check` counts one admission when it returns true.
fn race_changes<T: Sync>(
    rounds: usize,
    make: impl Fn() -> T,
    check: impl Fn(&T) -> bool + Sync,
    change: impl Fn(&T, Carry) + Sync,
) {
    let burst = 1_000u32;
    for (round, carry) in [Carry::Debt, Carry::Proportional]
        .repeat(rounds / 2)
        .into_iter()
        .enumerate()
    {
        let limiter = make();
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
                    change(&limiter, carry);
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
                            if check(&limiter) {
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
    fn run<A: Retunable + Continuous + 'static>(quotas: &[Quota]) {
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

/// The windows under the same stepping clock, between one admission a century, the largest limit
/// each can hold per ten seconds, and a limit too large for either: no panic or overflow, a too-large
/// limit refused with the quota in force and its state left as they were, and every admission
/// within what a span of the window allows (twice the limit for the sliding counter).
#[test]
fn window_changes_under_a_stepping_clock_and_extreme_quotas_stay_within_the_quota() {
    fn run<K>(largest: u64)
    where
        WindowAlgorithm<K>: Retunable,
        K: 'static,
    {
        let quotas = [
            Quota::with_period(Duration::from_secs(100 * 365 * 24 * 3600)),
            Quota::try_new(largest, Duration::from_secs(10), 1).unwrap(),
            Quota::try_new(largest + 1, Duration::from_secs(10), 1).unwrap(),
        ];
        let clock = ManualClock::starting_at(1 << 40);
        let limiter: Reconfigurable<WindowAlgorithm<K>, ManualClock> =
            Reconfigurable::try_with_clock(quotas[0], clock.clone()).unwrap();
        let mut quota = quotas[0];
        for round in 0..300u64 {
            let carry = if round % 2 == 0 {
                Carry::Debt
            } else {
                Carry::Proportional
            };
            let to = quotas[(round % 3) as usize];
            match limiter.try_set_quota(to, carry) {
                Ok(()) => quota = to,
                Err(_) => {
                    assert_eq!(to.rate(), largest + 1, "round {round}");
                    assert_eq!(limiter.quota(), quota, "round {round}: left as it was");
                }
            }
            // Back a second, or on by up to a second and a half.
            let step = (round * 7_919 % 2_500) * 1_000_000;
            if step < 1_000_000_000 {
                clock.set(clock.now() - 1_000_000_000);
            } else {
                clock.advance_nanos(step - 1_000_000_000);
            }
            let admitted = (0..8).filter(|_| limiter.check().is_allowed()).count() as u64;
            assert!(
                admitted <= 2 * quota.rate(),
                "round {round}: {admitted} admitted on {quota:?}"
            );
            let _ = limiter.check_n(u32::MAX);
        }
    }
    run::<Fixed>((1 << 31) - 1);
    run::<Sliding>((1 << 20) - 1);
}

/// A window run: quotas whose windows share two lengths (so that changes both keep the grid and
/// start a new one), and checks, advances and changes.
fn window_run() -> impl Strategy<Value = (Vec<Quota>, Vec<Op>)> {
    (1u64..=50_000, 1u64..=50_000).prop_flat_map(|(w1, w2)| {
        let quota = (1u64..=40, proptest::bool::ANY).prop_map(move |(limit, first)| {
            Quota::try_new(limit, Duration::from_micros(if first { w1 } else { w2 }), 1).unwrap()
        });
        proptest::collection::vec(quota, 2..5).prop_flat_map(move |quotas| {
            let longest = w1.max(w2) * 1_000;
            let count = quotas.len();
            let carry = prop_oneof![Just(Carry::Debt), Just(Carry::Proportional)];
            let op = prop_oneof![
                2 => (0u64..=3).prop_map(Op::Advance),
                3 => (0..=longest / 3).prop_map(Op::Advance),
                1 => (0..=longest * 3).prop_map(Op::Advance),
                6 => (0u32..=41).prop_map(Op::Check),
                2 => (0..count, carry).prop_map(|(i, c)| Op::Set(i, c)),
            ];
            (Just(quotas.clone()), proptest::collection::vec(op, 1..150))
        })
    })
}

/// The model of one window kind: its check, its change, and the start of the window of the grid
/// in force that holds `now` (for the fixed window's bound).
trait WindowModel: Sized {
    fn new(q: &Quota, now: u64) -> Self;
    fn check(&mut self, now: u64, n: u64) -> (bool, u64);
    fn change(&mut self, now: u64, q: &Quota, proportional: bool) -> Self;
    /// The most admissions after a change that any span of the window's length, or (fixed)
    /// any window of the grid, may hold; and the window of `now` in that grid, for grouping.
    fn bound(&self) -> u64;
    fn group(&self, now: u64) -> Option<u64>;
}

impl WindowModel for FixedModel {
    fn new(q: &Quota, now: u64) -> Self {
        FixedModel {
            limit: q.rate(),
            window: q.per().as_nanos() as u64,
            epoch: now,
            index: 0,
            count: 0,
        }
    }
    fn check(&mut self, now: u64, n: u64) -> (bool, u64) {
        FixedModel::check(self, now, n)
    }
    fn change(&mut self, now: u64, q: &Quota, proportional: bool) -> Self {
        self.reconfigured(now, q.rate(), q.per().as_nanos() as u64, proportional)
    }
    fn bound(&self) -> u64 {
        self.limit
    }
    fn group(&self, now: u64) -> Option<u64> {
        Some((now - self.epoch) / self.window)
    }
}

impl WindowModel for SlidingModel {
    fn new(q: &Quota, now: u64) -> Self {
        SlidingModel {
            limit: q.rate(),
            window: q.per().as_nanos() as u64,
            epoch: now,
            index: 0,
            previous: 0,
            current: 0,
        }
    }
    fn check(&mut self, now: u64, n: u64) -> (bool, u64) {
        SlidingModel::check(self, now, n)
    }
    fn change(&mut self, now: u64, q: &Quota, proportional: bool) -> Self {
        self.reconfigured(now, q.rate(), q.per().as_nanos() as u64, proportional)
    }
    fn bound(&self) -> u64 {
        2 * self.limit - 1
    }
    fn group(&self, _now: u64) -> Option<u64> {
        None
    }
}

/// Runs `ops` through a reconfigurable window limiter and its model: every decision and
/// remaining count equal; and, from the model's rule alone, since each change no window of the
/// grid in force (fixed) or span of the window's length (sliding) holds more admissions than the
/// quota in force allows.
fn windows_against_the_model<K, M>(quotas: &[Quota], ops: &[Op]) -> Result<(), TestCaseError>
where
    WindowAlgorithm<K>: Retunable,
    K: 'static,
    M: WindowModel,
{
    let clock = ManualClock::starting_at(1_000_000);
    let limiter: Reconfigurable<WindowAlgorithm<K>, ManualClock> =
        Reconfigurable::try_with_clock(quotas[0], clock.clone()).unwrap();
    counts_against_the_model::<M>(
        quotas,
        ops,
        &clock,
        |n| limiter.check_n(n),
        |q, carry| {
            limiter.try_set_quota(q, carry).unwrap();
            limiter.quota()
        },
    )
}

/// [`windows_against_the_model`] for any limiter that counts admissions in a window: `check`,
/// and `set`, which changes the quota and answers the quota now in force.
fn counts_against_the_model<M: WindowModel>(
    quotas: &[Quota],
    ops: &[Op],
    clock: &ManualClock,
    check: impl Fn(u32) -> Result<Decision, atomic_limiter::InsufficientCapacity>,
    set: impl Fn(Quota, Carry) -> Quota,
) -> Result<(), TestCaseError> {
    let mut model = M::new(&quotas[0], clock.now());
    let mut quota = quotas[0];
    let mut since: Vec<(u64, u64)> = Vec::new(); // admissions since the last change
    for op in ops {
        let now = clock.now();
        match *op {
            Op::Advance(ns) => clock.advance_nanos(ns),
            Op::Set(i, carry) => {
                model = model.change(now, &quotas[i], carry == Carry::Proportional);
                quota = quotas[i];
                since.clear();
                prop_assert_eq!(set(quota, carry), quota);
            }
            Op::Check(n) | Op::Edge(n, _) => {
                let d = check(n);
                if u64::from(n) > quota.rate() {
                    prop_assert!(d.is_err());
                    continue;
                }
                let d = d.unwrap();
                let (allowed, remaining) = model.check(now, u64::from(n));
                prop_assert_eq!(d.is_allowed(), allowed, "at {} for {}", now, n);
                prop_assert_eq!(d.remaining(), remaining, "at {} for {}", now, n);
                if allowed && n > 0 {
                    since.push((now, u64::from(n)));
                }
                let window = quota.per().as_nanos() as u64;
                let held: u64 = match model.group(now) {
                    Some(g) => since
                        .iter()
                        .filter(|(t, _)| model.group(*t) == Some(g))
                        .map(|x| x.1)
                        .sum(),
                    None => since
                        .iter()
                        .filter(|(t, _)| now - t < window)
                        .map(|x| x.1)
                        .sum(),
                };
                prop_assert!(
                    held <= model.bound(),
                    "{} admitted in one window after a change",
                    held
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

    /// The fixed window through checks and changes (both carries, windows of the same length and
    /// not): every decision is the book model's.
    #[test]
    fn fixed_window_changes_match_the_model((quotas, ops) in window_run()) {
        windows_against_the_model::<Fixed, FixedModel>(&quotas, &ops)?;
    }

    /// The sliding window counter, likewise.
    #[test]
    fn sliding_counter_changes_match_the_model((quotas, ops) in window_run()) {
        windows_against_the_model::<Sliding, SlidingModel>(&quotas, &ops)?;
    }
}

/// Quotas small enough that their split changes (one, two or four shards), and checks, advances
/// and changes.
fn sharded_run() -> impl Strategy<Value = (Vec<Quota>, Vec<Op>)> {
    let quota = (1u64..=1_000, 1u64..=8, 1u32..=9)
        .prop_filter_map("quota rejected", |(per_ms, rate, burst)| {
            Quota::try_new(rate, Duration::from_millis(per_ms), burst).ok()
        });
    run_of(quota, 10, 0)
}

/// Runs `ops` through a reconfigurable sharded limiter on the algorithm `A` (four shards asked
/// for): since each change, admissions never exceed what the quota in force allows (its burst
/// plus the elapsed time at its rate), whatever the shard counts before and after.
fn sharded_within_the_quota<A: Retunable + Continuous + 'static>(
    quotas: &[Quota],
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let clock = ManualClock::starting_at(1_000_000);
    let limiter: ReconfigurableSharded<A, ManualClock> =
        ReconfigurableSharded::with_clock(quotas[0], 4, clock.clone());
    within_the_quota(
        quotas,
        ops,
        &clock,
        |n| limiter.check_n(n),
        |_, _, _| 0,
        |_, q, carry| {
            limiter.set_quota(*q, carry);
            limiter.quota()
        },
        |_, _, _| Ok(()),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(512)
    ))]

    /// A reconfigurable sharded limiter stays within the quota in force since each change, GCRA
    /// and the token bucket, either carry.
    #[test]
    fn sharded_changes_stay_within_the_quota((quotas, ops) in sharded_run()) {
        sharded_within_the_quota::<GcraAlgorithm>(&quotas, &ops)?;
        sharded_within_the_quota::<TokenBucketAlgorithm>(&quotas, &ops)?;
    }

    /// On a frozen clock, changes to the very same quota (GCRA, the debt as time) change
    /// nothing: a reconfigurable sharded limiter admits exactly what a plain one does, request
    /// for request (one thread: a request passes when the shards together hold it, whichever
    /// shard is home).
    #[test]
    fn sharded_changes_to_the_same_quota_change_nothing(
        (quotas, ops) in sharded_run()
    ) {
        use atomic_limiter::Sharded;
        let clock = ManualClock::starting_at(1_000_000);
        let quota = quotas[0];
        let plain = Sharded::gcra_with_clock(quota, 4, clock.clone());
        let tunable: ReconfigurableSharded<GcraAlgorithm, ManualClock> =
            ReconfigurableSharded::with_clock(quota, 4, clock.clone());
        for op in ops {
            match op {
                Op::Advance(_) => {}
                Op::Set(..) => tunable.set_quota(quota, Carry::Debt),
                Op::Check(n) | Op::Edge(n, _) => {
                    let (a, b) = (plain.check_n(n), tunable.check_n(n));
                    prop_assert_eq!(a.is_err(), b.is_err());
                    if let (Ok(a), Ok(b)) = (a, b) {
                        prop_assert_eq!(a.is_allowed(), b.is_allowed(), "for {}", n);
                    }
                }
            }
        }
    }
}

/// A drained sharded limiter stays drained through a change of shard count (four shards to one
/// and back), as time or as a share; a full one stays full.
#[test]
fn sharded_changes_across_shard_counts_keep_what_was_spent() {
    let clock = ManualClock::new();
    let four = Quota::per_second(100).with_burst(40);
    let one = Quota::per_second(1).with_burst(1);
    for carry in [Carry::Debt, Carry::Proportional] {
        let limiter: ReconfigurableSharded<GcraAlgorithm, _> =
            ReconfigurableSharded::with_clock(four, 4, clock.clone());
        limiter.set_quota(one, carry);
        let peek = limiter.check_n(0).unwrap();
        assert_eq!(peek.remaining(), 1, "{carry:?}: full stays full");
        limiter.set_quota(four, carry);
        assert!(limiter.check_n(39).unwrap().is_allowed(), "{carry:?}");
        limiter.set_quota(one, carry);
        assert!(
            limiter.check().is_denied(),
            "{carry:?}: drained stays drained"
        );
        limiter.set_quota(four, carry);
        assert!(limiter.check().is_denied(), "{carry:?}: and back");
        clock.advance(Duration::from_secs(1));
    }
}

/// The exact log by the book: admission times, at most `limit` in the last `window` ns.
struct LogModel {
    limit: u64,
    window: u64,
    times: std::collections::VecDeque<u64>,
}

impl WindowModel for LogModel {
    fn new(q: &Quota, _now: u64) -> LogModel {
        LogModel {
            limit: q.rate(),
            window: q.per().as_nanos() as u64,
            times: Default::default(),
        }
    }

    fn check(&mut self, now: u64, n: u64) -> (bool, u64) {
        LogModel::check(self, now, n)
    }

    fn change(&mut self, now: u64, q: &Quota, proportional: bool) -> Self {
        LogModel::change(self, now, q, proportional)
    }

    /// Exact: the limit in any span of the window.
    fn bound(&self) -> u64 {
        self.limit
    }

    fn group(&self, _now: u64) -> Option<u64> {
        None
    }
}

impl LogModel {
    fn roll(&mut self, now: u64) {
        while self.times.front().is_some_and(|&t| t + self.window <= now) {
            self.times.pop_front();
        }
    }

    fn check(&mut self, now: u64, n: u64) -> (bool, u64) {
        self.roll(now);
        let ok = self.times.len() as u64 + n <= self.limit;
        if ok {
            self.times.extend(std::iter::repeat_n(now, n as usize));
        }
        (ok, self.limit - self.times.len() as u64)
    }

    /// The log after a change at `now`: the times in the window, the newest as many as the new
    /// limit holds; or their count scaled to the new limit (rounded up, at most the limit), the
    /// extra ones at the oldest time.
    fn change(&mut self, now: u64, q: &Quota, proportional: bool) -> LogModel {
        self.roll(now);
        let limit = q.rate();
        let held = self.times.len() as u64;
        let target = if proportional {
            (held * limit).div_ceil(self.limit)
        } else {
            held
        }
        .min(limit) as usize;
        let kept: Vec<u64> = self
            .times
            .iter()
            .rev()
            .take(target)
            .rev()
            .copied()
            .collect();
        let oldest = kept.first().copied().unwrap_or(0);
        let mut times: std::collections::VecDeque<u64> =
            std::iter::repeat_n(oldest, target - kept.len()).collect();
        times.extend(kept);
        LogModel {
            limit,
            window: q.per().as_nanos() as u64,
            times,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(512)
    ))]

    /// The exact log through checks and changes (both carries, windows of two lengths): every
    /// decision and remaining count is the book model's, and after each change no span of the
    /// window's length holds more admissions than the limit in force.
    #[test]
    fn log_changes_match_the_model((quotas, ops) in window_run()) {
        use atomic_limiter::ReconfigurableLog;
        let clock = ManualClock::starting_at(1_000_000);
        let log = ReconfigurableLog::try_with_clock(quotas[0], clock.clone()).unwrap();
        counts_against_the_model::<LogModel>(&quotas, &ops, &clock, |n| log.check_n(n), |q, carry| {
            log.try_set_quota(q, carry).unwrap();
            log.quota()
        })?;
    }
}

#[derive(Debug, Clone)]
enum ThrottleOp {
    Advance(u64),
    /// Reserve `.0` tokens waiting at most `.1` ms.
    Reserve(u32, u64),
    /// Give back the latest reservation, if any is held.
    Refund,
    Check(u32),
    Set(usize, Carry),
}

fn throttle_run() -> impl Strategy<Value = (Vec<Quota>, Vec<ThrottleOp>)> {
    let quota = (1u64..=1_000, 1u64..=8, 1u32..=6)
        .prop_filter_map("quota rejected", |(per_ms, rate, burst)| {
            Quota::try_new(rate, Duration::from_millis(per_ms), burst).ok()
        });
    proptest::collection::vec(quota, 2..5).prop_flat_map(|quotas| {
        let count = quotas.len();
        let carry = prop_oneof![Just(Carry::Debt), Just(Carry::Proportional)];
        let op = prop_oneof![
            3 => (0u64..=300_000_000).prop_map(ThrottleOp::Advance),
            6 => (0u32..=7, 0u64..=3_000).prop_map(|(n, ms)| ThrottleOp::Reserve(n, ms)),
            1 => Just(ThrottleOp::Refund),
            2 => (0u32..=7).prop_map(ThrottleOp::Check),
            2 => (0..count, carry).prop_map(|(i, c)| ThrottleOp::Set(i, c)),
        ];
        (Just(quotas), proptest::collection::vec(op, 1..150))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(512)
    ))]

    /// A reconfigurable throttle through reservations (some given back), checks and changes:
    /// since each change, the tokens whose slots fall at or before any instant `t` (checks
    /// admitted now, reservations at their slot) stay within the new quota's burst plus
    /// `t - change` at its rate; and no slot granted after a change falls before the queue the
    /// change carried over would let it (the queue is kept as time).
    #[test]
    fn throttle_changes_stay_within_the_quota((quotas, ops) in throttle_run()) {
        use atomic_limiter::ReconfigurableThrottle;
        let clock = ManualClock::starting_at(1_000_000);
        let throttle = ReconfigurableThrottle::with_clock(quotas[0], clock.clone());
        let (mut quota, mut since) = (quotas[0], clock.now());
        // Slots granted since the last change: (instant, tokens); the reservations held.
        let mut slots: Vec<(u64, u64)> = Vec::new();
        let mut held: Vec<(atomic_limiter::Reservation<'_, ManualClock>, usize)> = Vec::new();
        for op in ops {
            let now = clock.now();
            match op {
                ThrottleOp::Advance(ns) => clock.advance_nanos(ns),
                ThrottleOp::Set(i, carry) => {
                    throttle.set_quota(quotas[i], carry);
                    (quota, since) = (quotas[i], now);
                    slots.clear();
                    prop_assert_eq!(throttle.quota(), quota);
                    // Made on the replaced quota: they can no longer be given back.
                    for (r, _) in held.drain(..) {
                        prop_assert!(!r.refund());
                    }
                }
                ThrottleOp::Reserve(n, ms) => {
                    if let Ok(r) = throttle.reserve_n(n, Duration::from_millis(ms)) {
                            prop_assert!(n <= quota.burst());
                            prop_assert!(r.wait() <= Duration::from_millis(ms));
                            slots.push((now + r.wait().as_nanos() as u64, u64::from(n)));
                            held.push((r, slots.len() - 1));
                    }
                }
                ThrottleOp::Refund => {
                    if let Some((r, index)) = held.pop() {
                        if r.refund() {
                            // Only the latest admission goes back; its tokens are free again.
                            prop_assert_eq!(index, slots.len() - 1);
                            slots.pop();
                        }
                    }
                }
                ThrottleOp::Check(n) => {
                    let d = throttle.check_n(n);
                    if n > quota.burst() {
                        prop_assert!(d.is_err());
                        continue;
                    }
                    if d.unwrap().is_allowed() && n > 0 {
                        slots.push((now, u64::from(n)));
                    }
                }
            }
            // Every instant a slot falls at: the tokens at or before it within the bound.
            for &(t, _) in &slots {
                let upto: u128 = slots.iter().filter(|s| s.0 <= t).map(|s| u128::from(s.1)).sum();
                prop_assert!(
                    upto <= Model::admission_bound(&quota, since, t),
                    "{} tokens by {} since the change at {} to {:?}", upto, t, since, quota
                );
            }
        }
    }
}

/// A throttle changed to the very same quota with the debt carried as time keeps its queue
/// exactly: reservations get the slots a plain throttle gives, and a reservation made before a
/// change cannot be given back (after it, only reservations made since can).
#[test]
fn throttle_changes_to_the_same_quota_keep_the_queue() {
    use atomic_limiter::{ReconfigurableThrottle, Throttle};
    let clock = ManualClock::new();
    let quota = Quota::per_second(10).with_burst(2);
    let plain = Throttle::with_clock(quota, clock.clone());
    let tunable = ReconfigurableThrottle::with_clock(quota, clock.clone());
    let max = Duration::from_secs(2);
    for round in 0..30u64 {
        let (a, b) = (plain.reserve(max).unwrap(), tunable.reserve(max).unwrap());
        assert_eq!(a.wait(), b.wait(), "round {round}");
        tunable.set_quota(quota, Carry::Debt);
        assert!(!b.refund(), "made before the change");
        if round % 3 == 0 {
            let (a, b) = (plain.reserve(max).unwrap(), tunable.reserve(max).unwrap());
            assert_eq!(a.wait(), b.wait(), "round {round}");
            assert!(
                a.refund() && b.refund(),
                "the latest, made since the change"
            );
        }
        clock.advance(Duration::from_millis(round * 7 % 150));
    }
}

/// A queue of reservations granted past the window is kept as time by either carry: after a
/// change to a quota five times faster, carried as a share, the next reservation still queues
/// behind the last one granted (were the queue scaled with the window, it would be served before
/// reservations already promised, and both would go at once).
#[test]
fn a_throttle_keeps_its_queue_through_either_carry() {
    use atomic_limiter::ReconfigurableThrottle;
    for carry in [Carry::Debt, Carry::Proportional] {
        let clock = ManualClock::new();
        let throttle =
            ReconfigurableThrottle::with_clock(Quota::per_second(2).with_burst(1), clock);
        let max = Duration::from_secs(10);
        let last = (0..6)
            .map(|_| throttle.reserve(max).unwrap().wait())
            .last()
            .unwrap();
        assert_eq!(last, Duration::from_millis(2_500));
        throttle.set_quota(Quota::per_second(10).with_burst(1), carry);
        let next = throttle.reserve(max).unwrap().wait();
        assert!(
            next >= Duration::from_secs(3) - Duration::from_millis(400),
            "{carry:?}: {next:?}"
        );
        assert!(
            next > last,
            "{carry:?}: {next:?} before the queue's last slot {last:?}"
        );
    }
}
