//! Side by side on this machine: what a lock-free check costs next to a mutex and next to governor
//! and ratelimit, and how accurate each is. Runs in well under 30 seconds.
//!
//! `cargo run --release --example compare [-- --json] [-- --svg docs/throughput.svg] [-- --quick]
//! [-- --targets]`
//!
//! It opens with a verdict in plain words, then the tables behind it. `--targets` adds the
//! development targets (ratios the issues set, met or missed).
//!
//! Method: every measurement is repeated, the repetitions of all subjects interleaved (subject A,
//! B, C, then A, B, C again ...) so that drift in the machine hits all of them alike; the table shows
//! the median and the spread (min to max). A ratio is one median over the other, so it is the
//! quotient of the two figures printed.

#[path = "../benches/common/stats.rs"]
mod stats;
#[path = "../benches/subjects.rs"]
mod subjects;

use stats::median;

use atomic_limiter::baseline::MutexTokenBucket;
use atomic_limiter::{Gcra, ManualClock, Quota, RateLimiter, TokenBucket};
use std::fmt::Write as _;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use subjects::{
    Kind, Subject, allow_subjects, bucket_floor_subjects, deny_subjects, floors, keyed_subjects,
    run_threads, throttle_subjects,
};

struct Options {
    json: bool,
    svg: Option<String>,
    quick: bool,
    targets: bool,
}

fn options() -> Options {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut o = Options {
        json: false,
        svg: None,
        quick: false,
        targets: false,
    };
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--json" => o.json = true,
            "--quick" => o.quick = true,
            "--targets" => o.targets = true,
            "--svg" => {
                i += 1;
                o.svg = args.get(i).cloned();
            }
            other => {
                eprintln!(
                    "unknown argument {other}; expected --json, --svg FILE, --quick, --targets"
                );
                std::process::exit(2);
            }
        }
        i += 1;
    }
    o
}

/// Samples of one subject, in ns per operation (or Mops/s for throughput).
struct Series {
    name: &'static str,
    kind: Kind,
    samples: Vec<f64>,
}

fn spread(v: &[f64]) -> (f64, f64) {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(0.0, f64::max);
    (min, max)
}

/// Iterations that take about `target` on one thread.
fn calibrate(s: &Subject, target: Duration) -> u64 {
    let mut iters = 1_000u64;
    loop {
        let t = run_threads(s, 1, iters);
        if t >= target / 8 || iters >= 1 << 30 {
            let per = t.as_secs_f64() / iters as f64;
            return ((target.as_secs_f64() / per) as u64).max(1_000);
        }
        iters *= 4;
    }
}

/// ns per operation on one thread, `reps` interleaved repetitions.
fn single(subjects: &[Subject], reps: usize, target: Duration) -> Vec<Series> {
    single_warmed(subjects, reps, target, 0)
}

/// [`single`], each timed run preceded by `warm` untimed operations of the same subject: one
/// pass over a keyed subject's keys, so that each starts with its own table as warm as its own
/// traffic keeps it, whichever subject ran before.
fn single_warmed(subjects: &[Subject], reps: usize, target: Duration, warm: u64) -> Vec<Series> {
    let iters: Vec<u64> = subjects.iter().map(|s| calibrate(s, target)).collect();
    let mut out: Vec<Series> = subjects
        .iter()
        .map(|s| Series {
            name: s.name,
            kind: s.kind,
            samples: vec![],
        })
        .collect();
    for _ in 0..reps {
        for (i, s) in subjects.iter().enumerate() {
            if warm > 0 {
                run_threads(s, 1, warm);
            }
            let t = run_threads(s, 1, iters[i]);
            out[i].samples.push(t.as_nanos() as f64 / iters[i] as f64);
        }
    }
    out
}

/// Total Mops/s with `threads` threads on one limiter, `reps` interleaved repetitions.
fn contended(subjects: &[Subject], threads: usize, reps: usize, target: Duration) -> Vec<Series> {
    contended_warmed(subjects, threads, reps, target, 0)
}

/// [`contended`], each timed run preceded by `warm` untimed operations on each thread, as in
/// [`single_warmed`].
fn contended_warmed(
    subjects: &[Subject],
    threads: usize,
    reps: usize,
    target: Duration,
    warm: u64,
) -> Vec<Series> {
    let iters: Vec<u64> = subjects
        .iter()
        .map(|s| (calibrate(s, target) / threads as u64).max(1_000))
        .collect();
    let mut out: Vec<Series> = subjects
        .iter()
        .map(|s| Series {
            name: s.name,
            kind: s.kind,
            samples: vec![],
        })
        .collect();
    for _ in 0..reps {
        for (i, s) in subjects.iter().enumerate() {
            if warm > 0 {
                run_threads(s, threads, warm);
            }
            let t = run_threads(s, threads, iters[i]);
            let ops = (iters[i] * threads as u64) as f64;
            out[i].samples.push(ops / t.as_secs_f64() / 1e6);
        }
    }
    out
}

fn find<'a>(v: &'a [Series], name: &str) -> &'a Series {
    v.iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no subject {name}"))
}

/// `num`'s median over `den`'s: the ratio of the two figures the tables print, so that a reader
/// who divides one by the other gets the ratio printed beside them. (The repetitions of every
/// subject are interleaved, so a drift of the host moves both medians alike.)
fn ratio(num: &Series, den: &Series) -> f64 {
    median(&num.samples) / median(&den.samples)
}

struct Target {
    what: String,
    ratio: f64,
    goal: String,
    met: bool,
}

fn target(what: &str, ratio: f64, at_most: Option<f64>, at_least: Option<f64>) -> Target {
    let (goal, met) = match (at_most, at_least) {
        (Some(m), _) => (format!("<= {m}"), ratio <= m),
        (_, Some(m)) => (format!(">= {m}"), ratio >= m),
        _ => (String::new(), true),
    };
    Target {
        what: what.to_string(),
        ratio,
        goal,
        met,
    }
}

