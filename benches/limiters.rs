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
            s.run_keys_warm(keys);
        }
        let mut g = c.benchmark_group(format!("keyed-{keys}"));
        for s in &subjects {
            g.bench_function(s.name, |b| b.iter_custom(|iters| run_threads(s, 1, iters)));
            g.bench_function(format!("{} x2 threads", s.name), |b| {
                b.iter_custom(|iters| run_threads(s, 2, iters))
            });
        }
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    targets = floor, allow, deny, deny_retry, throttle, contended, keyed
}
criterion_main!(benches);
