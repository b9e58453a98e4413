//! The development targets: ratios the issues set, each met or missed (`report` prints them).

use crate::measure::{Series, Steadiness, fastest, find, ratio, spread};
use crate::stats::median;

/// A ceiling's figure, in throughput: its fastest repetition.
fn most(s: &Series) -> f64 {
    spread(&s.samples).1
}

/// One ratio of the run against its goal (none for a ratio printed for reference).
pub(crate) struct Target {
    pub(crate) what: String,
    pub(crate) ratio: f64,
    pub(crate) limit: Option<Limit>,
    /// What the ratio cannot pass on this machine, measured in the same run.
    pub(crate) bound: Option<Bound>,
    /// For a ratio of two times: how far each median lies above its fastest repetition, and the
    /// fastest repetitions' ratio.
    pub(crate) steadiness: Option<Steadiness>,
    /// For a ratio over `Gcra`'s admission: `Gcra`'s median over its floor's (a clock read and a
    /// CAS on a word of its own), timed interleaved with it. Past [`SLOW_CORE`] the host ran the
    /// work that a check overlaps with its clock read slower, which a stall does not tell.
    pub(crate) gcra_over_floor: Option<f64>,
}

/// `Gcra`'s admission this far above its floor (5 %, its own target's room over the clock read)
/// is read as a host slower at the work a check overlaps with its clock read: the check that
/// does more of it then slows more, with every repetition steady.
pub(crate) const SLOW_CORE: f64 = 1.05;

/// A target's goal.
#[derive(Clone, Copy)]
pub(crate) enum Limit {
    AtMost(f64),
    AtLeast(f64),
}

/// A floor under a target's ratio (for an "at most" goal) or a ceiling over it ("at least"):
/// the same ratio for what any check of that kind is made of, with nothing decided, taken at
/// its fastest repetition.
pub(crate) struct Bound {
    pub(crate) what: String,
    pub(crate) ratio: f64,
}

/// `ratio` against at most `at_most` or at least `at_least`.
pub(crate) fn target(
    what: &str,
    ratio: f64,
    at_most: Option<f64>,
    at_least: Option<f64>,
) -> Target {
    Target {
        what: what.to_string(),
        ratio,
        limit: at_most.map(Limit::AtMost).or(at_least.map(Limit::AtLeast)),
        bound: None,
        steadiness: None,
        gcra_over_floor: None,
    }
}

/// `num`'s time over `den`'s, at most `at_most`, with how steady the host was for the two.
fn timed(what: &str, num: &Series, den: &Series, at_most: Option<f64>) -> Target {
    Target {
        steadiness: Some(Steadiness::of(num, den)),
        ..target(what, ratio(num, den), at_most, None)
    }
}

impl Target {
    /// The target with its floor or ceiling: `what`, whose ratio is `ratio`.
    fn bounded_by(mut self, what: &str, ratio: f64) -> Target {
        if let Some(limit) = self.limit {
            let kind = match limit {
                Limit::AtMost(_) => "its floor",
                Limit::AtLeast(_) => "its ceiling",
            };
            self.bound = Some(Bound {
                what: format!("  {kind}: {what}"),
                ratio,
            });
        }
        self
    }

    /// The goal as printed ("<= 0.5"), empty for a ratio printed for reference.
    pub(crate) fn goal(&self) -> String {
        match self.limit {
            Some(Limit::AtMost(m)) => format!("<= {m}"),
            Some(Limit::AtLeast(m)) => format!(">= {m}"),
            None => String::new(),
        }
    }

    /// Whether `ratio` would meet the goal (every ratio meets none).
    fn meets(&self, ratio: f64) -> bool {
        match self.limit {
            Some(Limit::AtMost(m)) => ratio <= m,
            Some(Limit::AtLeast(m)) => ratio >= m,
            None => true,
        }
    }

    /// Whether the ratio meets the goal (a ratio with none always does).
    pub(crate) fn met(&self) -> bool {
        self.meets(self.ratio)
    }

    /// The ratio as printed: to two decimals, or as many more as it takes (up to five) for a
    /// missed target not to read as its goal ("2.00x missed (>= 2)" is 1.996x).
    pub(crate) fn shown(&self) -> String {
        let met = self.met();
        (2..=5)
            .map(|p| format!("{:.p$}", self.ratio))
            .find(|s| met || !s.parse().is_ok_and(|r| self.meets(r)))
            .unwrap_or_else(|| format!("{:.5}", self.ratio))
    }