// ---------------------------------------------------------------------------------------------
// Accuracy on simulated clocks.

/// A ratelimit clock driven by hand.
#[derive(Clone, Default)]
struct SimClock(Arc<AtomicU64>);

impl ratelimit::Clock for SimClock {
    fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }
}

/// One limiter on a simulated clock: `check()` and "advance the clock by ns".
trait Sim {
    fn check(&mut self) -> Result<(), Duration>;
    fn advance(&mut self, ns: u64);
}

struct OursSim<L> {
    l: L,
    clock: ManualClock,
}

impl<L: RateLimiter> Sim for OursSim<L> {
    fn check(&mut self) -> Result<(), Duration> {
        let d = self.l.check();
        if d.is_allowed() {
            Ok(())
        } else {
            Err(d.retry_after())
        }
    }
    fn advance(&mut self, ns: u64) {
        self.clock.advance_nanos(ns);
    }
}

struct GovSim {
    l: governor::RateLimiter<
        governor::state::NotKeyed,
        governor::state::InMemoryState,
        governor::clock::FakeRelativeClock,
        governor::middleware::NoOpMiddleware<governor::nanos::Nanos>,
    >,
    clock: governor::clock::FakeRelativeClock,
}

impl Sim for GovSim {
    fn check(&mut self) -> Result<(), Duration> {
        use governor::clock::Clock as _;
        self.l
            .check()
            .map_err(|nu| nu.wait_time_from(self.clock.now()))
    }
    fn advance(&mut self, ns: u64) {
        self.clock.advance(Duration::from_nanos(ns));
    }
}

struct RlSim {
    l: ratelimit::Ratelimiter<SimClock>,
    clock: SimClock,
}

impl Sim for RlSim {
    fn check(&mut self) -> Result<(), Duration> {
        match self.l.try_wait() {
            Ok(()) => Ok(()),
            Err(ratelimit::TryWaitError::Insufficient(d)) => Err(d),
            Err(_) => Err(Duration::MAX),
        }
    }
    fn advance(&mut self, ns: u64) {
        self.clock.0.fetch_add(ns, Ordering::Relaxed);
    }
}

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

/// Every limiter for `rate` per second with `burst`, on simulated clocks at 0.
fn sims(rate: u32, burst: u32) -> Vec<(&'static str, Box<dyn Sim>)> {
    let q = Quota::per_second(u64::from(rate)).with_burst(burst);
    let gov_clock = governor::clock::FakeRelativeClock::default();
    let rl_clock = SimClock::default();
    let c1 = ManualClock::new();
    let c2 = ManualClock::new();
    let c3 = ManualClock::new();
    vec![
        (
            "Gcra",
            Box::new(OursSim {
                l: Gcra::with_clock(q, c1.clone()),
                clock: c1,
            }) as Box<dyn Sim>,
        ),
        (
            "TokenBucket",
            Box::new(OursSim {
                l: TokenBucket::with_clock(q, c2.clone()),
                clock: c2,
            }),
        ),
        (
            "MutexTokenBucket",
            Box::new(OursSim {
                l: MutexTokenBucket::<_>::with_clock(q, c3.clone()),
                clock: c3,
            }),
        ),
        (
            "governor",
            Box::new(GovSim {
                l: governor::RateLimiter::direct_with_clock(
                    governor::Quota::per_second(nz(rate)).allow_burst(nz(burst)),
                    gov_clock.clone(),
                ),
                clock: gov_clock,
            }),
        ),
        (
            "ratelimit",
            Box::new(RlSim {
                l: ratelimit::Builder::with_clock(u64::from(rate), rl_clock.clone())
                    .max_tokens(u64::from(burst))
                    .initial_available(u64::from(burst))
                    .build()
                    .unwrap(),
                clock: rl_clock,
            }),
        ),
    ]
}

