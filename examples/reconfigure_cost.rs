//! What being reconfigurable costs a check: each reconfigurable limiter against its plain form,
//! on the allow path and on the deny path, measured alternately in one run (medians of the
//! repetitions, and their ratio); then what one change of quota costs, with no check running and
//! with three threads checking throughout.
//!
//! `cargo run --release --example reconfigure_cost` (add `-- --quick` for fewer repetitions,
//! `-- --only NAME` for the rows whose name contains `NAME`).

use std::hint::black_box;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use atomic_limiter::algorithm::{
    Fixed, GcraAlgorithm, Sliding, TokenBucketAlgorithm, WindowAlgorithm,
};
use atomic_limiter::{
    Decision, FixedWindow, Gcra, QuantaClock, Quota, Reconfigurable, ReconfigurableLog,
    ReconfigurableSharded, ReconfigurableThrottle, Sharded, SlidingWindowCounter, SlidingWindowLog,
    Throttle, TokenBucket,
};

/// ns per check of `check`, run `iters` times.
///
/// Each check is a call through a pointer the compiler cannot see through, as a server's handler
/// makes it: inlined into this loop, the plain limiter's parameters would be loaded once and kept
/// in registers across checks, which no real check gets (and a reconfigurable limiter, whose
/// parameters can change between two checks, cannot).
fn time(iters: u64, check: &dyn Fn() -> Decision) -> f64 {
    let check = black_box(check);
    let start = Instant::now();
    let mut ok = 0u64;
    for _ in 0..iters {
        ok += u64::from(black_box(check()).is_allowed());
    }
    black_box(ok);
    start.elapsed().as_nanos() as f64 / iters as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The rows to run: those whose name contains the argument after `--only`, or every row.
fn wanted(name: &str) -> bool {
    static ONLY: OnceLock<Option<String>> = OnceLock::new();
    let only = ONLY.get_or_init(|| {
        let args: Vec<String> = std::env::args().collect();
        let at = args.iter().position(|a| a == "--only")?;
        args.get(at + 1).cloned()
    });
    only.as_ref()
        .is_none_or(|only| name.contains(only.as_str()))
}

/// Times `plain` and `tunable` alternately, `reps` times each; prints both medians and the ratio.
fn pair(name: &str, reps: usize, plain: &dyn Fn() -> Decision, tunable: &dyn Fn() -> Decision) {
    if !wanted(name) {
        return;
    }
    let iters = 2_000_000;
    let (_, _) = (time(iters / 10, plain), time(iters / 10, tunable));
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        a.push(time(iters, plain));
        b.push(time(iters, tunable));
    }
    let (a, b) = (median(a), median(b));
    // `Reconfigurable<Gcra>` admitting is held to 1.15x (as in `compare`), every other row to 1.2x.
    let allowed = if name == "Gcra, allow" { 1.15 } else { 1.2 };
    let verdict = if b / a <= allowed { "within" } else { "ABOVE" };
    println!(
        "  {name:<34} {a:>7.2} ns  {b:>7.2} ns  {:>5.2}x  {verdict} {allowed}x",
        b / a
    );
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let reps = if quick { 5 } else { 15 };
    // Nothing is refused at a billion a second; one an hour is refused after the first.
    let open = Quota::per_second(1_000_000_000);
    let shut = Quota::per_hour(1).with_burst(1);
    println!(
        "What being reconfigurable costs a check (median ns per check; ratio: reconfigurable / plain,\n\
         and whether it is within what is allowed: 1.15x for Gcra's admission, 1.2x elsewhere)"
    );
    println!(
        "  {:<34} {:>10}  {:>10}  {:>6}  bound",
        "limiter, path", "plain", "reconf.", "ratio"
    );
    for (path, q) in [("allow", open), ("deny", shut)] {
        let clock = QuantaClock::new();
        let plain = Gcra::with_clock(q, clock.clone());
        let tunable: Reconfigurable<GcraAlgorithm, _> =
            Reconfigurable::with_clock(q, clock.clone());
        let _ = (plain.check(), tunable.check());
        pair(&format!("Gcra, {path}"), reps, &|| plain.check(), &|| {
            tunable.check()
        });

        let plain = TokenBucket::with_clock(q, clock.clone());
        let tunable: Reconfigurable<TokenBucketAlgorithm, _> =
            Reconfigurable::with_clock(q, clock.clone());
        let _ = (plain.check(), tunable.check());
        pair(
            &format!("TokenBucket, {path}"),
            reps,
            &|| plain.check(),
            &|| tunable.check(),
        );

        let w = if path == "allow" {
            Quota::per_second(1_000_000_000)
        } else {
            Quota::per_hour(1)
        };
        let plain = FixedWindow::with_clock(w, clock.clone()).unwrap();
        let tunable: Reconfigurable<WindowAlgorithm<Fixed>, _> =
            Reconfigurable::try_with_clock(w, clock.clone()).unwrap();
        let _ = (plain.check(), tunable.check());
        pair(
            &format!("FixedWindow, {path}"),
            reps,
            &|| plain.check(),
            &|| tunable.check(),
        );

        let w = if path == "allow" {
            Quota::per_second(1_000_000)
        } else {
            Quota::per_hour(1)
        };
        let plain = SlidingWindowCounter::with_clock(w, clock.clone()).unwrap();
        let tunable: Reconfigurable<WindowAlgorithm<Sliding>, _> =
            Reconfigurable::try_with_clock(w, clock.clone()).unwrap();
        let _ = (plain.check(), tunable.check());
        pair(
            &format!("SlidingWindowCounter, {path}"),
            reps,
            &|| plain.check(),
            &|| tunable.check(),
        );

        let plain = Sharded::gcra_with_clock(q, 4, clock.clone());
        let tunable: ReconfigurableSharded<GcraAlgorithm, _> =
            ReconfigurableSharded::with_clock(q, 4, clock.clone());
        let _ = (plain.check(), tunable.check());
        pair(
            &format!("Sharded<Gcra>, {path}"),
            reps,
            &|| plain.check(),
            &|| tunable.check(),
        );

        let plain = Throttle::with_clock(q, clock.clone());
        let tunable = ReconfigurableThrottle::with_clock(q, clock.clone());
        let _ = (atomic_limiter::RateLimiter::check(&plain), tunable.check());
        pair(
            &format!("Throttle (check), {path}"),
            reps,
            &|| atomic_limiter::RateLimiter::check(&plain),
            &|| tunable.check(),
        );

        let w = if path == "allow" {
            Quota::per_second(1 << 20).with_burst(1)
        } else {
            Quota::per_hour(1)
        };
        if path == "allow" {
            // The log keeps every admission of the window: a window of one ns keeps few.
            let w = Quota::try_new(1 << 20, Duration::from_nanos(1 << 20), 1).unwrap();
            let plain = SlidingWindowLog::with_clock(w, clock.clone()).unwrap();
            let tunable = ReconfigurableLog::try_with_clock(w, clock.clone()).unwrap();
            pair("SlidingWindowLog, allow", reps, &|| plain.check(), &|| {
                tunable.check()
            });
        } else {
            let plain = SlidingWindowLog::with_clock(w, clock.clone()).unwrap();
            let tunable = ReconfigurableLog::try_with_clock(w, clock.clone()).unwrap();
            let _ = (plain.check(), tunable.check());
            pair("SlidingWindowLog, deny", reps, &|| plain.check(), &|| {
                tunable.check()
            });
        }
    }
    changes(if quick { 500 } else { 2000 });
}

