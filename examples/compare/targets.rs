//! The development targets: ratios the issues set, each printed met or missed.

use crate::measure::{Series, find, ratio};

/// One ratio of the run against its goal (none for a ratio printed for reference).
pub(crate) struct Target {
    pub(crate) what: String,
    pub(crate) ratio: f64,
    pub(crate) goal: String,
    pub(crate) met: bool,
}

/// `ratio` against at most `at_most` or at least `at_least`.
pub(crate) fn target(
    what: &str,
    ratio: f64,
    at_most: Option<f64>,
    at_least: Option<f64>,
) -> Target {
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

/// The development targets (ratios the issues set), met or missed, and the contended ratios.
pub(crate) fn print_targets(targets: &[Target], contended_ratios: &[(usize, f64, f64)]) {
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

/// The figures the targets are ratios of, as `main` measured them.
pub(crate) struct Figures<'a> {
    pub(crate) floor: &'a [Series],
    pub(crate) bucket_floor: &'a [Series],
    pub(crate) allow: &'a [Series],
    pub(crate) deny: &'a [Series],
    pub(crate) deny_retry: &'a [Series],
    /// Threads, and the throughput of each limiter shared by that many.
    pub(crate) contended: &'a [(usize, Vec<Series>)],
    /// Keys present, time per check on one thread, throughput on two on distinct keys.
    pub(crate) keyed: &'a [(u64, Vec<Series>, Vec<Series>)],
}

/// Every target, in the order printed.
pub(crate) fn all(f: &Figures) -> Vec<Target> {
    let (floor, bucket_floor, allow, deny, deny_retry) =
        (f.floor, f.bucket_floor, f.allow, f.deny, f.deny_retry);
    let gcra = find(allow, "Gcra");
    let quanta_now = find(floor, "quanta Clock::now");
    let mut targets = vec![
        target(
            "Gcra allow / quanta Clock::now",
            ratio(gcra, quanta_now),
            Some(1.05),
            None,
        ),
        target(
            "MutexTokenBucket (std) / Gcra allow, same clock",
            ratio(find(allow, "MutexTokenBucket (std)"), gcra),
            None,
            Some(4.5),
        ),
        target(
            "MutexTokenBucket (std, Instant) / Gcra allow, the textbook on std time",
            ratio(find(allow, "MutexTokenBucket (std, Instant)"), gcra),
            None,
            Some(4.5),
        ),
        target(
            "Gcra allow / governor check",
            ratio(gcra, find(allow, "governor check")),
            Some(1.05),
            None,
        ),
        target(
            "Gcra + CoarseClock deny / governor deny",
            ratio(
                find(deny, "Gcra + CoarseClock"),
                find(deny, "governor check"),
            ),
            Some(0.5),
            None,
        ),
        target(
            "Gcra deny + retry-after / governor deny + wait_time_from",
            ratio(
                find(deny_retry, "Gcra"),
                find(deny_retry, "governor check + wait_time_from"),
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
            ratio(find(allow, "Reconfigurable<Gcra>"), gcra),
            Some(1.15),
            None,
        ),
        target(
            "Reconfigurable<Gcra> deny / Gcra deny",
            ratio(find(deny, "Reconfigurable<Gcra>"), find(deny, "Gcra")),
            Some(1.2),
            None,
        ),
        // Performance round two: the token bucket as fast as GCRA.
        target(
            "TokenBucket allow / Gcra allow",
            ratio(find(allow, "TokenBucket"), gcra),
            Some(1.10),
            None,
        ),
        // What the row above cannot go below: GCRA, a bucket with nothing but its refill, and
        // the token bucket, back to back.
        target(
            "bare packed bucket / Gcra allow (the floor of the row above: no exactness at all)",
            ratio(
                find(bucket_floor, "a bare packed bucket"),
                find(bucket_floor, "Gcra"),
            ),
            None,
            None,
        ),
        target(
            "TokenBucket allow / bare packed bucket (what exactness costs)",
            ratio(
                find(bucket_floor, "TokenBucket"),
                find(bucket_floor, "a bare packed bucket"),
            ),
            Some(1.25),
            None,
        ),
        target(
            "TokenBucket deny / Gcra deny",
            ratio(find(deny, "TokenBucket"), find(deny, "Gcra")),
            Some(1.15),
            None,
        ),
        target(
            "TokenBucket deny / Gcra deny, 100/s (the bucket refilling)",
            ratio(find(deny, "TokenBucket, 100/s"), find(deny, "Gcra, 100/s")),
            Some(1.15),
            None,
        ),
        // A bucket's wait is a division of the missing units by the rate, on top of GCRA's
        // subtraction (the targets of the last round, 1.3 and 0.6, lay below that floor).
        target(
            "TokenBucket deny + retry-after / Gcra deny + retry-after",
            ratio(find(deny_retry, "TokenBucket"), find(deny_retry, "Gcra")),
            Some(2.5),
            None,
        ),
        target(
            "TokenBucket deny + retry-after / governor deny + wait_time_from",
            ratio(
                find(deny_retry, "TokenBucket"),
                find(deny_retry, "governor check + wait_time_from"),
            ),
            Some(1.4),
            None,
        ),
        target(
            "TokenBucket + CoarseClock deny / Gcra + CoarseClock deny",
            ratio(
                find(deny, "TokenBucket + CoarseClock"),
                find(deny, "Gcra + CoarseClock"),
            ),
            Some(1.5),
            None,
        ),
        target(
            "TokenBucket + CoarseClock deny / Gcra + CoarseClock deny, 100/s (ticks shorter than the clock's lag)",
            ratio(
                find(deny, "TokenBucket + CoarseClock, 100/s"),
                find(deny, "Gcra + CoarseClock, 100/s"),
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
                find(allow, "Gcra + CoarseClock"),
                find(allow, "governor check + coarse clock"),
            ),
            Some(0.85),
            None,
        ),
        target(
            "QuantaClock::now alone / governor check (the floor of Gcra allow / governor check)",
            ratio(
                find(floor, "QuantaClock::now"),
                find(allow, "governor check"),
            ),
            None,
            None,
        ),
    ];
    for (keys, one, two) in f.keyed {
        keyed(&mut targets, *keys, one, two);
    }
    // The sharded limiter at 2 threads: its development targets.
    if let Some((_, v)) = f.contended.iter().find(|(t, _)| *t == 2) {
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
    targets
}

/// The keyed targets at `keys` keys: time per check on one thread (`one`), throughput with two
/// threads on distinct keys (`two`).
fn keyed(targets: &mut Vec<Target>, keys: u64, one: &[Series], two: &[Series]) {
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
                &format!("Keyed (default store) / governor keyed, {keys} key(s), time per check"),
                ratio(find(one, ours), find(one, gov)),
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
                    ratio(find(one, &format!("floor: {parts}")), find(one, gov)),
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
            ((one, "time per check", f64::min), None, None),
            (
                (two, "2 threads on distinct keys (throughput)", f64::max),
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
}

/// Ours over the mutex bucket and over governor, with `threads` threads on one limiter: throughput.
pub(crate) fn contended_ratios(contended: &[(usize, Vec<Series>)]) -> Vec<(usize, f64, f64)> {
    contended
        .iter()
        .map(|(t, v)| {
            let g = find(v, "Gcra");
            (
                *t,
                ratio(g, find(v, "MutexTokenBucket (std)")),
                ratio(g, find(v, "governor check")),
            )
        })
        .collect()
}
