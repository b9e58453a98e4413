//! Side by side on this machine: what a lock-free check costs next to a mutex and next to governor
//! and ratelimit, and how accurate each is. Runs in about a minute on 2 cores (`--quick`: 20 s).
//!
//! `cargo run --release --example compare [-- --json] [-- --svg docs/throughput.svg] [-- --quick]
//! [-- --targets]`
//!
//! It opens with a verdict in plain words, then the tables behind it. `--targets` adds the
//! development targets (ratios the issues set, met or missed), each under the floor or ceiling
//! that bounds it where there is one.
//!
//! Method: every measurement is repeated, the repetitions of all subjects interleaved (subject A,
//! B, C, then A, B, C again ...) so that drift in the machine hits all of them alike; the table shows
//! the median and the spread (min to max). A ratio is one median over the other, so it is the
//! quotient of the two figures printed.

#[path = "../../benches/common/stats.rs"]
mod stats;
#[path = "../../benches/subjects.rs"]
mod subjects;

mod measure;
mod report;
mod sims;
mod svg;
mod targets;

use measure::{Series, contended, contended_warmed, single, single_warmed};
use report::{json_series, print_targets, table, verdict};
use sims::{admitted_vs_ideal, retry_honesty, skewed_sharded};
use std::fmt::Write as _;
use std::time::{Duration, Instant};
use subjects::keyed::keyed_past_cache_subjects;
use subjects::{
    allow_subjects, bucket_floor_subjects, deny_subjects, floors, keyed_subjects, throttle_subjects,
};

/// Keys present in the keyed run past the cache: the default store's table then takes 256 MB
/// and governor's about 160 MB, several times the last-level cache of most servers' CPUs (32 MB
/// on the 2-core machines of docs/benchmarks.md), so that a check waits on memory.
const PAST_CACHE_KEYS: u64 = 4_000_000;

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
        keyed_rows.push((keys, one, two));
    }
    // Keyed over so many keys that every table outgrows the cache: one thread, and no untimed
    // pass before each run (it would take seconds, and leave nothing of the tables cached).
    // Its tables are dropped once it is measured.
    let past_keys = PAST_CACHE_KEYS;
    let past_cache = {
        let subjects = keyed_past_cache_subjects(past_keys);
        for s in &subjects {
            s.run_keys_warm(past_keys, 0);
        }
        single(&subjects, reps, sample)
    };
    let targets = targets::all(&targets::Figures {
        floor: &floor,
        bucket_floor: &bucket_floor,
        allow: &allow,
        deny: &deny,
        deny_retry: &deny_retry,
        contended: &contended_rows,
        keyed: &keyed_rows,
        past_cache: (past_keys, &past_cache),
    });
    let contended_ratios = targets::contended_ratios(&contended_rows);

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
        std::fs::write(path, svg::svg(&threads, &contended_rows)).expect("write the SVG");
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
                // A floor or ceiling, where the target has one: its ratio, and whether the goal
                // lies past it.
                let past = t.goal_past_bound().unwrap_or(false);
                let bound = t.bound.as_ref().map_or(String::new(), |b| {
                    format!(
                        ",\"bound\":{{\"what\":\"{}\",\"ratio\":{:.3},\"goal_past_it\":{}}}",
                        b.what.trim_start(),
                        b.ratio,
                        past
                    )
                });
                // For a ratio of times: each median over its fastest repetition, and whether
                // that reads as a stall of the host.
                let steadiness = t.steadiness.as_ref().map_or(String::new(), |st| {
                    format!(
                        ",\"steadiness\":{{\"median_over_fastest\":[{:.3},{:.3}],\
                         \"fastest_ratio\":{:.3},\"stalled\":{}}}",
                        st.num,
                        st.den,
                        st.fastest,
                        st.stalled()
                    )
                });
                // For a ratio over Gcra's admission: Gcra's over its floor, timed beside it.
                let gcra_over_floor = t.gcra_over_floor.map_or(String::new(), |r| {
                    format!(
                        ",\"gcra_over_floor\":{{\"ratio\":{r:.3},\"slow_core\":{}}}",
                        t.core_slow()
                    )
                });
                format!(
                    "{{\"what\":\"{}\",\"ratio\":{:.3},\"goal\":\"{}\",\"met\":{}{bound}{steadiness}{gcra_over_floor}}}",
                    t.what,
                    t.ratio,
                    t.goal(),
                    t.met()
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
            (past_keys, &past_cache),
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
    print!(
        "{}",
        table(
            &format!(
                "Keyed, {past_keys} key(s) present, one thread: every table outgrows the cache"
            ),
            "ns/check",
            &past_cache
        )
    );
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
