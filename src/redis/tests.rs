//! The script against the local [`Gcra`](crate::Gcra), on a real redis-server: the same decisions
//! and figures at microsecond readings.

use core::time::Duration;

use proptest::prelude::*;

use super::script::{self, Mode, Reply, ScriptQuota};
use crate::{Gcra, ManualClock, Quota};

#[path = "test_server.rs"]
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
        let source = script::source_with_now_from_args();
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

    /// The grant-up-to mode gives what the local GCRA would admit one token at a time, and no more.
    #[test]
    fn grant_up_to_takes_what_fits(
        q in quota(),
        steps in prop::collection::vec((0u64..400_000, 0u32..60), 1..40),
    ) {
        let source = script::source_with_now_from_args();
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
