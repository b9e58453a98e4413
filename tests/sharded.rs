//! The sharded limiter: the whole quota and never more, under threads, skew and a moving clock.

mod common;

use atomic_limiter::{Clock, ManualClock, Quota, Sharded};
use common::Model;
use std::sync::Barrier;
use std::thread;
use std::time::Duration;

fn threads() -> usize {
    2 * thread::available_parallelism().map_or(2, |n| n.get())
}

#[test]
fn frozen_clock_threads_take_exactly_the_burst() {
    for burst in [4u32, 37, 1000] {
        let q = Quota::per_second(1000).with_burst(burst);
        let s = Sharded::gcra_with_clock(q, 4, ManualClock::new());
        let barrier = Barrier::new(threads());
        let admitted: usize = thread::scope(|scope| {
            let hs: Vec<_> = (0..threads())
                .map(|_| {
                    scope.spawn(|| {
                        barrier.wait();
                        (0..burst).filter(|_| s.check().is_allowed()).count()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(
            admitted,
            burst as usize,
            "burst {burst} over {} shards",
            s.shard_count()
        );
    }
}

/// All load from one thread (one home shard): 1000/s, burst 100, polled every 100 µs for 2 s,
/// admits within 1 % of the global quota's 100 + 2000.
#[test]
fn skewed_load_gets_the_whole_quota() {
    let clock = ManualClock::new();
    let q = Quota::per_second(1000).with_burst(100);
    let s = Sharded::gcra_with_clock(q, 8, clock.clone());
    assert_eq!(s.shard_count(), 8);
    let mut admitted = 0u64;
    while clock.now() < 2_000_000_000 {
        admitted += s.check().is_allowed() as u64;
        clock.advance(Duration::from_micros(100));
    }
    let ideal = Model::admission_bound(&q, 0, clock.now()) as u64;
    assert!(admitted <= ideal, "{admitted} > {ideal}");
    assert!(
        admitted as f64 >= 0.99 * ideal as f64,
        "{admitted} < 99% of {ideal}"
    );
}

/// Threads on different home shards while another advances the clock: the total never exceeds the
/// global quota's bound at the latest time.
#[test]
fn concurrent_advance_never_exceeds_the_global_quota() {
    for round in 0..20u64 {
        let clock = ManualClock::new();
        let q = Quota::per_second(10_000).with_burst(64);
        let s = Sharded::gcra_with_clock(q, 4, clock.clone());
        let admitted: u64 = thread::scope(|scope| {
            let ticker = scope.spawn(|| {
                for _ in 0..2000 {
                    clock.advance_nanos(1_000 + round);
                }
            });
            let hs: Vec<_> = (0..threads())
                .map(|t| {
                    let s = &s;
                    scope.spawn(move || {
                        (0..3000)
                            .filter(|i| {
                                s.check_n_from(t, 1 + (*i as u32 % 3))
                                    .is_ok_and(|d| d.is_allowed())
                            })
                            .map(|i| 1 + i as u64 % 3)
                            .sum::<u64>()
                    })
                })
                .collect();
            ticker.join().unwrap();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        let bound = Model::admission_bound(&q, 0, clock.now()) as u64;
        assert!(admitted <= bound, "round {round}: {admitted} > {bound}");
    }
}

/// A refusal has asked every shard: waiting its retry-after passes, 1 ns less does not.
#[test]
fn refusal_figures_cover_every_shard() {
    let clock = ManualClock::new();
    let q = Quota::per_second(4).with_burst(4);
    let s = Sharded::gcra_with_clock(q, 4, clock.clone());
    assert!((0..4).all(|_| s.check().is_allowed()));
    let d = s.check();
    assert!(d.is_denied());
    assert_eq!(d.remaining(), 0);
    assert_eq!(d.retry_after(), Duration::from_secs(1));
    assert_eq!(d.reset_after(), Duration::from_secs(1));
    clock.advance(d.retry_after() - Duration::from_nanos(1));
    assert!(s.check().is_denied());
    clock.advance_nanos(1);
    assert!(s.check().is_allowed());
}

#[test]
fn one_request_is_at_most_one_share() {
    let q = Quota::per_second(100).with_burst(10);
    let s = Sharded::gcra_with_clock(q, 4, ManualClock::new());
    // Shares of 3, 3, 2, 2.
    assert_eq!(s.check_n(4).unwrap_err().burst, 3);
    assert!(s.check_n(3).unwrap().is_allowed());
}
