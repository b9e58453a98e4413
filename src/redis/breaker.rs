//! The circuit breaker in front of the store: after `threshold` consecutive failures it opens and
//! calls fail fast (no I/O) until a jittered cooldown has passed; then one call, the probe, goes
//! through (half-open) while the others keep failing fast; the probe's success closes it, its
//! failure opens it again.
//!
//! The breaker is one word changed through [`StateCell::update`], by pure steps:
//!
//! | bits     | field |
//! |----------|-------|
//! | `0..16`  | consecutive failures (saturating) |
//! | `16`     | a probe is in flight |
//! | `17..64` | the tick at which it half-opens; 0 while closed |
//!
//! A tick is 2^20 ns (about 1 ms): 47 bits of them last for millions of years.

use crate::state_cell::{StateCell, Step};

const FAILURES: u64 = 0xFFFF;
const PROBE: u64 = 1 << 16;
const REOPEN_SHIFT: u32 = 17;
/// Nanoseconds per tick, as a shift.
const TICK_SHIFT: u32 = 20;

/// Nanoseconds to ticks, rounded up (a cooldown is never cut short), at least 1 so that an open
/// breaker's word is never 0.
fn ticks_up(ns: u64) -> u64 {
    ns.div_ceil(1 << TICK_SHIFT).max(1)
}

/// What the breaker lets a caller do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Permit {
    /// Closed: call.
    Call,
    /// Half-open, and this caller is the probe: call, and report back (a [`ProbeGuard`] reports a
    /// probe dropped unfinished as a failure).
    Probe,
    /// Open: do not call; the breaker half-opens in this many ns.
    Refuse { wait_ns: u64 },
}

fn admit(word: u64, now_tick: u64) -> Step<Permit> {
    let reopen = word >> REOPEN_SHIFT;
    if reopen == 0 {
        Step::Keep(Permit::Call)
    } else if now_tick < reopen {
        Step::Keep(Permit::Refuse {
            wait_ns: (reopen - now_tick) << TICK_SHIFT,
        })
    } else if word & PROBE != 0 {
        // Another caller is probing: the answer comes within its deadline.
        Step::Keep(Permit::Refuse {
            wait_ns: 1 << TICK_SHIFT,
        })
    } else {
        Step::Store(Permit::Probe, word | PROBE)
    }
}

fn succeed(word: u64) -> Step<()> {
    if word == 0 {
        Step::Keep(())
    } else {
        Step::Store((), 0)
    }
}

fn fail(word: u64, now_tick: u64, threshold: u64, cooldown_ticks: u64, probe: bool) -> Step<()> {
    let failures = ((word & FAILURES) + 1).min(FAILURES);
    let reopen = word >> REOPEN_SHIFT;
    let open = probe || failures >= threshold;
    if !open {
        return Step::Store((), (word & !FAILURES) | failures);
    }
    if !probe && reopen != 0 {
        // Already open, or half-open with another caller's probe out: a late failure of a call
        // that started before it opened changes nothing.
        return Step::Keep(());
    }
    let until = now_tick
        .saturating_add(cooldown_ticks)
        .min(u64::MAX >> REOPEN_SHIFT);
    Step::Store((), (until << REOPEN_SHIFT) | failures)
}

/// The breaker's shared state and settings.
#[derive(Debug)]
pub(crate) struct Breaker {
    word: StateCell,
    threshold: u64,
    cooldown_ns: u64,
}

impl Breaker {
    /// Opens after `threshold` consecutive failures (at least 1), for `cooldown_ns` (±50 %
    /// jitter, so that nodes that failed together do not probe together).
    pub(crate) fn new(threshold: u32, cooldown_ns: u64) -> Breaker {
        Breaker {
            word: StateCell::new(0),
            threshold: u64::from(threshold.clamp(1, FAILURES as u32)),
            cooldown_ns,
        }
    }

    pub(crate) fn admit(&self, now_ns: u64) -> Permit {
        let tick = now_ns >> TICK_SHIFT;
        self.word.update(|w| admit(w, tick))
    }

