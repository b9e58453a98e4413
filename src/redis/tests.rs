//! The script against the local [`Gcra`](crate::Gcra), on a real redis-server: the same decisions
//! and figures at microsecond readings.

use core::time::Duration;

use proptest::prelude::*;

use super::script::{self, Mode, Reply, ScriptQuota};
use crate::clock::ManualClock;
use crate::gcra::Gcra;
use crate::quota::Quota;

#[path = "../../tests/common/redis_server.rs"]
mod redis_server;

/// Microseconds since the Unix epoch, around late 2026: the magnitude the script sees from `TIME`.
const EPOCH_US: u64 = 1_795_000_000_000_000;

/// A server of the test's own, a connection to it, and one limit's script.
struct Fixture {
    con: redis::Connection,
    script: redis::Script,
    quota: ScriptQuota,
    // Last: the server stops after the connection closes.
    _server: redis_server::RedisServer,
}

impl Fixture {
    /// `None` (the test skipped) where redis-server is not installed.
    fn start(test: &str, source: &str, q: &Quota) -> Option<Fixture> {
        let server = redis_server::RedisServer::start(test)?;
        let con = redis::Client::open(server.url())
            .unwrap()
            .get_connection()
            .unwrap();
        Some(Fixture {
            con,
            script: redis::Script::new(source),
            quota: ScriptQuota::new(q).unwrap(),
            _server: server,
        })
    }

    /// One call; `now_us` goes last, for the test variant of the script.
    fn call(&mut self, key: &str, mode: Mode, n: u32, now_us: Option<u64>) -> Reply {
        let mut call = self.script.prepare_invoke();
        call.key(key).arg(mode as u8).arg(n);
        for a in self.quota.args() {
            call.arg(a);
        }
        if let Some(now) = now_us {
            call.arg(now);
        }
        let values: Vec<i64> = call.invoke(&mut self.con).expect("the script runs");
        Reply::parse(&values, 1).expect("a well-formed reply")
    }
}

fn ceil_us(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1000)).unwrap()
}

/// Quotas with long windows, up to the script's 2^51 units: hours and days per token.
fn long_quota() -> impl Strategy<Value = Quota> {
    (1u64..7, 1u64..100_000, 1u32..500)
        .prop_map(|(rate, secs, burst)| {
            Quota::try_new(rate, Duration::from_secs(secs), burst).expect("a valid quota")
        })
        .prop_filter("within the script's range", |q| {
            ScriptQuota::new(q).is_some()
        })
}

/// A subject's stored state, as the script packs it (40 bytes).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Stored {
    us: u64,
    rem: u64,
    denom: u64,
    token: u64,
    burst: u64,
}

impl Stored {
    /// Units (1/denom µs) ahead of `now_us`, 0 when behind.
    fn ahead_at(&self, now_us: u64) -> u128 {
        let tat = u128::from(self.us) * u128::from(self.denom) + u128::from(self.rem);
        tat.saturating_sub(u128::from(now_us) * u128::from(self.denom))
    }
}

/// The state stored under `key`, if any.
fn stored(f: &mut Fixture, key: &str) -> Option<Stored> {
    let bytes: Option<Vec<u8>> = redis::cmd("GET").arg(key).query(&mut f.con).unwrap();
    let bytes = bytes?;
    assert_eq!(bytes.len(), 40, "the packed form");
    let x: Vec<u64> = bytes
        .chunks(8)
        .map(|c| {
            let v = f64::from_le_bytes(c.try_into().unwrap());
            assert!(
                v >= 0.0 && v.fract() == 0.0 && v < 9.1e15,
                "an exact integer: {v}"
            );
            v as u64
        })
        .collect();
    Some(Stored {
        us: x[0],
        rem: x[1],
        denom: x[2],
        token: x[3],
        burst: x[4],
    })
}

