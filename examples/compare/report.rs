//! The text the run prints: the verdict in plain words, the tables behind it, the development
//! targets, and the JSON form.

use crate::measure::{STALLED, Series, Steadiness, find, ratio, spread};
use crate::sims::Accuracy;
use crate::stats::median;
use crate::targets::{Limit, SLOW_CORE, Target};
use std::fmt::Write as _;

/// One table: each series' median and spread, under `title`.
pub(crate) fn table(title: &str, unit: &str, rows: &[Series]) -> String {
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

/// `n` with its thousands set apart: 100 000.
pub(crate) fn grouped(n: u64) -> String {
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
pub(crate) fn times(x: f64) -> String {
    format!("{x:.2}x")
}

/// The verdict: ours against the others, per path, in plain words.
#[allow(clippy::too_many_arguments)]
pub(crate) fn verdict(
    cores: usize,
    reps: usize,
    floor: &[Series],
    allow: &[Series],
    deny: &[Series],
    deny_retry: &[Series],
    contended_rows: &[(usize, Vec<Series>)],
    keyed_rows: &[(u64, Vec<Series>, Vec<Series>)],
    past_cache: (u64, &[Series]),
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
    let past_row = (past_cache.0, past_cache.1, ", past the cache");
    let keyed_all = keyed_rows
        .iter()
        .map(|(keys, one, _)| (*keys, one.as_slice(), ""));
    for (keys, one, where_) in keyed_all.chain([past_row]) {
        rows.push(per_check(
            &format!("keyed, {keys} key(s){where_}"),
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
    let keyed_share =
        |v: &[Series]| med(v, "Keyed<u64, Gcra>") / med(v, "governor keyed check_key");
    if let Some((keys, one, _)) = keyed_rows.last() {
        parts.push(format!(
            "a keyed check on the default store over {} keys takes {:.2} of governor's time \
             ({:.2} over {} keys, where both tables outgrow the cache)",
            grouped(*keys),
            keyed_share(one),
            keyed_share(past_cache.1),
            grouped(past_cache.0)
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

/// The series as a JSON array of medians and spreads.
pub(crate) fn json_series(rows: &[Series]) -> String {
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

/// The development targets (ratios the issues set), met or missed, each floor or ceiling under
/// its target, and the contended ratios.
pub(crate) fn print_targets(targets: &[Target], contended_ratios: &[(usize, f64, f64)]) {
    println!("\nDevelopment targets (ratios of the medians printed)");
    let w = targets
        .iter()
        .flat_map(|t| std::iter::once(&t.what).chain(t.bound.as_ref().map(|b| &b.what)))
        .map(String::len)
        .max()
        .unwrap_or(0);
    for t in targets {
        let verdict = match t.limit {
            None => String::new(),
            Some(_) if t.met() => format!("met ({})", t.goal()),
            Some(_) => format!("missed ({})", t.goal()),
        };
        println!("  {:<w$} {:>7}x  {verdict}", t.what, t.shown());
        if let (Some(b), Some(limit), Some(past)) = (&t.bound, t.limit, t.goal_past_bound()) {
            let note = match (past, limit) {
                (true, Limit::AtMost(_)) => "the target lies below this floor".to_string(),
                (true, Limit::AtLeast(_)) => "the target lies above this ceiling".to_string(),
                (false, Limit::AtMost(m)) => {
                    format!("{:.2}x of room under the target", m - b.ratio)
                }
                (false, Limit::AtLeast(m)) => {
                    format!("{:.2}x of room over the target", b.ratio - m)
                }
            };
            println!("  {:<w$} {:>7.2}x  {note}", b.what, b.ratio);
        }
        if let Some(st) = t.steadiness.as_ref().filter(|st| st.stalled() && !t.met()) {
            println!(
                "      the host stalled: the medians lie {:.0} % and {:.0} % above their fastest \
                 repetitions, whose ratio is {:.2}x",
                (st.num - 1.0) * 100.0,
                (st.den - 1.0) * 100.0,
                st.fastest
            );
        }
        if let Some(r) = t.gcra_over_floor.filter(|_| t.core_slow() && !t.met()) {
            println!(
                "      Gcra itself took {r:.2}x its floor (a clock read and a CAS, timed beside \
                 it): the host ran the work\n      a check overlaps with its clock read slower, \
                 and this check does more of it"
            );
        }
    }
    for (t, m, g) in contended_ratios {
        println!(
            "  {t} thread(s): Gcra / MutexTokenBucket (std) {m:>6.2}x   Gcra / governor {g:>6.2}x  (throughput)"
        );
    }
    let goals: Vec<&Target> = targets.iter().filter(|t| t.limit.is_some()).collect();
    let missed: Vec<&&Target> = goals.iter().filter(|t| !t.met()).collect();
    let past = missed
        .iter()
        .filter(|t| t.goal_past_bound() == Some(true))
        .count();
    let stalled = missed
        .iter()
        .filter(|t| t.steadiness.as_ref().is_some_and(Steadiness::stalled))
        .count();
    let slow_core = missed.iter().filter(|t| t.core_slow()).count();
    let missed = missed.len();
    println!(
        "\n  {} of {} targets met. A floor (under an \"at most\" target) or a ceiling (over an \
         \"at least\" one)\n  is the same ratio for what any check of that kind is made of, \
         with nothing decided, in this\n  run: its fastest repetition (the end of its spread) \
         over the other side's median.",
        goals.len() - missed,
        goals.len()
    );
    if missed > 0 {
        println!(
            "  Of the {missed} missed, {past} lie past their floor or ceiling: on this machine no \
             check of that kind meets\n  them. docs/benchmarks.md (\"The development targets\") \
             gives their figures over several runs, and\n  what holds up the others."
        );
    }
    if stalled > 0 {
        let were = if stalled == 1 { "was" } else { "were" };
        println!(
            "  {stalled} of the missed {were} timed while the host stalled (a median more than \
             {:.0} % above its fastest\n  repetition, where a slower check would slow them \
             all): run again on a quiet host.",
            (STALLED - 1.0) * 100.0
        );
    }
    if slow_core > 0 {
        let were = if slow_core == 1 { "was" } else { "were" };
        println!(
            "  {slow_core} of the missed {were} timed while Gcra itself ran more than {:.0} % \
             above its floor: a host\n  slower at the work a check overlaps with its clock \
             read. Run again on a quiet host.",
            (SLOW_CORE - 1.0) * 100.0
        );
    }
}