/// The median and the 99th percentile of `changes` calls of `set_quota`, in µs, with no check
/// running, then with three threads checking the same limiter until the changes are done (on a
/// two-core host, some checks are always preempted mid-check: a change that waited for them
/// would wait out a time slice).
fn changes(changes: usize) {
    if !wanted("set_quota") {
        return;
    }
    println!("What one change costs (set_quota on a Reconfigurable<GcraAlgorithm>, µs)");
    println!("  {:<34} {:>10}  {:>10}", "while", "median", "99th pct.");
    let a = Quota::per_second(1_000_000);
    let b = Quota::per_second(2_000_000);
    for checkers in [0, 3] {
        let limiter: Reconfigurable<GcraAlgorithm, _> =
            Reconfigurable::with_clock(a, QuantaClock::new());
        let stop = AtomicBool::new(false);
        let mut took: Vec<f64> = std::thread::scope(|s| {
            for _ in 0..checkers {
                s.spawn(|| {
                    // Bounded in time as well as by the changes' end.
                    let start = Instant::now();
                    while !stop.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(60)
                    {
                        let _ = black_box(limiter.check());
                    }
                });
            }
            let took = (0..changes)
                .map(|i| {
                    let t = Instant::now();
                    limiter.set_quota(if i % 2 == 0 { b } else { a }, atomic_limiter::Carry::Debt);
                    t.elapsed().as_secs_f64() * 1e6
                })
                .collect();
            stop.store(true, Ordering::Relaxed);
            took
        });
        took.sort_by(f64::total_cmp);
        let label = if checkers == 0 {
            "no check running".to_string()
        } else {
            format!("{checkers} threads checking")
        };
        println!(
            "  {label:<34} {:>10.2}  {:>10.2}",
            took[took.len() / 2],
            took[took.len() * 99 / 100]
        );
    }
}