fn quota() -> impl Strategy<Value = Quota> {
    // Rates whose periods are whole ns, fractions of a ns, and fractions of a µs; bursts from 1.
    (
        1u64..5000,
        prop_oneof![Just(1u64), Just(3), Just(60), Just(1000)],
        1u32..40,
    )
        .prop_map(|(rate, per_ms, burst)| {
            Quota::try_new(rate, Duration::from_millis(per_ms), burst).expect("a valid quota")
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Random sequences of (advance, n) through the script and through the local GCRA on a
    /// manual clock: every decision and figure agrees, at microsecond resolution.
    #[test]
    fn the_script_decides_as_the_local_gcra(
        q in quota(),
        steps in prop::collection::vec((0u64..400_000, 0u32..45, 0u8..8), 1..60),
    ) {
        let source = script::with_now_from_args(script::SOURCE);
        let Some(mut f) = Fixture::start("the_script_decides_as_the_local_gcra", &source, &q) else {
            return Ok(());
        };
        let clock = ManualClock::new();
        let local = Gcra::with_clock(q, clock.clone());
        let mut t_us = 0u64;
        for (i, &(advance, n, kind)) in steps.iter().enumerate() {
            // Small steps as often as large ones (the boundaries are where they differ), and now
            // and then a step back: the server's clock after a failover to a replica behind it.
            t_us = match kind {
                0..=3 => t_us + advance % 50,
                4..=6 => t_us + advance,
                _ => t_us.saturating_sub(advance % 200_000),
            };
            clock.set(t_us * 1000);
            let reply = f.call("k", Mode::AllOrNothing, n, Some(EPOCH_US + t_us));
            match local.check_n(n) {
                Err(e) => prop_assert_eq!(reply, Reply::OverBurst { limit: 0 }, "step {}: {}", i, e),
                Ok(d) => {
                    let Reply::Decided { allowed, granted, remaining, retry_us, reset_us, .. } = reply else {
                        return Err(TestCaseError::fail(format!("step {i}: {reply:?}, local {d:?}")));
                    };
                    let got = (allowed, remaining as u64, retry_us, reset_us);
                    let want = (d.is_allowed(), d.remaining(), ceil_us(d.retry_after()), ceil_us(d.reset_after()));
                    prop_assert_eq!(got, want, "step {} (n = {}, t = {} us)", i, n, t_us);
                    prop_assert_eq!(granted, if allowed { n } else { 0 });
                }
            }
        }
    }

    /// Quotas changed between calls (the script told the new quota, its stored TAT written under
    /// the old one, in other units when the periods' fractions differ) decide as a local
    /// reconfigurable GCRA carrying the debt as time: every decision and figure agrees, at
    /// microsecond readings. Reading the old remainder as if in the new units fails it.
    #[test]
    fn a_changed_quota_decides_as_the_local_reconfigurable_gcra(
        quotas in prop::collection::vec(quota(), 2..4),
        steps in prop::collection::vec((0u64..400_000, 0u32..45, 0u8..10), 1..60),
    ) {
        use crate::gcra::GcraAlgorithm;
        use crate::reconfigure::Reconfigurable;
        use crate::limiter::algorithm::Carry;
        let source = script::with_now_from_args(script::SOURCE);
        let test = "a_changed_quota_decides_as_the_local_reconfigurable_gcra";
        let Some(mut f) = Fixture::start(test, &source, &quotas[0]) else {
            return Ok(());
        };
        let clock = ManualClock::new();
        let local: Reconfigurable<GcraAlgorithm, ManualClock> =
            Reconfigurable::with_clock(quotas[0], clock.clone());
        let mut t_us = 0u64;
        for (i, &(advance, n, kind)) in steps.iter().enumerate() {
            t_us += if kind < 5 { advance % 50 } else { advance };
            clock.set(t_us * 1000);
            if kind >= 8 {
                let q = quotas[usize::from(kind) % quotas.len()];
                f.quota = ScriptQuota::new(&q).unwrap();
                local.set_quota(q, Carry::Debt);
                // The local limiter carries at the change, the script when the subject is next
                // seen: a peek then makes both round at the same instants. (Without it, changes
                // with no call between round locally and not on the server, which is then the
                // exact one, by a fraction of a nanosecond per change.)
                let peek = f.call("k", Mode::AllOrNothing, 0, Some(EPOCH_US + t_us));
                prop_assert!(matches!(peek, Reply::Decided { allowed: true, .. }), "step {}: {:?}", i, peek);
                continue;
            }
            let reply = f.call("k", Mode::AllOrNothing, n, Some(EPOCH_US + t_us));
            match local.check_n(n) {
                Err(e) => prop_assert_eq!(reply, Reply::OverBurst { limit: 0 }, "step {}: {}", i, e),
                Ok(d) => {
                    let Reply::Decided { allowed, remaining, retry_us, reset_us, .. } = reply else {
                        return Err(TestCaseError::fail(format!("step {i}: {reply:?}, local {d:?}")));
                    };
                    let got = (allowed, remaining as u64, retry_us, reset_us);
                    let want = (d.is_allowed(), d.remaining(), ceil_us(d.retry_after()), ceil_us(d.reset_after()));
                    prop_assert_eq!(got, want, "step {} (n = {}, t = {} us)", i, n, t_us);
                }
            }
        }
    }

    /// A state written under one quota and read under another with a proportional carry becomes
    /// exactly the share of the old window in use at that call, of the new window, rounded up in
    /// the new units (a debt past the whole old window: the whole new one), and is written then:
    /// the stored TAT is checked against that figure worked out in 128-bit integers, windows up to
    /// the script's 2^51 units included (where the product is past a double's exact range), and
    /// a later call under the same quota finds it unchanged. Working the product out in doubles
    /// fails it.
    #[test]
    fn a_proportional_carry_takes_the_exact_share_once(
        quotas in prop::collection::vec(prop_oneof![quota(), long_quota()], 2..4),
        steps in prop::collection::vec((0u64..5_000_000_000, 0u32..45, 0u8..10), 1..30),
    ) {
        use crate::limiter::algorithm::Carry;
        let source = script::with_now_from_args(script::SOURCE);
        let test = "a_proportional_carry_takes_the_exact_share_once";
        let Some(mut f) = Fixture::start(test, &source, &quotas[0]) else {
            return Ok(());
        };
        let mut t_us = 0u64;
        for (i, &(advance, n, kind)) in steps.iter().enumerate() {
            t_us += (advance % 1_000_000_007) >> (kind % 4 * 8);
            if kind >= 7 {
                let q = quotas[usize::from(kind) % quotas.len()];
                f.quota = ScriptQuota::new(&q).unwrap().carrying(Carry::Proportional);
                continue;
            }
            let now = EPOCH_US + t_us;
            let before = stored(&mut f, "k");
            let reply = f.call("k", Mode::AllOrNothing, n, Some(now));
            let after = stored(&mut f, "k");
            let [token, burst, d, _] = f.quota.args();
            let window = u128::from(token) * u128::from(burst);
            let Some(old) = before else { continue };
            let same = old.denom == d && old.token == token && old.burst == burst;
            let old_ahead = old.ahead_at(now);
            if same || old_ahead == 0 {
                continue;
            }
            // The carried debt, in the new units, exactly.
            let old_window = u128::from(old.token) * u128::from(old.burst);
            let carried = if old_ahead >= old_window {
                window
            } else {
                (old_ahead * window).div_ceil(old_window)
            };
            let Reply::Decided { granted, .. } = reply else {
                // Refused before any state is read: nothing carried, nothing written.
                prop_assert_eq!(after, before);
                continue;
            };
            let granted = u128::from(granted);
            let new = after.expect("a carried state is written");
            prop_assert_eq!((new.denom, new.token, new.burst), (d, token, burst));
            prop_assert_eq!(
                new.ahead_at(now),
                carried + granted * u128::from(token),
                "step {} at {} us: from {:?}",
                i,
                t_us,
                old
            );
            // Taken once: a peek under the same quota changes nothing.
            f.call("k", Mode::AllOrNothing, 0, Some(now));
            prop_assert_eq!(stored(&mut f, "k"), Some(new));
        }
    }

    /// Plans that last a month or a year (windows past the script's 2^51 local units, kept in
    /// whole microseconds) decide as the local GCRA: every decision and figure agrees, at
    /// microsecond readings, for periods of whole microseconds.
    #[test]
    fn a_plan_of_a_month_decides_as_the_local_gcra(
        period_us in 30_000_000u64..3_000_000_000,
        burst in 1_000u32..200_000,
        steps in prop::collection::vec((0u64..40_000_000_000, 0u32..1_000, 0u8..8), 1..50),
    ) {
        let q = Quota::with_period(Duration::from_micros(period_us)).with_burst(burst);
        prop_assume!(q.window_units() > script::MAX_WINDOW_UNITS);
        let source = script::with_now_from_args(script::SOURCE);
        let Some(mut f) = Fixture::start("a_plan_of_a_month_decides_as_the_local_gcra", &source, &q) else {
            return Ok(());
        };
        prop_assert_eq!(f.quota.args()[2], 1, "kept in whole microseconds");
        let clock = ManualClock::new();
        let local = Gcra::with_clock(q, clock.clone());
        let mut t_us = 0u64;
        for (i, &(advance, n, kind)) in steps.iter().enumerate() {
            t_us += match kind {
                0..=2 => advance % 1_000,
                3..=5 => advance % period_us,
                _ => advance,
            };
            // Large requests, to drain a month's burst in a few steps.
            let n = if kind % 2 == 0 { n } else { n * 100 }.min(burst);
            clock.set(t_us * 1000);
            let reply = f.call("plan", Mode::AllOrNothing, n, Some(EPOCH_US + t_us));
            let d = local.check_n(n).unwrap();
            let Reply::Decided { allowed, remaining, retry_us, reset_us, .. } = reply else {
                return Err(TestCaseError::fail(format!("step {i}: {reply:?}, local {d:?}")));
            };
            let got = (allowed, remaining as u64, retry_us, reset_us);
            let want = (d.is_allowed(), d.remaining(), ceil_us(d.retry_after()), ceil_us(d.reset_after()));
            prop_assert_eq!(got, want, "step {} (n = {}, t = {} us)", i, n, t_us);
        }
    }

    /// The grant-up-to mode gives what the local GCRA would admit one token at a time, and no more.
    #[test]
    fn grant_up_to_takes_what_fits(
        q in quota(),
        steps in prop::collection::vec((0u64..400_000, 0u32..60), 1..40),
    ) {
        let source = script::with_now_from_args(script::SOURCE);
        let Some(mut f) = Fixture::start("grant_up_to_takes_what_fits", &source, &q) else {
            return Ok(());
        };
        let clock = ManualClock::new();
        let local = Gcra::with_clock(q, clock.clone());
        let mut t_us = 0u64;
        for &(advance, n) in &steps {
            t_us += advance;
            clock.set(t_us * 1000);
            let reply = f.call("grant", Mode::UpTo, n, Some(EPOCH_US + t_us));
            let Reply::Decided { allowed, granted, .. } = reply else {
                return Err(TestCaseError::fail(format!("{reply:?}")));
            };
            let mut fits = 0;
            while fits < n.min(q.burst()) && local.check().is_allowed() {
                fits += 1;
            }
            prop_assert_eq!(granted, fits);
            prop_assert_eq!(allowed, fits > 0 || n == 0);
        }
    }
}

/// One step of a charge-and-settle sequence.
#[derive(Debug, Clone)]
enum AdminStep {
    Advance(u64),
    Charge(u32),
    Settle(usize, u32),
    Penalize(u32),
    Block(u64),
    Remove,
}

fn admin_step() -> impl Strategy<Value = AdminStep> {
    prop_oneof![
        3 => (0u64..400_000).prop_map(AdminStep::Advance),
        3 => (0u64..20_000).prop_map(AdminStep::Advance),
        2 => (0u64..50).prop_map(AdminStep::Advance),
        4 => (0u32..45).prop_map(AdminStep::Charge),
        4 => (any::<usize>(), 0u32..90).prop_map(|(i, a)| AdminStep::Settle(i, a)),
        1 => (0u32..60).prop_map(AdminStep::Penalize),
        1 => (0u64..3_000_000).prop_map(AdminStep::Block),
        1 => Just(AdminStep::Remove),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Charges (mode 3), settlements above and below their estimates in any order, penalties,
    /// blocks and removals through the two scripts decide as the local `Gcra`'s charge, settle,
    /// penalize, block and reset on a manual clock: after every step a peek agrees, figure for
    /// figure, at microsecond readings.
    #[test]
    fn settlements_and_changes_decide_as_the_local_gcra(
        q in quota(),
        steps in prop::collection::vec(admin_step(), 1..60),
    ) {
        let source = script::with_now_from_args(script::SOURCE);
        let test = "settlements_and_changes_decide_as_the_local_gcra";
        let Some(mut f) = Fixture::start(test, &source, &q) else {
            return Ok(());
        };
        let admin = redis::Script::new(&script::with_now_from_args(script::ADMIN_SOURCE));
        let clock = ManualClock::new();
        let local = Gcra::with_clock(q, clock.clone());
        let mut t_us = 0u64;
        // Open charges: the local guard, and the script's ends and tokens taken.
        let mut open = Vec::new();
        for (i, step) in steps.iter().enumerate() {
            let now = EPOCH_US + t_us;
            let quota_args = f.quota.quota_args();
            let run_admin = |con: &mut redis::Connection, op: u64, per: [u64; 2], tail: &[u64]| {
                let mut call = admin.prepare_invoke();
                call.key("k").arg(op);
                for a in quota_args.iter().chain(per.iter()).chain(tail) {
                    call.arg(*a);
                }
                call.arg(now);
                let changed: Vec<i64> = call.invoke(con).expect("the admin script runs");
                changed
            };
            match *step {
                AdminStep::Advance(us) => {
                    t_us += us;
                    clock.set(t_us * 1000);
                }
                AdminStep::Charge(n) => {
                    let mut call = f.script.prepare_invoke();
                    call.key("k").arg(Mode::Charge as u8).arg(n);
                    for a in f.quota.args() {
                        call.arg(a);
                    }
                    call.arg(now);
                    let values: Vec<i64> = call.invoke(&mut f.con).expect("the script runs");
                    let Ok(charge) = local.charge(n) else {
                        prop_assert_eq!(values[0], 2, "step {}: over the burst", i);
                        continue;
                    };
                    let allowed = values[0] == 1;
                    prop_assert_eq!(allowed, charge.is_allowed(), "step {}: charge {}", i, n);
                    if allowed && n > 0 {
                        prop_assert_eq!(values.len(), 8, "the TAT told");
                        open.push((charge, [values[6] as u64, values[7] as u64], n));
                    } else {
                        prop_assert_eq!(values.len(), 6);
                    }
                }
                AdminStep::Settle(k, actual) if !open.is_empty() => {
                    let (charge, end, taken) = open.remove(k % open.len());
                    charge.settle(actual);
                    if actual != taken {
                        run_admin(&mut f.con, 1, end, &[u64::from(taken), u64::from(actual)]);
                    }
                }
                AdminStep::Penalize(n) => {
                    let _ = local.penalize(n);
                    run_admin(&mut f.con, 2, [0, 0], &[u64::from(n)]);
                }
                AdminStep::Block(us) => {
                    let _ = local.block(Duration::from_micros(us));
                    run_admin(&mut f.con, 3, [0, 0], &[us]);
                }
                AdminStep::Remove => {
                    local.reset();
                    run_admin(&mut f.con, 4, [0, 0], &[]);
                }
                AdminStep::Settle(..) => continue,
            }
            let reply = f.call("k", Mode::AllOrNothing, 0, Some(EPOCH_US + t_us));
            let d = local.check_n(0).unwrap();
            let Reply::Decided { remaining, reset_us, .. } = reply else {
                return Err(TestCaseError::fail(format!("step {i}: {reply:?}")));
            };
            prop_assert_eq!(
                (remaining as u64, reset_us),
                (d.remaining(), ceil_us(d.reset_after())),
                "step {}: {:?} at {} us", i, step, t_us
            );
        }
    }
}

/// The idle key vanishes by itself once full again: its PX expiry is the time until full.
#[test]
fn an_idle_subject_expires_when_full_again() {
    let q = Quota::per_second(10).with_burst(5);
    let test = "an_idle_subject_expires_when_full_again";
    let Some(mut f) = Fixture::start(test, script::SOURCE, &q) else {
        return;
    };
    let reply = f.call("idle", Mode::AllOrNothing, 3, None);
    assert!(
        matches!(reply, Reply::Decided { allowed: true, .. }),
        "{reply:?}"
    );
    // Three tokens at 100 ms each: full again in 300 ms.
    let pttl: i64 = redis::cmd("PTTL").arg("idle").query(&mut f.con).unwrap();
    assert!((200..=300).contains(&pttl), "{pttl}");
    // A peek writes nothing.
    let before: Vec<u8> = redis::cmd("GET").arg("idle").query(&mut f.con).unwrap();
    f.call("idle", Mode::AllOrNothing, 0, None);
    let after: Vec<u8> = redis::cmd("GET").arg("idle").query(&mut f.con).unwrap();
    assert_eq!(before, after);
}

/// A TAT written under a quota whose units are 1/7000 µs (7 per ms), read under one whose units
/// are 1/1000 µs (1 per ms): its remainder is rescaled, rounded up, so the debt keeps its instant
/// (three tokens of 142.857 µs: 428.572 µs, as the local reconfigurable GCRA has it), and a TAT
/// in the earlier 16-byte form still reads. Reading the old remainder as new units puts the
/// reset at 432 µs instead of 429.
#[test]
fn a_tat_written_under_other_units_keeps_its_instant() {
    use crate::gcra::GcraAlgorithm;
    use crate::limiter::algorithm::Carry;
    use crate::reconfigure::Reconfigurable;
    let sevens = Quota::try_new(7, Duration::from_millis(1), 10).unwrap();
    let ones = Quota::try_new(1, Duration::from_millis(1), 10).unwrap();
    let source = script::with_now_from_args(script::SOURCE);
    let test = "a_tat_written_under_other_units_keeps_its_instant";
    let Some(mut f) = Fixture::start(test, &source, &sevens) else {
        return;
    };
    let clock = ManualClock::new();
    let local: Reconfigurable<GcraAlgorithm, ManualClock> =
        Reconfigurable::with_clock(sevens, clock.clone());
    assert!(matches!(
        f.call("k", Mode::AllOrNothing, 3, Some(EPOCH_US)),
        Reply::Decided { allowed: true, .. }
    ));
    assert!(local.check_n(3).unwrap().is_allowed());
    f.quota = ScriptQuota::new(&ones).unwrap();
    local.set_quota(ones, Carry::Debt);
    let Reply::Decided { reset_us, .. } = f.call("k", Mode::AllOrNothing, 0, Some(EPOCH_US)) else {
        panic!("a decision");
    };
    let want = ceil_us(local.check_n(0).unwrap().reset_after());
    assert_eq!((reset_us, want), (429, 429));
    // The earlier form, 16 bytes with no units: read in this call's units.
    let old: Vec<u8> = [(EPOCH_US + 500) as f64, 0.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let () = redis::cmd("SET")
        .arg("old")
        .arg(old)
        .query(&mut f.con)
        .unwrap();
    let Reply::Decided { reset_us, .. } = f.call("old", Mode::AllOrNothing, 0, Some(EPOCH_US))
    else {
        panic!("a decision");
    };
    assert_eq!(reset_us, 500);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Calendar windows through the script (its test variant reads `now` from an argument) and
    /// through the local `CalendarWindow` at the same instants: every decision and figure agrees,
    /// across month ends, leap days and ISO weeks, and a server clock that steps back.
    #[test]
    fn the_calendar_script_decides_as_the_local_window(
        code in 0u64..6,
        start_us in 0u64..8_000_000_000_000_000,
        steps in prop::collection::vec((0u64..4_000_000_000_000, 0u32..6, 0u8..10), 1..60),
    ) {
        use crate::window::calendar::CalendarWindow;
        use crate::window::civil::Calendar;
        let period = [
            Calendar::Minute, Calendar::Hour, Calendar::Day,
            Calendar::Week, Calendar::Month, Calendar::Year,
        ][code as usize];
        let test = "the_calendar_script_decides_as_the_local_window";
        let Some(server) = redis_server::RedisServer::start(test) else {
            return Ok(());
        };
        let mut con = redis::Client::open(server.url()).unwrap().get_connection().unwrap();
        let calendar = redis::Script::new(&script::with_now_from_args(super::calendar::SOURCE));
        let clock = ManualClock::new();
        let limit = 7;
        let local = CalendarWindow::with_clock(limit, period, clock.clone());
        let mut t_us = start_us;
        for (i, &(advance, n, kind)) in steps.iter().enumerate() {
            t_us = match kind {
                0..=3 => t_us + (advance >> (kind * 10)),
                4..=8 => t_us + advance % 1_000_000,
                // Now and then a step back: a failover to a replica whose clock trails.
                _ => t_us.saturating_sub(advance % 7_200_000_000),
            };
            clock.set(t_us * 1000);
            let mut call = calendar.prepare_invoke();
            call.key("c").arg(period.code()).arg(limit).arg(n).arg(t_us);
            let values: Vec<i64> = call.invoke(&mut con).expect("the script runs");
            let d = local.check_n(n).unwrap();
            let want = vec![
                i64::from(d.is_allowed()),
                d.remaining() as i64,
                ceil_us(d.retry_after()) as i64,
                ceil_us(d.reset_after()) as i64,
            ];
            prop_assert_eq!(values, want, "step {} ({:?}, n = {}, t = {} us)", i, period, n, t_us);
        }
    }
}
