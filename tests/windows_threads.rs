//! A fixed window under real threads, on a recording clock (the OS's monotonic clock, whose
//! readings are ordered across cores, each check's own reading kept by its thread): no window by
//! the limiter's own accounting ever holds more than its limit, and no window by the admissions'
//! own readings more than `limit + threads - 1`.
//!
//! Why the second bound: a reading behind the stored window is counted in the stored (later)
//! window, so a window's readings can be counted in the next one. A thread makes at most one such
//! admission per window change: its next reading comes after the reading that moved the window,
//! which is in the new window already.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Barrier, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use atomic_limiter::{Clock, FixedWindow, Quota};

thread_local! {
    /// The last reading the limiter took on this thread.
    static LAST: Cell<u64> = const { Cell::new(0) };
}

/// The OS's monotonic clock in ns from the first reading, each reading kept for its thread, and
/// the thread yielding right after it.
#[derive(Clone, Copy, Debug)]
struct Recording;

fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

impl Clock for Recording {
    fn now(&self) -> u64 {
        let ns = base().elapsed().as_nanos() as u64;
        LAST.with(|l| l.set(ns));
        // Preempted between the reading and its compare-and-swap, as a thread is now and then:
        // the other threads move the window meanwhile, so stale readings are common here.
        thread::yield_now();
        ns
    }

    fn is_monotonic(&self) -> bool {
        true
    }
}

/// Admissions, each as (its reading, the end of the window the limiter counted it in).
fn admissions(threads: usize, limit: u32, window: Duration) -> Vec<(u64, u64)> {
    let quota = Quota::try_new(u64::from(limit), window, limit).unwrap();
    let limiter = FixedWindow::with_clock(quota, Recording).unwrap();
    let start = Barrier::new(threads);
    thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    let began = Instant::now();
                    let mut out = Vec::new();
                    // Bounded in count and time.
                    for _ in 0..300_000 {
                        if began.elapsed() > Duration::from_secs(2) {
                            break;
                        }
                        let d = limiter.check();
                        if d.is_allowed() {
                            let at = LAST.with(Cell::get);
                            let end = at + d.reset_after().as_nanos() as u64;
                            out.push((at, end));
                        }
                    }
                    out
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    })
}

#[test]
fn a_fixed_window_under_threads_stays_within_both_bounds() {
    for threads in [2, 4] {
        let (limit, window) = (3u32, Duration::from_micros(200));
        let w = window.as_nanos() as u64;
        let admitted = admissions(threads, limit, window);
        // The windows start at the limiter's first reading, on its grid of `w`: by its own
        // accounting each admission's window ends where its decision says it resets.
        let mut by_limiter: HashMap<u64, u32> = HashMap::new();
        for &(_, end) in &admitted {
            *by_limiter.entry(end).or_default() += 1;
        }
        let most = by_limiter.values().copied().max().unwrap_or(0);
        assert!(
            most <= limit,
            "{threads} threads: {most} admissions in one window by the limiter's accounting"
        );
        // By the readings: the window each reading falls in, on the same grid (the ends above
        // are `w` apart).
        let origin = by_limiter.keys().min().copied().unwrap_or(0) % w;
        let mut by_reading: HashMap<u64, u32> = HashMap::new();
        for &(at, _) in &admitted {
            *by_reading.entry((at + w - origin) / w).or_default() += 1;
        }
        let most_read = by_reading.values().copied().max().unwrap_or(0);
        let stale = admitted.iter().filter(|&&(at, end)| end - at > w).count();
        eprintln!(
            "{threads} threads: {} admissions over {} windows; at most {most} in one by the \
             limiter's accounting, {most_read} by the readings; {stale} counted in a later window \
             than their reading's",
            admitted.len(),
            by_limiter.len()
        );
        assert!(admitted.len() > 100, "{} admissions", admitted.len());
        assert!(
            most_read < limit + threads as u32,
            "{threads} threads: {most_read} admissions in one window by their readings"
        );
    }
}
