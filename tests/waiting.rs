//! Waiting instead of rejecting: returns at the right instant, gives up honestly, never spins.

use atomic_limiter::{
    Clock, FixedWindow, Gcra, ManualClock, Quota, RateLimiter, SlidingWindowCounter, TokenBucket,
    Wait, WaitError,
};
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// Polls a future to completion; the sleeps in these tests are ready at once (they move a
/// `ManualClock`), so no runtime is needed.
fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

type Maker = Box<dyn Fn() -> Box<dyn RateLimiterSized>>;

fn limiters(clock: &ManualClock) -> Vec<(&'static str, Maker)> {
    let (a, b, c, d) = (clock.clone(), clock.clone(), clock.clone(), clock.clone());
    let q = Quota::per_second(10).with_burst(2);
    vec![
        (
            "gcra",
            Box::new(move || Box::new(Gcra::with_clock(q, a.clone())) as Box<dyn RateLimiterSized>),
        ),
        (
            "bucket",
            Box::new(move || Box::new(TokenBucket::with_clock(q, b.clone()))),
        ),
        (
            "fixed",
            Box::new(move || Box::new(FixedWindow::with_clock(q, c.clone()).unwrap())),
        ),
        (
            "sliding",
            Box::new(move || Box::new(SlidingWindowCounter::with_clock(q, d.clone()).unwrap())),
        ),
    ]
}

/// Object-safe access to the sized-only waiting methods, for looping over limiter kinds.
trait RateLimiterSized {
    fn wait_manual(&self, n: u32, wait: Wait, clock: &ManualClock) -> Result<(), WaitError>;
    fn until_manual(&self, n: u32, wait: Wait, clock: &ManualClock) -> Result<(), WaitError>;
    /// Takes every token, then returns the retry-after of one more (refused) check.
    fn drain_and_refuse(&self) -> Duration;
}

impl<L: RateLimiter> RateLimiterSized for L {
    fn wait_manual(&self, n: u32, wait: Wait, clock: &ManualClock) -> Result<(), WaitError> {
        self.wait_n_with(n, wait, |d| clock.advance(d))
            .map(|d| assert!(d.is_allowed()))
    }
    fn until_manual(&self, n: u32, wait: Wait, clock: &ManualClock) -> Result<(), WaitError> {
        block_on(self.until_n_ready_with(n, wait, |d| {
            let clock = clock.clone();
            async move { clock.advance(d) }
        }))
        .map(|d| assert!(d.is_allowed()))
    }
    fn drain_and_refuse(&self) -> Duration {
        loop {
            let d = self.check();
            if d.is_denied() {
                return d.retry_after();
            }
        }
    }
}

/// After draining, a wait returns exactly at the instant the refusal advertised: one sleep of
/// `retry_after`, no more (the retry-afters are the shortest sufficient waits), for every limiter,
/// blocking and asynchronous.
#[test]
fn waits_return_at_the_advertised_instant() {
    for asynchronous in [false, true] {
        let clock = ManualClock::new();
        for (name, make) in limiters(&clock) {
            let l = make();
            let advertised = l.drain_and_refuse();
            let start = clock.now();
            let wait = Wait::up_to(Duration::from_secs(10));
            if asynchronous {
                l.until_manual(1, wait, &clock).unwrap();
            } else {
                l.wait_manual(1, wait, &clock).unwrap();
            }
            assert_eq!(
                Duration::from_nanos(clock.now() - start),
                advertised,
                "{name}, async {asynchronous}"
            );
        }
    }
}

#[test]
fn until_ready_for_one_token() {
    let clock = ManualClock::new();
    let g = Gcra::with_clock(Quota::per_second(10).with_burst(1), clock.clone());
    assert!(g.check().is_allowed());
    let d = block_on(
        g.until_ready_with(Wait::up_to(Duration::from_secs(1)), |d| {
            let clock = clock.clone();
            async move { clock.advance(d) }
        }),
    )
    .unwrap();
    assert!(d.is_allowed());
    assert_eq!(clock.now(), 100_000_000);
}

#[test]
fn gcra_waits_exactly_one_period() {
    let clock = ManualClock::new();
    let g = Gcra::with_clock(Quota::per_second(10).with_burst(1), clock.clone());
    assert!(g.check().is_allowed());
    let d = g
        .wait_n_with(1, Wait::up_to(Duration::from_secs(1)), |d| clock.advance(d))
        .unwrap();
    assert!(d.is_allowed());
    assert_eq!(clock.now(), 100_000_000);
}

#[test]
fn gives_up_past_the_maximum_without_sleeping_past_it() {
    let clock = ManualClock::new();
    let g = Gcra::with_clock(Quota::per_second(1).with_burst(1), clock.clone());
    assert!(g.check().is_allowed());
    let e = g.wait_n_with(1, Wait::up_to(Duration::from_millis(999)), |d| {
        clock.advance(d)
    });
    assert_eq!(
        e,
        Err(WaitError::TimedOut {
            waited: Duration::ZERO,
            retry_after: Duration::from_secs(1)
        })
    );
    assert_eq!(clock.now(), 0, "no sleep was taken past the maximum");
    assert!(matches!(
        g.wait_n_with(2, Wait::up_to(Duration::MAX), |_| ()),
        Err(WaitError::InsufficientCapacity(_))
    ));
}