    /// Whether `Gcra` itself ran past [`SLOW_CORE`] over its floor (for a ratio over it).
    pub(crate) fn core_slow(&self) -> bool {
        self.gcra_over_floor.is_some_and(|r| r > SLOW_CORE)
    }

    /// Whether the goal lies past the bound (then no check of that kind meets it on this
    /// machine); `None` without a bound.
    pub(crate) fn goal_past_bound(&self) -> Option<bool> {
        let b = self.bound.as_ref()?;
        Some(match self.limit? {
            Limit::AtMost(m) => b.ratio > m,
            Limit::AtLeast(m) => b.ratio < m,
        })
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
    /// Keys present where every table outgrows the cache, and time per check on one thread.
    pub(crate) past_cache: (u64, &'a [Series]),
}

/// Every target, in the order printed.
pub(crate) fn all(f: &Figures) -> Vec<Target> {
    let (floor, bucket_floor, allow, deny, deny_retry) =
        (f.floor, f.bucket_floor, f.allow, f.deny, f.deny_retry);
    let gcra = find(allow, "Gcra");
    let quanta_now = find(floor, "quanta Clock::now");
    // A check reads the clock and changes its word: it takes no less than the two alone.
    let own_word = find(allow, "floor: clock read + CAS, own word");
    let mutex = find(allow, "MutexTokenBucket (std)");
    let mutex_instant = find(allow, "MutexTokenBucket (std, Instant)");
    // A check that does more than `Gcra`'s, over `Gcra`'s admission: a host slower at the work
    // a check overlaps with its clock read raises it, which `Gcra`'s figure over its floor tells.
    let over_gcra = |what: &str, num: &Series, at_most: f64| Target {
        gcra_over_floor: Some(ratio(gcra, own_word)),
        ..timed(what, num, gcra, Some(at_most))
    };
    let mut targets = vec![
        timed(
            "Gcra allow / quanta Clock::now",
            gcra,
            quanta_now,
            Some(1.05),
        )
        .bounded_by(
            "clock read + CAS, own word / quanta Clock::now",
            fastest(own_word) / median(&quanta_now.samples),
        ),
        target(
            "MutexTokenBucket (std) / Gcra allow, same clock",
            ratio(mutex, gcra),
            None,
            Some(4.5),
        )
        .bounded_by(
            "MutexTokenBucket (std) / clock read + CAS, own word",
            median(&mutex.samples) / fastest(own_word),
        ),
        target(
            "MutexTokenBucket (std, Instant) / Gcra allow, the textbook on std time",
            ratio(mutex_instant, gcra),
            None,
            Some(4.5),
        )
        .bounded_by(
            "MutexTokenBucket (std, Instant) / clock read + CAS, own word",
            median(&mutex_instant.samples) / fastest(own_word),
        ),
        timed(
            "Gcra allow / governor check",
            gcra,
            find(allow, "governor check"),
            Some(1.05),
        ),
        // A denial on a coarse reading is decided again on a precise one before it is answered.
        timed(
            "Gcra + CoarseClock deny / governor deny",
            find(deny, "Gcra + CoarseClock"),
            find(deny, "governor check"),
            Some(0.5),
        )
        .bounded_by(
            "the precise reading alone, QuantaClock::now / governor deny",
            fastest(find(floor, "QuantaClock::now"))
                / median(&find(deny, "governor check").samples),
        ),
        timed(
            "Gcra deny + retry-after / governor deny + wait_time_from",
            find(deny_retry, "Gcra"),
            find(deny_retry, "governor check + wait_time_from"),
            Some(0.6),
        ),
        // In this loop the plain limiter's check is inlined and its parameters can stay in
        // registers across checks; a reconfigurable limiter's can change between two checks, so
        // it reloads them through its cell each time. `reconfigure_cost` calls both through a
        // pointer, as a server's handler does, and reads the cost of the reload alone.
        over_gcra(
            "Reconfigurable<Gcra> allow / Gcra allow",
            find(allow, "Reconfigurable<Gcra>"),
            1.15,
        ),
        timed(
            "Reconfigurable<Gcra> deny / Gcra deny",
            find(deny, "Reconfigurable<Gcra>"),
            find(deny, "Gcra"),
            Some(1.2),
        ),
        // Performance round two: the token bucket as fast as GCRA.
        over_gcra(
            "TokenBucket allow / Gcra allow",
            find(allow, "TokenBucket"),
            1.10,
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
        timed(
            "TokenBucket allow / bare packed bucket (what exactness costs)",
            find(bucket_floor, "TokenBucket"),
            find(bucket_floor, "a bare packed bucket"),
            Some(1.25),
        ),
        timed(
            "TokenBucket deny / Gcra deny",
            find(deny, "TokenBucket"),
            find(deny, "Gcra"),
            Some(1.15),
        ),
        timed(
            "TokenBucket deny / Gcra deny, 100/s (the bucket refilling)",
            find(deny, "TokenBucket, 100/s"),
            find(deny, "Gcra, 100/s"),
            Some(1.15),
        ),
        // A bucket's wait is a division of the missing units by the rate, on top of GCRA's
        // subtraction (the targets of the last round, 1.3 and 0.6, lay below that floor).
        timed(
            "TokenBucket deny + retry-after / Gcra deny + retry-after",
            find(deny_retry, "TokenBucket"),
            find(deny_retry, "Gcra"),
            Some(2.5),
        ),
        timed(
            "TokenBucket deny + retry-after / governor deny + wait_time_from",
            find(deny_retry, "TokenBucket"),
            find(deny_retry, "governor check + wait_time_from"),
            Some(1.4),
        ),
        timed(
            "TokenBucket + CoarseClock deny / Gcra + CoarseClock deny",
            find(deny, "TokenBucket + CoarseClock"),
            find(deny, "Gcra + CoarseClock"),
            Some(1.5),
        ),
        timed(
            "TokenBucket + CoarseClock deny / Gcra + CoarseClock deny, 100/s (ticks shorter than the clock's lag)",
            find(deny, "TokenBucket + CoarseClock, 100/s"),
            find(deny, "Gcra + CoarseClock, 100/s"),
            Some(1.5),
        ),
        // The row above (1.05) cannot go below what the clock read alone costs against
        // governor's whole check (each check reads the clock once). On coarse clocks each runs on
        // its own: ours one inlined load, governor's a call into quanta and a `Duration`. The row
        // after it puts ours on governor's read, to compare the checks alone.
        timed(
            "Gcra + CoarseClock allow / governor check + coarse clock",
            find(allow, "Gcra + CoarseClock"),
            find(allow, "governor check + coarse clock"),
            Some(0.85),
        ),
        target(
            "Gcra on governor's coarse read / governor check + coarse clock (the checks alone)",
            ratio(
                find(allow, "Gcra + quanta recent time (governor's coarse read)"),
                find(allow, "governor check + coarse clock"),
            ),
            None,
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
        // The run past the cache goes under the target of many keys.
        let past = (*keys > 1).then_some(f.past_cache);
        keyed(&mut targets, *keys, one, two, past);
    }
    // The sharded limiter at 2 threads: its development targets.
    if let Some((_, v)) = f.contended.iter().find(|(t, _)| *t == 2) {
        // On the default clocks, then every limiter on a coarse clock: the shards then cost
        // little more than their CAS, while one shared word's cost is its cache line moving
        // between cores.
        // Each with what two threads serve that only read the clock and change a word of their
        // own: what any sharded check does at least.
        for (ours, gov, mutex, own_word, clocks) in [
            (
                "Sharded<Gcra>",
                "governor check",
                "MutexTokenBucket (std)",
                "floor: clock read + CAS, own word",
                "",
            ),
            (
                "Sharded<Gcra> + CoarseClock",
                "governor check + coarse clock",
                "MutexTokenBucket (std) + CoarseClock",
                "floor: CoarseClock read + CAS, own word",
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
            targets.push(
                target(
                    &format!(
                        "Sharded<Gcra> / MutexTokenBucket (std), 2 threads (throughput){clocks}"
                    ),
                    ratio(s, find(v, mutex)),
                    None,
                    Some(15.0),
                )
                .bounded_by(
                    &format!(
                        "{} / MutexTokenBucket (std), 2 threads",
                        own_word.trim_start_matches("floor: ")
                    ),
                    most(find(v, own_word)) / median(&find(v, mutex).samples),
                ),
            );
        }
    }
    targets
}

/// The keyed targets at `keys` keys: time per check on one thread (`one`), throughput with two
/// threads on distinct keys (`two`); under the target on the default clocks, for reference, the
/// same ratio from `past` (keys, and time per check) where it is given.
fn keyed(
    targets: &mut Vec<Target>,
    keys: u64,
    one: &[Series],
    two: &[Series],
    past: Option<(u64, &[Series])>,
) {
    // On the default clocks, then both on a coarse clock (quanta's "recent" time, one load).
    // Each store, and the target on the faster of the two.
    for (ours, dash, free, pinned, gov, clocks) in [
        (
            "Keyed<u64, Gcra>",
            Some("Keyed<u64, Gcra>, dashmap store"),
            "Keyed<u64, Gcra>, lock-free store",
            "Keyed<u64, Gcra>, pinned handle",
            "governor keyed check_key",
            "",
        ),
        (
            "Keyed<u64, Gcra> + CoarseClock",
            None,
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
            // What the row stands on, in one loop over the same keys, against governor's check:
            // the least an atomic check does on a table of probed slots that takes no lock, as
            // the default store is (the clock read, the probe for the key's word and one CAS on
            // it, on 16-byte slots made for u64 keys); the same through the default store's own
            // lookup, on its 32-byte slots holding a bare word (what a check on the store costs
            // before its limiter decides anything); and on dashmap (under a shard's read lock),
            // with and without the CAS.
            let floor_in = |series: &[Series], parts: &str| {
                fastest(find(series, &format!("floor: {parts}")))
                    / median(&find(series, gov).samples)
            };
            let floor = |parts: &str| floor_in(one, parts);
            // The lesser of the two lock-free loops bounds the check: on one host the bare
            // 16-byte slots probe faster, on another the store's tags apart beat them.
            let (least, least_of) = [
                "clock read + lock-free probe + CAS",
                "clock read + default store lookup + CAS",
            ]
            .map(|parts| (floor(parts), parts))
            .into_iter()
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .expect("two floors");
            targets.push(
                timed(
                    &format!(
                        "Keyed (default store) / governor keyed, {keys} key(s), time per check"
                    ),
                    find(one, ours),
                    find(one, gov),
                    Some(most),
                )
                .bounded_by(
                    &format!("{least_of} / governor keyed, {keys} key(s)"),
                    least,
                ),
            );
            targets.push(target(
                &format!(
                    "    on the default store: clock read + its lookup + CAS / governor keyed, \
                     {keys} key(s)"
                ),
                floor("clock read + default store lookup + CAS"),
                None,
                None,
            ));
            targets.push(target(
                &format!(
                    "    on dashmap: clock read + dashmap get + CAS / governor keyed, {keys} key(s)"
                ),
                floor("clock read + dashmap get + CAS"),
                None,
                None,
            ));
            targets.push(target(
                &format!(
                    "    the same without the CAS: clock read + dashmap get / governor keyed, \
                     {keys} key(s)"
                ),
                floor("clock read + dashmap get"),
                None,
                None,
            ));
            // Where every table outgrows the cache, a check waits on memory: the default
            // store's one slot against dashmap's control bytes and entry.
            if let Some((past_keys, past)) = past {
                targets.push(target(
                    &format!(
                        "    past the cache: Keyed (default store) / governor keyed, \
                         {past_keys} key(s)"
                    ),
                    ratio(find(past, ours), find(past, gov)),
                    None,
                    None,
                ));
                targets.push(target(
                    &format!(
                        "      there, the default store's lookup: clock read + its lookup + CAS \
                         / governor keyed, {past_keys} key(s)"
                    ),
                    floor_in(past, "clock read + default store lookup + CAS"),
                    None,
                    None,
                ));
            }
        }
        let ways = [
            Some(("default: flat", ours)),
            dash.map(|dash| ("dashmap", dash)),
            Some(("lock-free", free)),
            Some(("lock-free, pinned handle", pinned)),
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
            for (store, name) in ways.into_iter().flatten() {
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
