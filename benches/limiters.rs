//! Criterion benchmarks: one harness, groups by concern.
//!
//! `cargo bench --bench limiters` (all), or a group: `cargo bench --bench limiters -- allow`.
//! The same subjects feed `cargo run --release --example compare`, which prints the ratios.

mod subjects;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use std::time::Duration;
use subjects::{
    Subject, allow_subjects, deny_subjects, floors, keyed_subjects, run_threads, throttle_subjects,
};

fn per_op(c: &mut Criterion, group: &str, subjects: Vec<Subject>) {
    let mut g = c.benchmark_group(group);
    for s in &subjects {
        g.bench_function(s.name, |b| b.iter_custom(|iters| run_threads(s, 1, iters)));
    }
    g.finish();
}

/// The raw costs the hot path is made of: clock reads, one uncontended CAS.
fn floor(c: &mut Criterion) {
    per_op(c, "floor", floors());
}

/// Single-thread allow path: a quota nothing hits.
fn allow(c: &mut Criterion) {
    per_op(c, "allow", allow_subjects());
}

/// Single-thread deny path.
fn deny(c: &mut Criterion) {
    per_op(c, "deny", deny_subjects(false));
}

/// Single-thread deny path, the caller reading the retry-after.
fn deny_retry(c: &mut Criterion) {
    per_op(c, "deny-retry", deny_subjects(true));
}

/// The throttle's reservation, lock-free and behind a mutex.
fn throttle(c: &mut Criterion) {
    per_op(c, "throttle", throttle_subjects());
}

/// Threads hammering one limiter: 1, 2, 4, ... up to twice the available cores. Reported per
/// check per thread (criterion's time is the wall time of `iters` checks on every thread).
fn contended(c: &mut Criterion) {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let counts: Vec<usize> = std::iter::successors(Some(1), |t| Some(t * 2))
        .take_while(|&t| t <= 2 * cores)
        .collect();
    let mut g = c.benchmark_group("contended");
    for s in allow_subjects() {
        for &threads in &counts {
            g.bench_with_input(BenchmarkId::new(s.name, threads), &threads, |b, &t| {
                b.iter_custom(|iters| run_threads(&s, t, iters))
            });
        }
    }
    g.finish();
}

/// Keyed limiters on keys already present: one key, 100 000 keys, and 2 threads on distinct keys.
fn keyed(c: &mut Criterion) {
    for keys in [1u64, 100_000] {
        let subjects = keyed_subjects(keys);
        for s in &subjects {
            s.run_keys_warm(keys, 0);
        }
        let mut g = c.benchmark_group(format!("keyed-{keys}"));
        for s in &subjects {
            g.bench_function(s.name, |b| b.iter_custom(|iters| run_threads(s, 1, iters)));
        }
        // The second thread's keys, created only now: the runs above held `keys` keys.
        for s in &subjects {
            s.run_keys_warm(keys, 1);
        }
        for s in &subjects {
            g.bench_function(format!("{} x2 threads", s.name), |b| {
                b.iter_custom(|iters| run_threads(s, 2, iters))
            });
        }
        g.finish();
    }
}

/// What a new key costs a keyed limiter holding `keys` keys: below its cap (an insertion), and at
/// its cap under steady churn (old buckets fill again at the rate new keys come, so each new key
/// evicts one). Both on a manual clock moved by the same step per new key.
fn keyed_churn(c: &mut Criterion) {
    use atomic_limiter::{Gcra, Keyed, ManualClock, Quota};
    use std::time::Instant;
    type Map = Keyed<u64, Gcra<ManualClock>>;
    let quota = Quota::per_second(1);
    // Keys checked once each, one per `step` ns: key k's bucket is full again 1 s after its check.
    let fill = |keyed: &Map, clock: &ManualClock, keys: std::ops::Range<u64>, step: u64| {
        for k in keys {
            let _ = keyed.check_key(&k);
            clock.advance_nanos(step);
        }
    };
    let mut g = c.benchmark_group("keyed-churn");
    g.sample_size(10);
    for keys in [50_000u64, 1_000_000] {
        let step = 1_000_000_000 / keys;
        // Below the cap: a map holding `keys` keys, room for three times as many; refilled
        // (untimed) before it would reach its cap.
        let mut below: Option<(Map, ManualClock, u64)> = None;
        g.bench_function(BenchmarkId::new("new key below the cap", keys), |b| {
            b.iter_custom(|iters| {
                let (keyed, clock, next) = below.get_or_insert_with(|| {
                    let clock = ManualClock::new();
                    let keyed = Keyed::gcra_with_clock(quota, 4 * keys as usize, clock.clone());
                    fill(&keyed, &clock, 0..keys, step);
                    (keyed, clock, keys)
                });
                if *next + iters > 3 * keys {
                    *keyed = Keyed::gcra_with_clock(quota, 4 * keys as usize, clock.clone());
                    fill(keyed, clock, 0..keys, step);
                    *next = keys;
                }
                let start = Instant::now();
                fill(keyed, clock, *next..*next + iters, step);
                *next += iters;
                start.elapsed()
            })
        });
        // At the cap: `keys` keys held, and every new key makes room by evicting a full one.
        let clock = ManualClock::new();
        let at_cap: Map = Keyed::gcra_with_clock(quota, keys as usize, clock.clone());
        fill(&at_cap, &clock, 0..keys, step);
        let mut next = keys;
        g.bench_function(
            BenchmarkId::new("new key at the cap, steady churn", keys),
            |b| {
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    fill(&at_cap, &clock, next..next + iters, step);
                    next += iters;
                    start.elapsed()
                })
            },
        );
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    targets = floor, allow, deny, deny_retry, throttle, contended, keyed, keyed_churn
}
criterion_main!(benches);