#[test]
fn jitter_sleeps_no_less_and_at_most_the_jitter_more() {
    let jitter = Duration::from_millis(5);
    let mut sleeps = vec![];
    for _ in 0..200 {
        let clock = ManualClock::new();
        let g = Gcra::with_clock(Quota::per_second(10).with_burst(1), clock.clone());
        assert!(g.check().is_allowed());
        let d = g
            .wait_n_with(
                1,
                Wait::up_to(Duration::from_secs(1)).with_jitter(jitter),
                |d| {
                    sleeps.push(d);
                    clock.advance(d);
                },
            )
            .unwrap();
        assert!(d.is_allowed());
    }
    let base = Duration::from_millis(100);
    assert!(sleeps.iter().all(|&d| d >= base && d <= base + jitter));
    let distinct: std::collections::HashSet<_> = sleeps.iter().collect();
    assert!(
        distinct.len() > 100,
        "jitter is not spreading: {} distinct of 200",
        distinct.len()
    );
}

#[test]
fn blocking_wait_on_a_real_clock() {
    let g = Gcra::with_clock(
        Quota::per_second(200).with_burst(1),
        atomic_limiter::StdClock::new(),
    );
    assert!(g.check().is_allowed());
    let t = std::time::Instant::now();
    assert!(
        g.wait_n(1, Wait::up_to(Duration::from_secs(5)))
            .unwrap()
            .is_allowed()
    );
    // At least the advertised 5 ms (a sleep never ends early), nothing more is asserted.
    assert!(t.elapsed() >= Duration::from_millis(4));
}

#[test]
fn jitter_of_any_duration_is_accepted() {
    for jitter in [
        Duration::MAX,
        Duration::from_nanos(u64::MAX),
        Duration::from_nanos(u64::MAX - 1),
        Duration::from_secs(u64::MAX / 1_000_000_000 + 1),
    ] {
        let clock = ManualClock::new();
        let g = Gcra::with_clock(Quota::per_second(10).with_burst(1), clock.clone());
        assert!(g.check().is_allowed());
        let mut slept = vec![];
        let d = g
            .wait_n_with(1, Wait::up_to(Duration::MAX).with_jitter(jitter), |d| {
                assert!(slept.len() < 3, "waiting does not end: {slept:?}");
                slept.push(d);
                // The sleep may be centuries long; the manual clock only goes far enough, so
                // as not to saturate at the end of u64.
                clock.advance(d.min(Duration::from_secs(3600)));
            })
            .unwrap();
        assert!(d.is_allowed());
        assert_eq!(slept.len(), 1);
        assert!(slept[0] >= Duration::from_millis(100));
        // A bounded wait with the same jitter gives up instead of overflowing.
        let g = Gcra::with_clock(Quota::per_second(10).with_burst(1), clock.clone());
        assert!(g.check().is_allowed());
        let r = g.wait_n_with(
            1,
            Wait::up_to(Duration::from_secs(1)).with_jitter(jitter),
            |d| clock.advance(d),
        );
        assert!(r.is_ok() || matches!(r, Err(WaitError::TimedOut { .. })));
    }
}

/// Waiting on a keyed limiter: a key over its rate, and a new key at a full table, each wait
/// ends at the advertised instant; the async form the same.
#[test]
fn keyed_limiters_can_be_waited_on() {
    let clock = ManualClock::new();
    let keyed = atomic_limiter::Keyed::gcra_with_clock(
        Quota::per_second(10).with_burst(1),
        1,
        clock.clone(),
    );
    assert!(keyed.check_key::<str>("alice").is_allowed());
    let start = clock.now();
    let d = keyed
        .wait_key_n_with("alice", 1, Wait::up_to(Duration::from_secs(1)), |d| {
            clock.advance(d)
        })
        .unwrap();
    assert!(d.is_allowed());
    assert_eq!(clock.now() - start, 100_000_000);
    // "bob" finds the table full until alice's bucket is full again; then he gets in.
    assert!(keyed.check_key("bob").is_table_full());
    let start = clock.now();
    let c = clock.clone();
    let d = block_on(keyed.until_key_n_ready_with(
        "bob",
        1,
        Wait::up_to(Duration::from_secs(1)),
        move |d| {
            c.advance(d);
            std::future::ready(())
        },
    ))
    .unwrap();
    assert!(d.is_allowed());
    assert_eq!(clock.now() - start, 100_000_000);
    // Too large a request is an error at once, not a wait.
    assert!(matches!(
        keyed.wait_key_n_with("bob", 2, Wait::up_to(Duration::MAX), |_| ()),
        Err(WaitError::InsufficientCapacity(_))
    ));
}

/// One import brings the traits a limiter's methods come from.
#[test]
fn the_prelude_brings_the_waiting_methods() {
    mod user {
        use atomic_limiter::prelude::*;
        use atomic_limiter::{Gcra, ManualClock, Quota, Wait};
        use std::time::Duration;

        pub fn wait_once() -> bool {
            let clock = ManualClock::new();
            let g = Gcra::with_clock(Quota::per_second(10), clock.clone());
            let c = clock.clone();
            g.wait_n_with(1, Wait::up_to(Duration::from_secs(1)), move |d| {
                c.advance(d)
            })
            .is_ok_and(|d| d.is_allowed())
                && clock.now() == 0
        }
    }
    assert!(user::wait_once());
}
