//! Running the subjects: interleaved repetitions on one thread or several, the series of
//! samples each gives, and how steady the host was while they ran.

use crate::stats::median;
use crate::subjects::{Kind, Subject, run_threads};
use std::time::Duration;

/// Samples of one subject, in ns per operation (or Mops/s for throughput).
pub(crate) struct Series {
    pub(crate) name: &'static str,
    pub(crate) kind: Kind,
    pub(crate) samples: Vec<f64>,
}

pub(crate) fn spread(v: &[f64]) -> (f64, f64) {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(0.0, f64::max);
    (min, max)
}

/// A series of times at its fastest repetition: a floor's figure (the end of its spread that
/// makes a bound hardest to call past its target), and what a median is read against for a stall.
pub(crate) fn fastest(s: &Series) -> f64 {
    spread(&s.samples).0
}

/// Iterations that take about `target` on one thread.
pub(crate) fn calibrate(s: &Subject, target: Duration) -> u64 {
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
pub(crate) fn single(subjects: &[Subject], reps: usize, target: Duration) -> Vec<Series> {
    single_warmed(subjects, reps, target, 0)
}

/// [`single`], each timed run preceded by `warm` untimed operations of the same subject: one
/// pass over a keyed subject's keys, so that each starts with its own table as warm as its own
/// traffic keeps it, whichever subject ran before.
pub(crate) fn single_warmed(
    subjects: &[Subject],
    reps: usize,
    target: Duration,
    warm: u64,
) -> Vec<Series> {
    interleaved(subjects, 1, reps, target, warm, |ops, t| {
        t.as_nanos() as f64 / ops as f64
    })
}

/// Total Mops/s with `threads` threads on one limiter, `reps` interleaved repetitions.
pub(crate) fn contended(
    subjects: &[Subject],
    threads: usize,
    reps: usize,
    target: Duration,
) -> Vec<Series> {
    contended_warmed(subjects, threads, reps, target, 0)
}

/// [`contended`], each timed run preceded by `warm` untimed operations on each thread, as in
/// [`single_warmed`].
pub(crate) fn contended_warmed(
    subjects: &[Subject],
    threads: usize,
    reps: usize,
    target: Duration,
    warm: u64,
) -> Vec<Series> {
    interleaved(subjects, threads, reps, target, warm, |ops, t| {
        ops as f64 / t.as_secs_f64() / 1e6
    })
}

/// `reps` repetitions of every subject on `threads` threads, interleaved (A, B, C, then A, B, C
/// again), each timed run preceded by `warm` untimed operations on each thread; each sample is
/// `figure` of the operations run on all threads and the time they took.
fn interleaved(
    subjects: &[Subject],
    threads: usize,
    reps: usize,
    target: Duration,
    warm: u64,
    figure: fn(u64, Duration) -> f64,
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
            out[i].samples.push(figure(iters[i] * threads as u64, t));
        }
    }
    out
}

pub(crate) fn find<'a>(v: &'a [Series], name: &str) -> &'a Series {
    v.iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no subject {name}"))
}

/// `num`'s median over `den`'s: the ratio of the two figures the tables print, so that a reader
/// who divides one by the other gets the ratio printed beside them. (The repetitions of every
/// subject are interleaved, so a slow drift of the host moves both medians alike; a stall need
/// not: [`Steadiness`].)
pub(crate) fn ratio(num: &Series, den: &Series) -> f64 {
    median(&num.samples) / median(&den.samples)
}

/// How steady the host was while the two sides of a ratio of times ran: a stall slows some
/// repetitions and leaves others as they were, where a slower check slows them all. A median
/// more than [`STALLED`] above its own fastest repetition is a host that stalled.
pub(crate) struct Steadiness {
    /// Each side's median over its fastest repetition.
    pub(crate) num: f64,
    pub(crate) den: f64,
    /// The fastest repetition of one side over the other's.
    pub(crate) fastest: f64,
}

/// A median this far above its fastest repetition (10 %) is read as a stall of the host. On a
/// quiet host the medians of this run's subjects lie within 1 % to 5 % of their fastest.
pub(crate) const STALLED: f64 = 1.10;

impl Steadiness {
    /// `num` and `den`, two series of times.
    pub(crate) fn of(num: &Series, den: &Series) -> Steadiness {
        Steadiness {
            num: median(&num.samples) / fastest(num),
            den: median(&den.samples) / fastest(den),
            fastest: fastest(num) / fastest(den),
        }
    }

    /// Whether either side's median lies past [`STALLED`].
    pub(crate) fn stalled(&self) -> bool {
        self.num > STALLED || self.den > STALLED
    }
}
