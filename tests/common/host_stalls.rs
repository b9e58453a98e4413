//! What the host took from a timed test: how long its threads were kept off a CPU while they
//! were ready to run, and how long the whole machine stood still.
//!
//! A deadline test on a shared two-core runner sees, now and then, one call that takes three
//! deadlines because the kernel or the hypervisor did not run the test at all. This tells that
//! apart from a call the code under test held up: a thread blocked in a lock or a syscall is not
//! ready to run, so it waits on no run queue and the sampler is not late; only time the host took
//! is attributed to it.
//!
//! Two measures, sampled every millisecond on a thread of their own:
//! - each watched thread's run-queue delay (the second figure of Linux's
//!   `/proc/<pid>/task/<tid>/schedstat`), where the kernel has that file;
//! - the sampler's own lateness: a one-millisecond sleep that took two or more. It sees a paused
//!   virtual machine, whose steal time no run queue shows.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const PERIOD: Duration = Duration::from_millis(1);
/// The sampler runs no longer than this, whatever the test does.
const LONGEST: Duration = Duration::from_secs(120);

/// One sample: when it was taken, what the host took since the sample before.
#[derive(Clone, Debug)]
pub struct Sample {
    pub at: Instant,
    /// The sampler's lateness since the sample before.
    pub late: Duration,
    /// Each watched thread's run-queue delay since the sample before, by watch order.
    pub waited: Vec<Duration>,
}

#[derive(Default)]
struct Shared {
    threads: Mutex<Vec<PathBuf>>,
    samples: Mutex<Vec<Sample>>,
    stop: AtomicBool,
}

/// A running sampler; stopped when dropped.
pub struct HostStalls {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// A handle that adds the calling thread to the watched ones (for a runtime's
/// `on_thread_start`).
#[derive(Clone)]
pub struct Watch(Arc<Shared>);

impl Watch {
    pub fn current_thread(&self) {
        // `/proc/thread-self` links to `<pid>/task/<tid>`.
        if let Ok(link) = std::fs::read_link("/proc/thread-self") {
            let path = PathBuf::from("/proc").join(link).join("schedstat");
            self.0.threads.lock().unwrap().push(path);
        }
    }
}

/// A thread's run-queue delay so far, where the kernel reports it.
fn run_delay(path: &PathBuf) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.split_whitespace().nth(1)?.parse().ok()
}

impl HostStalls {
    pub fn start() -> HostStalls {
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let thread = std::thread::spawn(move || {
            let began = Instant::now();
            let mut last = Instant::now();
            let mut delays: Vec<Option<u64>> = Vec::new();
            while !s.stop.load(Ordering::Relaxed) && began.elapsed() < LONGEST {
                std::thread::sleep(PERIOD);
                let at = Instant::now();
                let gap = at - last;
                last = at;
                // A sleep's ordinary overshoot is tens of microseconds: only a gap of two periods
                // or more counts, and then all of its excess.
                let late = if gap >= 2 * PERIOD {
                    gap - PERIOD
                } else {
                    Duration::ZERO
                };
                let threads = s.threads.lock().unwrap().clone();
                let now: Vec<Option<u64>> = threads.iter().map(run_delay).collect();
                let waited = now
                    .iter()
                    .enumerate()
                    .map(|(i, d)| match (delays.get(i).copied().flatten(), d) {
                        (Some(a), Some(b)) => Duration::from_nanos(b.saturating_sub(a)),
                        _ => Duration::ZERO,
                    })
                    .collect();
                delays = now;
                s.samples.lock().unwrap().push(Sample { at, late, waited });
            }
        });
        HostStalls {
            shared,
            thread: Some(thread),
        }
    }

    pub fn watch(&self) -> Watch {
        Watch(self.shared.clone())
    }

    /// Watches every thread of another process too (a server the test talks to): a server kept
    /// off a CPU while ready to run is time the host took, as a test thread kept off one is.
    pub fn watch_process(&self, pid: u32) {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return;
        };
        let mut threads = self.shared.threads.lock().unwrap();
        for task in tasks.flatten() {
            threads.push(task.path().join("schedstat"));
        }
    }

    /// What the host took from `[from, to]`.
    pub fn taken(&self, from: Instant, to: Instant) -> Duration {
        taken(&self.shared.samples.lock().unwrap(), from, to)
    }
}

impl Drop for HostStalls {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the host took from `[from, to]`, by the samples: each sample's figures happened
/// somewhere in the span since the sample before, so each counts for no more than that span's
/// overlap with `[from, to]`. The larger of the two measures: a stall of the whole machine can
/// show in both.
pub fn taken(samples: &[Sample], from: Instant, to: Instant) -> Duration {
    let mut late = Duration::ZERO;
    let mut waited: Vec<Duration> = Vec::new();
    for pair in samples.windows(2) {
        let (a, b) = (pair[0].at, pair[1].at);
        let overlap = b.min(to).saturating_duration_since(a.max(from));
        if overlap.is_zero() {
            continue;
        }
        late += pair[1].late.min(overlap);
        waited.resize(waited.len().max(pair[1].waited.len()), Duration::ZERO);
        for (w, d) in waited.iter_mut().zip(&pair[1].waited) {
            *w += (*d).min(overlap);
        }
    }
    waited.into_iter().fold(late, Duration::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn taken_counts_each_stall_once_and_within_the_span() {
        let t = Instant::now();
        let sample = |at: u64, late: u64, waited: &[u64]| Sample {
            at: t + ms(at),
            late: ms(late),
            waited: waited.iter().map(|&w| ms(w)).collect(),
        };
        // A 30 ms pause of the machine ends at 41; a thread waits 5 ms on a run queue by 50.
        let s = [
            sample(10, 0, &[0, 0]),
            sample(11, 0, &[0, 0]),
            sample(41, 29, &[0, 1]),
            sample(50, 0, &[5, 0]),
        ];
        assert_eq!(taken(&s, t + ms(11), t + ms(41)), ms(29));
        // Clipped to the part of the gap inside the span.
        assert_eq!(taken(&s, t + ms(31), t + ms(60)), ms(10));
        // The larger measure, not their sum.
        assert_eq!(taken(&s, t + ms(41), t + ms(50)), ms(5));
        // Outside every sample: nothing.
        assert_eq!(taken(&s, t, t + ms(10)), Duration::ZERO);
        assert_eq!(taken(&s, t + ms(60), t + ms(70)), Duration::ZERO);
    }
}