struct Accuracy {
    scenario: String,
    ideal: u64,
    admitted: Vec<(&'static str, u64)>,
}

/// What the exact quota admits on the same polls: tokens as an exact fraction (numerator over
/// 10^9), refilled by `elapsed × rate`, capped at the burst.
fn exact_admissions(rate: u32, burst: u32, step: u64, span: u64) -> u64 {
    let (rate, cap, one) = (
        u128::from(rate),
        u128::from(burst) * 1_000_000_000,
        1_000_000_000u128,
    );
    let (mut num, mut n, mut t) = (cap, 0, 0);
    while t < span {
        if num >= one {
            num -= one;
            n += 1;
        }
        num = (num + u128::from(step) * rate).min(cap);
        t += step;
    }
    n
}

/// Polls every `step` ns for `span` ns; counts admissions against what the exact quota admits on
/// the same polls.
fn admitted_vs_ideal(rate: u32, burst: u32, step: u64, span: u64) -> Accuracy {
    let ideal = exact_admissions(rate, burst, step, span);
    let mut admitted = vec![];
    for (name, mut sim) in sims(rate, burst) {
        let mut n = 0;
        let mut t = 0;
        while t < span {
            n += sim.check().is_ok() as u64;
            sim.advance(step);
            t += step;
        }
        admitted.push((name, n));
    }
    Accuracy {
        scenario: format!(
            "{rate}/s, burst {burst}, polled every {step} ns for {} s",
            span as f64 / 1e9
        ),
        ideal,
        admitted,
    }
}

/// Sharded accuracy under skew: all load from one thread (one home shard), 1000/s with burst 100
/// over the default shard count, polled every 100 µs for 2 s; admitted against the global quota.
fn skewed_sharded() -> (usize, u64, u64) {
    use atomic_limiter::Clock as _;
    let clock = ManualClock::new();
    let q = Quota::per_second(1000).with_burst(100);
    let shards = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .next_power_of_two()
        .max(8);
    let s = atomic_limiter::Sharded::gcra_with_clock(q, shards, clock.clone());
    let mut admitted = 0;
    while clock.now() < 2_000_000_000 {
        admitted += s.check().is_allowed() as u64;
        clock.advance_nanos(100_000);
    }
    (
        s.shard_count(),
        admitted,
        exact_admissions(1000, 100, 100_000, 2_000_000_000),
    )
}

/// Share of advertised waits that earn a second denial when waited exactly, over `trials`.
fn retry_honesty(trials: u32) -> Vec<(&'static str, u32, u32)> {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let rates = [3u32, 7, 30, 100, 1000, 3_000_000, 7_000_000];
    let mut refused: Vec<(&'static str, u32, u32)> = vec![];
    for trial in 0..trials {
        let rate = rates[trial as usize % rates.len()];
        let burst = 1 + (rnd() % 4) as u32;
        let lead = rnd() % 3_000_000_000 / u64::from(rate).max(1);
        for (i, (name, mut sim)) in sims(rate, burst).into_iter().enumerate() {
            if refused.len() <= i {
                refused.push((name, 0, 0));
            }
            sim.advance(lead);
            // Drain, then ask once more: denied, with a wait.
            let mut wait = None;
            for _ in 0..=burst + 1 {
                if let Err(w) = sim.check() {
                    wait = Some(w);
                    break;
                }
            }
            let Some(w) = wait else { continue };
            sim.advance(u64::try_from(w.as_nanos()).unwrap_or(u64::MAX / 2));
            refused[i].2 += 1;
            if sim.check().is_err() {
                refused[i].1 += 1;
            }
        }
    }
    refused
}

// ---------------------------------------------------------------------------------------------
// Output.

fn table(title: &str, unit: &str, rows: &[Series]) -> String {
    let mut s = format!("\n{title}\n");
    // As wide as the longest name, so long names keep the columns aligned.
    let w = rows.iter().map(|r| r.name.len()).max().unwrap_or(0).max(34);
    let _ = writeln!(
        s,
        "  {:<w$} {:>16} {:>22}",
        "",
        format!("median {unit}"),
        "spread (min..max)"
    );
    for r in rows {
        let (lo, hi) = spread(&r.samples);
        let _ = writeln!(
            s,
            "  {:<w$} {:>16.2} {:>22}",
            r.name,
            median(&r.samples),
            format!("{lo:.2}..{hi:.2}")
        );
    }
    s
}

/// The development targets (ratios the issues set), met or missed, and the contended ratios.
fn print_targets(targets: &[Target], contended_ratios: &[(usize, f64, f64)]) {
    println!("\nDevelopment targets (ratios of the medians printed)");
    let w = targets.iter().map(|t| t.what.len()).max().unwrap_or(0);
    for t in targets {
        let verdict = if t.goal.is_empty() {
            String::new()
        } else if t.met {
            format!("met ({})", t.goal)
        } else {
            format!("missed ({})", t.goal)
        };
        println!("  {:<w$} {:>7.2}x  {verdict}", t.what, t.ratio);
    }
    for (t, m, g) in contended_ratios {
        println!(
            "  {t} thread(s): Gcra / MutexTokenBucket (std) {m:>6.2}x   Gcra / governor {g:>6.2}x  (throughput)"
        );
    }
}

/// `n` with its thousands set apart: 100 000.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

/// "1.52x" when ours is faster by that factor; "0.95x" when slower.
fn times(x: f64) -> String {
    format!("{x:.2}x")
}

/// The verdict: ours against the others, per path, in plain words.
#[allow(clippy::too_many_arguments)]
fn verdict(
    cores: usize,
    reps: usize,
    floor: &[Series],
    allow: &[Series],
    deny: &[Series],
    deny_retry: &[Series],
    contended_rows: &[(usize, Vec<Series>)],
    keyed_rows: &[(u64, Vec<Series>, Vec<Series>)],
    accuracy: &[Accuracy],
    honesty: &[(&'static str, u32, u32)],
) -> String {
    let mut s = String::new();
    let med = |v: &[Series], n: &str| median(&find(v, n).samples);
    let _ = writeln!(
        s,
        "\nVerdict on this machine ({cores} cores). Each figure is the median of {reps} interleaved \
         repetitions; \"(1.76x)\"\nbeside another limiter's figure is its time over ours (or our \
         throughput over its): ours does the same\nwork 1.76 times as fast. A check is a clock read \
         ({:.1} ns alone) and a compare-and-swap ({:.1} ns alone)\nwith a little arithmetic; inside \
         a check they overlap, so a check can take less than their sum.\n",
        med(floor, "QuantaClock::now"),
        med(floor, "uncontended compare_exchange")
    );
    // Rows of: path, ours, then governor, a mutex bucket, ratelimit (empty where not measured).
    let mut rows: Vec<[String; 5]> = vec![[
        "path".into(),
        "ours".into(),
        "governor".into(),
        "a mutex bucket".into(),
        "ratelimit".into(),
    ]];
    // Time per check: the other's time over ours.
    let per_check = |path: &str, v: &[Series], ours: &str, others: [Option<&str>; 3]| {
        let cell = |name: Option<&str>| {
            name.map_or(String::new(), |n| {
                format!(
                    "{:.1} ns ({})",
                    med(v, n),
                    times(ratio(find(v, n), find(v, ours)))
                )
            })
        };
        [
            path.to_string(),
            format!("{ours} {:.1} ns", med(v, ours)),
            cell(others[0]),
            cell(others[1]),
            cell(others[2]),
        ]
    };
    let all = [
        Some("governor check"),
        Some("MutexTokenBucket (std)"),
        Some("ratelimit try_wait"),
    ];
    rows.push(per_check("allowed, one thread", allow, "Gcra", all));
    rows.push(per_check("denied, one thread", deny, "Gcra", all));
    rows.push(per_check(
        "denied, read retry-after",
        deny_retry,
        "Gcra",
        [Some("governor check + wait_time_from"), None, None],
    ));
    if let Some((_, v)) = contended_rows.iter().find(|(t, _)| *t == 2) {
        let ours = find(v, "Sharded<Gcra>");
        let cell = |n: &str| {
            format!(
                "{:.1} Mops/s ({})",
                med(v, n),
                times(ratio(ours, find(v, n)))
            )
        };
        rows.push([
            "2 threads, one quota".into(),
            format!("Sharded<Gcra> {:.1} Mops/s", median(&ours.samples)),
            cell("governor check"),
            cell("MutexTokenBucket (std)"),
            String::new(),
        ]);
    }
    for (keys, one, _) in keyed_rows {
        rows.push(per_check(
            &format!("keyed, {keys} key(s)"),
            one,
            "Keyed<u64, Gcra>",
            [Some("governor keyed check_key"), None, None],
        ));
    }
    let widths: Vec<usize> = (0..5)
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    for r in &rows {
        let mut line = String::from(" ");
        for (c, cell) in r.iter().enumerate() {
            let _ = write!(line, " {cell:<w$} ", w = widths[c]);
        }
        let _ = writeln!(s, "{}", line.trim_end());
    }
    let _ = writeln!(s);
    // Accuracy: the worst relative error of each limiter over the scenarios.
    let mut worst: Vec<(&str, f64)> = vec![];
    for a in accuracy {
        for (name, k) in &a.admitted {
            let err = (*k as f64 / a.ideal as f64 - 1.0) * 100.0;
            match worst.iter_mut().find(|(n, _)| n == name) {
                Some((_, w)) if err.abs() > w.abs() => *w = err,
                Some(_) => {}
                None => worst.push((name, err)),
            }
        }
    }
    let words: Vec<String> = worst
        .iter()
        .map(|(n, w)| {
            if *w == 0.0 {
                format!("{n} exact")
            } else {
                format!("{n} {w:+.2}%")
            }
        })
        .collect();
    let _ = writeln!(
        s,
        "  Accuracy against the exact quota, worst over {} simulated runs: {}.",
        accuracy.len(),
        words.join(", ")
    );
    let words: Vec<String> = honesty
        .iter()
        .map(|(n, r, t)| format!("{n} {:.1}%", 100.0 * f64::from(*r) / f64::from((*t).max(1))))
        .collect();
    let _ = writeln!(
        s,
        "  Waiting exactly the advertised retry-after, refused again: {}.",
        words.join(", ")
    );
    // The conclusion, from the figures above.
    let (ours_allow, gov_allow) = (med(allow, "Gcra"), med(allow, "governor check"));
    let (ours_deny, gov_deny) = (med(deny, "Gcra"), med(deny, "governor check"));
    let mut parts = vec![format!(
        "a Gcra check admits in {ours_allow:.1} ns where governor's takes {gov_allow:.1} ns \
         ({}) and refuses in {ours_deny:.1} ns against {gov_deny:.1} ns ({})",
        times(gov_allow / ours_allow),
        times(gov_deny / ours_deny)
    )];
    if let Some((_, v)) = contended_rows.iter().find(|(t, _)| *t == 2) {
        parts.push(format!(
            "with 2 threads on one quota, Sharded<Gcra> serves {} governor's throughput",
            times(med(v, "Sharded<Gcra>") / med(v, "governor check"))
        ));
    }
    if let Some((keys, one, _)) = keyed_rows.last() {
        parts.push(format!(
            "a keyed check on the default store over {} keys takes {:.2} of governor's time",
            grouped(*keys),
            med(one, "Keyed<u64, Gcra>") / med(one, "governor keyed check_key")
        ));
    }
    let exact = worst
        .iter()
        .all(|(n, w)| *w == 0.0 || !n.starts_with("Gcra"));
    if let (true, Some((_, w))) = (exact, worst.iter().find(|(n, _)| *n == "governor")) {
        parts.push(format!(
            "ours admits exactly the quota where governor is off by {w:+.2}%"
        ));
    }
    let last = parts.pop().unwrap_or_default();
    let _ = writeln!(
        s,
        "\nIn short, on this {cores}-core machine: {}{}{last}.",
        parts.join("; "),
        if parts.is_empty() { "" } else { "; and " }
    );
    s
}

fn json_series(rows: &[Series]) -> String {
    let items: Vec<String> = rows
        .iter()
        .map(|r| {
            let (lo, hi) = spread(&r.samples);
            format!(
                "{{\"name\":\"{}\",\"kind\":\"{:?}\",\"median\":{:.3},\"min\":{:.3},\"max\":{:.3}}}",
                r.name,
                r.kind,
                median(&r.samples),
                lo,
                hi
            )
        })
        .collect();
    format!("[{}]", items.join(","))
}

/// The plot's panels: one family each, a few series, ours first. Series absent from a run are
/// left out.
const PANELS: [(&str, &[&str]); 4] = [
    (
        "GCRA",
        &["Gcra", "Sharded<Gcra>", "MutexGcra (std)", "governor check"],
    ),
    (
        "Token bucket",
        &[
            "TokenBucket",
            "MutexTokenBucket (std)",
            "MutexTokenBucket (parking_lot)",
            "ratelimit try_wait",
        ],
    ),
    (
        "Windows",
        &[
            "FixedWindow",
            "SlidingWindowCounter",
            "MutexFixedWindow (std)",
            "MutexSlidingWindowCounter (std)",
            "SlidingWindowLog (mutex)",
        ],
    ),
    (
        "Coarse clock (one load per check)",
        &[
            "Sharded<Gcra> + CoarseClock",
            "MutexTokenBucket (std) + CoarseClock",
            "governor check + coarse clock",
        ],
    ),
];

/// A line's look by whose it is: ours solid, the mutex baselines dashed, the other crates dotted;
/// colours from one qualitative palette, distinct within a panel.
fn line_style(name: &str, k: usize) -> (&'static str, &'static str) {
    const COLOURS: [&str; 5] = ["#1f77b4", "#2ca02c", "#d62728", "#9467bd", "#ff7f0e"];
    let dash = if name.starts_with("Mutex") || name.contains("(mutex)") {
        "6,4"
    } else if name.starts_with("governor") || name.starts_with("ratelimit") {
        "2,3"
    } else {
        "none"
    };
    (COLOURS[k % COLOURS.len()], dash)
}

/// `text` with XML's special characters escaped (subject names hold `<` and `>`).
fn xml(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Total throughput by threads, one small panel per family (each with its own scale), axes
/// labelled, a legend per panel.
fn svg(threads: &[usize], rows: &[(usize, Vec<Series>)]) -> String {
    let (pw, ph) = (450.0, 340.0);
    let (left, right, top, bottom) = (58.0, 20.0, 34.0, 112.0);
    let (w, h) = (2.0 * pw, 2.0 * ph + 36.0);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    let _ = writeln!(
        s,
        "<text x=\"12\" y=\"22\" font-size=\"15\">Total throughput on one limiter, by threads (median Mops/s; solid: ours, dashed: mutex, dotted: other crates)</text>"
    );
    for (p, (title, names)) in PANELS.iter().enumerate() {
        let (ox, oy) = ((p % 2) as f64 * pw, 36.0 + (p / 2) as f64 * ph);
        let series: Vec<(&str, Vec<f64>)> = names
            .iter()
            .filter(|n| rows.iter().all(|(_, v)| v.iter().any(|s| s.name == **n)))
            .map(|n| {
                (
                    *n,
                    rows.iter()
                        .map(|(_, v)| median(&find(v, n).samples))
                        .collect(),
                )
            })
            .collect();
        let max = series
            .iter()
            .flat_map(|(_, v)| v.iter().copied())
            .fold(1.0, f64::max)
            * 1.15;
        let (x0, x1, y0, y1) = (ox + left, ox + pw - right, oy + top, oy + ph - bottom);
        let x = |i: usize| x0 + (x1 - x0) * i as f64 / (threads.len().max(2) - 1) as f64;
        let y = |v: f64| y1 - (y1 - y0) * v / max;
        let _ = writeln!(
            s,
            "<text x=\"{x0}\" y=\"{}\" font-size=\"13\" font-weight=\"bold\">{}</text>",
            oy + 20.0,
            xml(title)
        );
        for k in 0..=4 {
            let v = max * f64::from(k) / 4.0;
            let _ = writeln!(
                s,
                "<line x1=\"{x0}\" y1=\"{0:.1}\" x2=\"{x1}\" y2=\"{0:.1}\" stroke=\"#e4e4e4\"/>\n<text x=\"{1}\" y=\"{2:.1}\" text-anchor=\"end\">{v:.0}</text>",
                y(v),
                x0 - 5.0,
                y(v) + 4.0
            );
        }
        let _ = writeln!(
            s,
            "<line x1=\"{x0}\" y1=\"{y1}\" x2=\"{x1}\" y2=\"{y1}\" stroke=\"black\"/>\n<line x1=\"{x0}\" y1=\"{y0}\" x2=\"{x0}\" y2=\"{y1}\" stroke=\"black\"/>"
        );
        for (i, t) in threads.iter().enumerate() {
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{t}</text>",
                x(i),
                y1 + 14.0
            );
        }
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">threads</text>\n<text transform=\"translate({},{}) rotate(-90)\" text-anchor=\"middle\">Mops/s</text>",
            (x0 + x1) / 2.0,
            y1 + 30.0,
            ox + 14.0,
            (y0 + y1) / 2.0
        );
        for (k, (name, values)) in series.iter().enumerate() {
            let (colour, dash) = line_style(name, k);
            let pts: Vec<String> = values
                .iter()
                .enumerate()
                .map(|(i, v)| format!("{:.1},{:.1}", x(i), y(*v)))
                .collect();
            let _ = writeln!(
                s,
                "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" stroke-dasharray=\"{dash}\" points=\"{}\"/>",
                pts.join(" ")
            );
            // The legend sits under the panel's axis, one line per series.
            let ly = y1 + 46.0 + 14.0 * k as f64;
            let _ = writeln!(
                s,
                "<line x1=\"{0}\" y1=\"{1:.1}\" x2=\"{2}\" y2=\"{1:.1}\" stroke=\"{colour}\" stroke-width=\"2\" stroke-dasharray=\"{dash}\"/>\n<text x=\"{3}\" y=\"{4:.1}\">{5}</text>",
                x0,
                ly,
                x0 + 22.0,
                x0 + 28.0,
                ly + 4.0,
                xml(name)
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

fn main() {
    let o = options();
    let started = Instant::now();
    let (reps, sample) = if o.quick {
        (5, Duration::from_millis(4))
    } else {
        (9, Duration::from_millis(12))
    };
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());

    let floor = single(&floors(), reps, sample);
    let bucket_floor = single(&bucket_floor_subjects(), reps, sample);
    let allow = single(&allow_subjects(), reps, sample);
    let deny = single(&deny_subjects(false), reps, sample);
    let deny_retry = single(&deny_subjects(true), reps, sample);
    let throttle = single(&throttle_subjects(), reps, sample);

    let threads: Vec<usize> = std::iter::successors(Some(1), |t| Some(t * 2))
        .take_while(|&t| t <= 2 * cores)
        .collect();
    let contended_subjects = allow_subjects();
    let contended_rows: Vec<(usize, Vec<Series>)> = threads
        .iter()
        .map(|&t| {
            (
                t,
                contended(&contended_subjects, t, reps.min(7), sample * 3),
            )
        })
        .collect();

    // The floor and the targets (ratios of the medians printed).
    let gcra = find(&allow, "Gcra");
    let quanta_now = find(&floor, "quanta Clock::now");
    let mut targets = vec![
        target(
            "Gcra allow / quanta Clock::now",
            ratio(gcra, quanta_now),
            Some(1.05),
            None,
        ),
        target(
            "MutexTokenBucket (std) / Gcra allow, same clock",
            ratio(find(&allow, "MutexTokenBucket (std)"), gcra),
            None,
            Some(4.5),
        ),
        target(
            "MutexTokenBucket (std, Instant) / Gcra allow, the textbook on std time",
            ratio(find(&allow, "MutexTokenBucket (std, Instant)"), gcra),
            None,
            Some(4.5),
        ),
        target(
            "Gcra allow / governor check",
            ratio(gcra, find(&allow, "governor check")),
            Some(1.05),
            None,
        ),
        target(
            "Gcra + CoarseClock deny / governor deny",
            ratio(
                find(&deny, "Gcra + CoarseClock"),
                find(&deny, "governor check"),
            ),
            Some(0.5),
            None,
        ),
        target(
            "Gcra deny + retry-after / governor deny + wait_time_from",
            ratio(
                find(&deny_retry, "Gcra"),
                find(&deny_retry, "governor check + wait_time_from"),
            ),
            Some(0.6),
            None,
        ),
        // In this loop the plain limiter's check is inlined and its parameters can stay in
        // registers across checks; a reconfigurable limiter's can change between two checks, so
        // it reloads them through its cell each time. `reconfigure_cost` calls both through a
        // pointer, as a server's handler does, and reads the cost of the reload alone.
        target(
            "Reconfigurable<Gcra> allow / Gcra allow",
            ratio(find(&allow, "Reconfigurable<Gcra>"), gcra),
            Some(1.15),
            None,
        ),
        target(
            "Reconfigurable<Gcra> deny / Gcra deny",
            ratio(find(&deny, "Reconfigurable<Gcra>"), find(&deny, "Gcra")),
            Some(1.2),
            None,
        ),
        // Performance round two: the token bucket as fast as GCRA.
        target(
            "TokenBucket allow / Gcra allow",
            ratio(find(&allow, "TokenBucket"), gcra),
            Some(1.10),
            None,
        ),
        // What the row above cannot go below: GCRA, a bucket with nothing but its refill, and
        // the token bucket, back to back.
        target(
            "bare packed bucket / Gcra allow (the floor of the row above: no exactness at all)",
            ratio(
                find(&bucket_floor, "a bare packed bucket"),
                find(&bucket_floor, "Gcra"),
            ),
            None,
            None,
        ),
        target(
            "TokenBucket allow / bare packed bucket (what exactness costs)",
            ratio(
                find(&bucket_floor, "TokenBucket"),
                find(&bucket_floor, "a bare packed bucket"),
            ),
            Some(1.25),
            None,
        ),
        target(
            "TokenBucket deny / Gcra deny",
            ratio(find(&deny, "TokenBucket"), find(&deny, "Gcra")),
            Some(1.15),
            None,
        ),
        target(
            "TokenBucket deny / Gcra deny, 100/s (the bucket refilling)",
            ratio(
                find(&deny, "TokenBucket, 100/s"),
                find(&deny, "Gcra, 100/s"),
            ),
            Some(1.15),
            None,
        ),
        // A bucket's wait is a division of the missing units by the rate, on top of GCRA's
        // subtraction (the targets of the last round, 1.3 and 0.6, lay below that floor).
        target(
            "TokenBucket deny + retry-after / Gcra deny + retry-after",
            ratio(find(&deny_retry, "TokenBucket"), find(&deny_retry, "Gcra")),
            Some(2.5),
            None,
        ),
        target(
            "TokenBucket deny + retry-after / governor deny + wait_time_from",
            ratio(
                find(&deny_retry, "TokenBucket"),
                find(&deny_retry, "governor check + wait_time_from"),
            ),
            Some(1.4),
            None,
        ),
        target(
            "TokenBucket + CoarseClock deny / Gcra + CoarseClock deny",
            ratio(
                find(&deny, "TokenBucket + CoarseClock"),
                find(&deny, "Gcra + CoarseClock"),
            ),
            Some(1.5),
            None,
        ),
        target(
            "TokenBucket + CoarseClock deny / Gcra + CoarseClock deny, 100/s (ticks shorter than the clock's lag)",
            ratio(
                find(&deny, "TokenBucket + CoarseClock, 100/s"),
                find(&deny, "Gcra + CoarseClock, 100/s"),
            ),
            Some(1.5),
            None,
        ),
        // The row above (1.05) cannot go below what the clock read alone costs against
        // governor's whole check (each check reads the clock once); on a coarse clock, one load,
        // the checks' own work shows.
        target(
            "Gcra + CoarseClock allow / governor check + coarse clock",
            ratio(
                find(&allow, "Gcra + CoarseClock"),
                find(&allow, "governor check + coarse clock"),
            ),
            Some(0.85),
            None,
        ),
        target(
            "QuantaClock::now alone / governor check (the floor of Gcra allow / governor check)",
            ratio(
                find(&floor, "QuantaClock::now"),
                find(&allow, "governor check"),
            ),
            None,
            None,
        ),
    ];
    // Keyed: one key and 100 000 keys on one thread, and 2 threads on distinct keys.
    let mut keyed_rows = vec![];
    for keys in [1u64, 100_000] {
        let subjects = keyed_subjects(keys);
        for s in &subjects {
            s.run_keys_warm(keys, 0);
        }
        // Each timed run after one untimed pass over its keys: the subjects' tables together
        // outgrow the caches, so without it each would start as cold as the subjects before it
        // left the caches, not as its own traffic keeps it.
        let one = single_warmed(&subjects, reps, sample, keys);
        for s in &subjects {
            s.run_keys_warm(keys, 1);
        }
        let two = contended_warmed(&subjects, 2, reps.min(7), sample * 3, keys);
        // On the default clocks, then both on a coarse clock (quanta's "recent" time, one load).
        // Each store, and the target on the faster of the two.
        for (ours, free, pinned, gov, clocks) in [
            (
                "Keyed<u64, Gcra>",
                "Keyed<u64, Gcra>, lock-free store",
                "Keyed<u64, Gcra>, pinned handle",
                "governor keyed check_key",
                "",
            ),
            (
                "Keyed<u64, Gcra> + CoarseClock",
                "Keyed<u64, Gcra> + CoarseClock, lock-free store",
                "Keyed<u64, Gcra> + CoarseClock, pinned handle",
                "governor keyed check_key + coarse clock",
                ", both coarse clocks",
            ),
        ] {
            // The default store, as a user gets it: at most 0.6 of governor's time at one key
            // and 0.5 at 100 000 (on the default clocks); twice its throughput with two threads
            // on distinct keys, on the fastest way of checking.
            if clocks.is_empty() {
                let most = if keys == 1 { 0.6 } else { 0.5 };
                targets.push(target(
                    &format!(
                        "Keyed (default store) / governor keyed, {keys} key(s), time per check"
                    ),
                    ratio(find(&one, ours), find(&one, gov)),
                    Some(most),
                    None,
                ));
                // What the row above stands on, in one loop over the same keys, against
                // governor's check: the least an atomic check does on the default store (the
                // clock read, the lookup of the key's word and one CAS on it under the shard's
                // read lock), and the same without the CAS.
                for (parts, what) in [
                    ("clock read + dashmap get + CAS", "its floor"),
                    ("clock read + dashmap get", "  the same without the CAS"),
                ] {
                    targets.push(target(
                        &format!("  {what}: {parts} / governor keyed, {keys} key(s)"),
                        ratio(find(&one, &format!("floor: {parts}")), find(&one, gov)),
                        None,
                        None,
                    ));
                }
            }
            let ways = [
                ("default: dashmap", ours),
                ("lock-free", free),
                ("lock-free, pinned handle", pinned),
            ];
            // The fastest: the lowest ratio of times, the highest of throughputs.
            type Measure<'a> = (&'a [Series], &'a str, fn(f64, f64) -> f64);
            let measures: [(Measure, Option<f64>, Option<f64>); 2] = [
                ((&one, "time per check", f64::min), None, None),
                (
                    (&two, "2 threads on distinct keys (throughput)", f64::max),
                    None,
                    Some(2.0),
                ),
            ];
            for ((series, what, fastest), at_most, at_least) in measures {
                let mut best: Option<f64> = None;
                for (store, name) in ways {
                    let r = ratio(find(series, name), find(series, gov));
                    best = Some(best.map_or(r, |b| fastest(b, r)));
                    targets.push(target(
                        &format!("Keyed ({store}) / governor keyed, {keys} key(s), {what}{clocks}"),
                        r,
                        None,
                        None,
                    ));
                }
                targets.push(target(
                    &format!("  the fastest of these, {keys} key(s), {what}{clocks}"),
                    best.expect("every way is measured"),
                    at_most,
                    at_least,
                ));
            }
        }
        keyed_rows.push((keys, one, two));
    }
    // The sharded limiter at 2 threads: its development targets.
    if let Some((_, v)) = contended_rows.iter().find(|(t, _)| *t == 2) {
        // On the default clocks, then every limiter on a coarse clock: the shards then cost
        // little more than their CAS, while one shared word's cost is its cache line moving
        // between cores.
        for (ours, gov, mutex, clocks) in [
            (
                "Sharded<Gcra>",
                "governor check",
                "MutexTokenBucket (std)",
                "",
            ),
            (
                "Sharded<Gcra> + CoarseClock",
                "governor check + coarse clock",
                "MutexTokenBucket (std) + CoarseClock",
                ", both coarse clocks",
            ),
        ] {
            let s = find(v, ours);
            targets.push(target(
                &format!("Sharded<Gcra> / governor check, 2 threads (throughput){clocks}"),
                ratio(s, find(v, gov)),
                None,
                Some(4.0),
            ));
            targets.push(target(
                &format!("Sharded<Gcra> / MutexTokenBucket (std), 2 threads (throughput){clocks}"),
                ratio(s, find(v, mutex)),
                None,
                Some(15.0),
            ));
        }
    }
    let contended_ratios: Vec<(usize, f64, f64)> = contended_rows
        .iter()
        .map(|(t, v)| {
            let g = find(v, "Gcra");
            (
                *t,
                ratio(g, find(v, "MutexTokenBucket (std)")),
                ratio(g, find(v, "governor check")),
            )
        })
        .collect();

    let accuracy = if o.quick {
        vec![
            admitted_vs_ideal(1, 1, 1_500, 5_000_000_000),
            admitted_vs_ideal(7_000_000, 10, 10, 20_000_000),
        ]
    } else {
        vec![
            admitted_vs_ideal(1, 1, 1_500, 20_000_000_000),
            admitted_vs_ideal(3_000_000, 10, 10, 100_000_000),
            admitted_vs_ideal(7_000_000, 10, 10, 100_000_000),
        ]
    };
    let honesty = retry_honesty(if o.quick { 2_000 } else { 20_000 });
    let skew = skewed_sharded();

    if let Some(path) = &o.svg {
        std::fs::write(path, svg(&threads, &contended_rows)).expect("write the SVG");
    }

    if o.json {
        let mut s = String::from("{");
        let _ = write!(s, "\"cores\":{cores},\"repetitions\":{reps},");
        let _ = write!(
            s,
            "\"floor_ns\":{},\"allow_ns\":{},\"bucket_floor_ns\":{},",
            json_series(&floor),
            json_series(&allow),
            json_series(&bucket_floor)
        );
        let _ = write!(
            s,
            "\"deny_ns\":{},\"deny_retry_ns\":{},",
            json_series(&deny),
            json_series(&deny_retry)
        );
        let c: Vec<String> = contended_rows
            .iter()
            .map(|(t, v)| format!("{{\"threads\":{t},\"mops\":{}}}", json_series(v)))
            .collect();
        let _ = write!(s, "\"contended\":[{}],", c.join(","));
        let t: Vec<String> = targets
            .iter()
            .map(|t| {
                format!(
                    "{{\"what\":\"{}\",\"ratio\":{:.3},\"goal\":\"{}\",\"met\":{}}}",
                    t.what, t.ratio, t.goal, t.met
                )
            })
            .collect();
        let _ = write!(s, "\"targets\":[{}],", t.join(","));
        let a: Vec<String> = accuracy
            .iter()
            .map(|a| {
                let per: Vec<String> = a
                    .admitted
                    .iter()
                    .map(|(n, k)| format!("\"{n}\":{k}"))
                    .collect();
                format!(
                    "{{\"scenario\":\"{}\",\"ideal\":{},\"admitted\":{{{}}}}}",
                    a.scenario,
                    a.ideal,
                    per.join(",")
                )
            })
            .collect();
        let _ = write!(s, "\"accuracy\":[{}],", a.join(","));
        let _ = write!(
            s,
            "\"sharded_skew\":{{\"shards\":{},\"admitted\":{},\"exact\":{}}},",
            skew.0, skew.1, skew.2
        );
        let h: Vec<String> = honesty
            .iter()
            .map(|(n, r, t)| format!("{{\"name\":\"{n}\",\"refused_again\":{r},\"trials\":{t}}}"))
            .collect();
        let _ = write!(s, "\"retry_after_refused_again\":[{}]}}", h.join(","));
        println!("{s}");
        return;
    }

    println!("atomic-limiter compare: {cores} cores, {reps} interleaved repetitions per figure");
    print!(
        "{}",
        verdict(
            cores,
            reps,
            &floor,
            &allow,
            &deny,
            &deny_retry,
            &contended_rows,
            &keyed_rows,
            &accuracy,
            &honesty,
        )
    );
    println!("\nThe measurements behind it:");
    print!(
        "{}",
        table("Floor: what a check is made of", "ns/op", &floor)
    );
    print!(
        "{}",
        table(
            "Allow path, one thread (nothing denied)",
            "ns/check",
            &allow
        )
    );
    print!(
        "{}",
        table(
            "What a token bucket costs, one thread, back to back\n  (a bare packed bucket: tokens and a \
             stamp in one word, refilled by one multiply, nothing exact; not a limiter)",
            "ns/check",
            &bucket_floor
        )
    );
    print!("{}", table("Deny path, one thread", "ns/check", &deny));
    print!(
        "{}",
        table(
            "Deny path, one thread, caller reads the retry-after",
            "ns/check",
            &deny_retry
        )
    );
    print!(
        "{}",
        table(
            "Throttle, one thread: reserve the next slot",
            "ns/reservation",
            &throttle
        )
    );
    for (t, v) in &contended_rows {
        print!(
            "{}",
            table(
                &if *t > cores {
                    format!(
                        "{t} thread(s) on one limiter: total throughput \
                         (more threads than the {cores} cores: they take turns)"
                    )
                } else {
                    format!("{t} thread(s) on one limiter: total throughput")
                },
                "Mops/s",
                v
            )
        );
    }
    for (keys, one, two) in &keyed_rows {
        print!(
            "{}",
            table(
                &format!("Keyed, {keys} key(s) present, one thread"),
                "ns/check",
                one
            )
        );
        print!(
            "{}",
            table(
                &format!("Keyed, {keys} key(s) present, 2 threads on distinct keys"),
                "Mops/s",
                two
            )
        );
    }
    if !o.targets {
        println!("\n(The development targets and every ratio: `-- --targets`.)");
    } else {
        print_targets(&targets, &contended_ratios);
    }

    println!("\nAccuracy on simulated clocks: admitted against the exact quota on the same polls");
    for a in &accuracy {
        println!("  {}: exact {}", a.scenario, a.ideal);
        for (n, k) in &a.admitted {
            let diff = (*k as f64 / a.ideal as f64 - 1.0) * 100.0;
            println!("    {n:<18} {k:>12}  {diff:+.3}%");
        }
    }
    let (shards, got, exact) = skew;
    println!(
        "  Sharded<Gcra>, {shards} shards, all load from one thread, 1000/s burst 100, polled every 100 us for 2 s: {got} of exact {exact} ({:+.2}%)",
        (got as f64 / exact as f64 - 1.0) * 100.0
    );
    println!("\nRetry-after honesty: waiting exactly the advertised time, share refused again");
    for (n, r, t) in &honesty {
        println!(
            "    {n:<18} {r:>6} of {t:<6} {:.2}%",
            100.0 * f64::from(*r) / f64::from((*t).max(1))
        );
    }
    println!("\n(done in {:.1} s)", started.elapsed().as_secs_f64());
}