    /// Whether it is closed now (neither open nor half-open); no state changes.
    pub(crate) fn is_closed(&self) -> bool {
        self.word.update(Step::Keep) >> REOPEN_SHIFT == 0
    }

    pub(crate) fn succeed(&self) {
        self.word.update(succeed);
    }

    pub(crate) fn fail(&self, now_ns: u64, probe: bool) {
        let tick = now_ns >> TICK_SHIFT;
        // cooldown × [0.5, 1.5)
        let half = self.cooldown_ns / 2;
        let jitter = if half == 0 {
            0
        } else {
            crate::wait::next_random() % (2 * half)
        };
        let cooldown = ticks_up(half.saturating_add(jitter));
        let threshold = self.threshold;
        self.word
            .update(|w| fail(w, tick, threshold, cooldown, probe));
    }
}

/// A probe's report: dropped without [`ProbeGuard::settle`] (its future was cancelled), it counts
/// as a failure, so that the breaker never waits on a probe nobody runs.
pub(crate) struct ProbeGuard<'a> {
    breaker: &'a Breaker,
    probe: bool,
    now_ns: u64,
    settled: bool,
}

impl<'a> ProbeGuard<'a> {
    pub(crate) fn new(breaker: &'a Breaker, permit: Permit, now_ns: u64) -> ProbeGuard<'a> {
        ProbeGuard {
            breaker,
            probe: permit == Permit::Probe,
            now_ns,
            settled: false,
        }
    }

    /// Reports the call's outcome; `now_ns` is when it ended.
    pub(crate) fn settle(mut self, ok: bool, now_ns: u64) {
        self.settled = true;
        if ok {
            self.breaker.succeed();
        } else {
            self.breaker.fail(now_ns, self.probe);
        }
    }
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        if !self.settled && self.probe {
            self.breaker.fail(self.now_ns, true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1 << TICK_SHIFT;

    #[test]
    fn opens_after_the_threshold_and_fails_fast_until_the_cooldown() {
        let b = Breaker::new(3, 100 * MS);
        assert_eq!(b.admit(0), Permit::Call);
        b.fail(0, false);
        b.fail(0, false);
        assert_eq!(b.admit(0), Permit::Call);
        b.fail(0, false);
        match b.admit(MS) {
            Permit::Refuse { wait_ns } => {
                assert!((48 * MS..=151 * MS).contains(&wait_ns), "{wait_ns}")
            }
            other => panic!("{other:?}"),
        }
        // Past the longest jittered cooldown: one probe, the others still refused.
        assert_eq!(b.admit(200 * MS), Permit::Probe);
        assert!(matches!(b.admit(200 * MS), Permit::Refuse { .. }));
        b.succeed();
        assert_eq!(b.admit(200 * MS), Permit::Call);
    }

    #[test]
    fn a_success_resets_the_count() {
        let b = Breaker::new(2, 100 * MS);
        b.fail(0, false);
        b.succeed();
        b.fail(0, false);
        assert_eq!(b.admit(0), Permit::Call);
    }

    #[test]
    fn a_failed_probe_reopens() {
        let b = Breaker::new(1, 100 * MS);
        b.fail(0, false);
        assert_eq!(b.admit(200 * MS), Permit::Probe);
        b.fail(200 * MS, true);
        assert!(matches!(b.admit(201 * MS), Permit::Refuse { .. }));
    }

    /// A probe whose future is dropped mid-call must not leave the breaker half-open forever.
    #[test]
    fn a_cancelled_probe_counts_as_a_failure() {
        let b = Breaker::new(1, 100 * MS);
        b.fail(0, false);
        let permit = b.admit(200 * MS);
        assert_eq!(permit, Permit::Probe);
        drop(ProbeGuard::new(&b, permit, 200 * MS));
        assert!(matches!(b.admit(201 * MS), Permit::Refuse { .. }));
        assert_eq!(b.admit(400 * MS), Permit::Probe);
    }

    #[test]
    fn a_zero_cooldown_still_opens_for_a_tick() {
        let b = Breaker::new(1, 0);
        b.fail(0, false);
        assert!(matches!(b.admit(0), Permit::Refuse { .. }));
        assert_eq!(b.admit(MS), Permit::Probe);
    }
}
