use super::cell;
use super::limiter::Reconfigurable;
use crate::clock::Clock;
use crate::clock::ManualClock;
use crate::gcra::GcraAlgorithm;
use crate::limiter::algorithm::Carry;
use crate::quota::Quota;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::thread;

/// A clock whose clones count their drops: one clone lives in each cell, so a cell freed is
/// a drop counted. It can also run a hook inside every reading (a check in progress).
#[derive(Clone)]
struct Counted {
    time: ManualClock,
    drops: Arc<AtomicUsize>,
    hook: Arc<dyn Fn() + Send + Sync>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Relaxed);
    }
}

impl Clock for Counted {
    fn now(&self) -> u64 {
        (self.hook)();
        self.time.now()
    }
}

fn counted(hook: impl Fn() + Send + Sync + 'static) -> (Counted, Arc<AtomicUsize>) {
    let drops = Arc::new(AtomicUsize::new(0));
    let clock = Counted {
        time: ManualClock::new(),
        drops: drops.clone(),
        hook: Arc::new(hook),
    };
    (clock, drops)
}

/// Frees what `cells` replaced, once the checks open at each change have ended: those of
/// other tests' threads in this process too, so it tries again for up to 10 s.
fn collected<T: cell::Content>(cells: &cell::Cells<T>) -> bool {
    let start = std::time::Instant::now();
    while !cells.collect() {
        if start.elapsed() > std::time::Duration::from_secs(10) {
            return false;
        }
        thread::sleep(std::time::Duration::from_millis(1));
    }
    true
}

/// Each change frees the cell it replaced once the checks open then have ended (at once
/// where none is), and dropping the limiter frees the live one.
#[test]
fn a_change_frees_the_cell_it_replaced() {
    let (clock, drops) = counted(|| ());
    let limiter: Reconfigurable<GcraAlgorithm, Counted> =
        Reconfigurable::with_clock(Quota::per_second(10), clock);
    let before = drops.load(Relaxed);
    for i in 1..=20 {
        limiter.set_quota(Quota::per_second(i), Carry::Debt);
        assert!(collected(&limiter.cells), "after change {i}");
        // The replaced cell's clock (the new cell holds the clone the build took).
        assert_eq!(drops.load(Relaxed) - before, i as usize, "after change {i}");
    }
    drop(limiter);
    assert_eq!(drops.load(Relaxed) - before, 21);
}

/// A change made from inside a check (a clock that changes the quota it is read for) cannot
/// free its cell while that check runs: it keeps the replaced cell, freed by a later change
/// once the check has ended, or when the limiter is dropped. Checks nested in a check keep the outer one
/// open.
#[test]
fn a_change_from_inside_a_check_keeps_the_cell_until_it_can_free_it() {
    type Tunable = Reconfigurable<GcraAlgorithm, ManualClock>;
    let other: Arc<std::sync::OnceLock<Arc<Tunable>>> = Arc::default();
    let inside = Arc::new(AtomicBool::new(false));
    let (clock, drops) = {
        let (other, inside) = (other.clone(), inside.clone());
        counted(move || {
            if inside.swap(false, Relaxed) {
                if let Some(other) = other.get() {
                    // A nested check, then a change, both inside the outer check.
                    assert!(other.check().is_allowed());
                    other.set_quota(Quota::per_second(7), Carry::Debt);
                }
            }
        })
    };
    let outer: Reconfigurable<GcraAlgorithm, Counted> =
        Reconfigurable::with_clock(Quota::per_second(10), clock);
    let inner = Arc::new(Tunable::with_clock(
        Quota::per_second(5),
        ManualClock::new(),
    ));
    let _ = other.set(inner.clone());
    inside.store(true, Relaxed);
    assert!(outer.check().is_allowed());
    assert_eq!(inner.quota(), Quota::per_second(7));
    // Kept: the change ran inside the outer check's section.
    assert_eq!(inner.cells.writer.lock().unwrap().len(), 1);
    inner.set_quota(Quota::per_second(8), Carry::Debt);
    assert!(collected(&inner.cells));
    let before = drops.load(Relaxed);
    drop(outer);
    assert!(
        drops.load(Relaxed) > before,
        "the live cell is freed with the limiter"
    );
}

/// A check made while its thread's thread-locals are destroyed, after its slot went (a
/// straggler, on a slot of its own), is decided and waited out like any other: the change after it
/// frees the cell it replaced.
#[test]
fn a_check_in_a_thread_local_destructor_straggles() {
    type Tunable = Reconfigurable<GcraAlgorithm, ManualClock>;
    struct CheckOnExit(Arc<Tunable>, Arc<AtomicUsize>);
    impl Drop for CheckOnExit {
        fn drop(&mut self) {
            if self.0.check().is_allowed() {
                self.1.fetch_add(1, Relaxed);
            }
        }
    }
    std::thread_local! {
        static ON_EXIT: std::cell::RefCell<Option<CheckOnExit>> =
            const { std::cell::RefCell::new(None) };
    }
    let limiter = Arc::new(Tunable::with_clock(
        Quota::per_second(1).with_burst(5),
        ManualClock::new(),
    ));
    let admitted = Arc::new(AtomicUsize::new(0));
    let (l, a) = (limiter.clone(), admitted.clone());
    thread::spawn(move || {
        // Set before the thread's first check registers its slot, so destroyed after it
        // (thread-locals go in the reverse order of their first use).
        ON_EXIT.with(|e| *e.borrow_mut() = Some(CheckOnExit(l.clone(), a.clone())));
        assert!(l.check().is_allowed());
        a.fetch_add(1, Relaxed);
    })
    .join()
    .unwrap();
    assert_eq!(admitted.load(Relaxed), 2);
    limiter.set_quota(Quota::per_second(1).with_burst(5), Carry::Debt);
    assert!(collected(&limiter.cells));
    assert_eq!(limiter.check().remaining(), 2);
}

/// Threads check while another changes the quota (to the same figures) and frees each
/// replaced cell: nothing is read after it is freed (Miri checks this run), and exactly the
/// burst is admitted on a frozen clock.
#[test]
fn checks_racing_changes_never_read_a_freed_cell() {
    let (checks, changes) = if cfg!(miri) {
        (60, 10)
    } else {
        (20_000, 2_000)
    };
    let burst = 50;
    let quota = Quota::per_second(1).with_burst(burst);
    let limiter: Reconfigurable<GcraAlgorithm, ManualClock> =
        Reconfigurable::with_clock(quota, ManualClock::new());
    let admitted = AtomicUsize::new(0);
    thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..checks {
                    if limiter.check().is_allowed() {
                        admitted.fetch_add(1, Relaxed);
                    }
                }
            });
        }
        // Short-lived threads too: their slots come and go while changes scan them.
        s.spawn(|| {
            for _ in 0..4 {
                thread::scope(|t| {
                    t.spawn(|| limiter.quota());
                });
            }
        });
        s.spawn(|| {
            for _ in 0..changes {
                limiter.set_quota(quota, Carry::Debt);
            }
        });
    });
    assert_eq!(admitted.load(Relaxed), burst as usize);
    assert!(collected(&limiter.cells));
}
