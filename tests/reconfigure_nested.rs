//! Changes of quota made from inside a check or a change (a clock that changes a quota when it is
//! read), racing changes on other threads: none deadlocks, and an unrelated change afterwards
//! still completes. Each scenario runs on its own threads and fails on a timeout, never hangs.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::mpsc;
use std::sync::{Arc, Barrier, OnceLock};
use std::thread;
use std::time::Duration;

use atomic_limiter::algorithm::GcraAlgorithm;
use atomic_limiter::{Carry, Clock, ManualClock, Quota, Reconfigurable};

type Plain = Reconfigurable<GcraAlgorithm, ManualClock>;
type Hooked = Reconfigurable<GcraAlgorithm, HookClock>;

/// A manual clock that runs a hook inside every reading.
#[derive(Clone)]
struct HookClock {
    time: ManualClock,
    hook: Arc<dyn Fn() + Send + Sync>,
}

impl Clock for HookClock {
    fn now(&self) -> u64 {
        (self.hook)();
        self.time.now()
    }
}

/// How long a scenario may take before it counts as a deadlock: orders of magnitude over what
/// each takes (well under a millisecond, plus the 50 ms head start below).
const HANG: Duration = Duration::from_secs(10);

/// Runs `f` on a thread of its own; fails with `what` if it has not returned within [`HANG`]
/// (the hung thread is left behind: the test process ends without it).
fn within_the_limit(what: &str, f: impl FnOnce() + Send + 'static) {
    let (done, finished) = mpsc::channel();
    thread::spawn(move || {
        f();
        let _ = done.send(());
    });
    assert!(
        finished.recv_timeout(HANG).is_ok(),
        "deadlock: {what} did not return within {HANG:?}"
    );
}

/// Thread A checks `x`, whose clock changes `y`'s quota; thread B changes `y` while A's check
/// is open. A change that waited for every open check while it held `y`'s lock would wait for
/// A, which waits for that lock.
#[test]
fn a_change_inside_a_check_races_a_change_of_the_same_limiter() {
    within_the_limit(
        "a check whose clock changes a limiter another thread changes",
        || {
            let y = Arc::new(Plain::with_clock(Quota::per_second(5), ManualClock::new()));
            let in_check = Arc::new(Barrier::new(2));
            let armed = Arc::new(AtomicBool::new(false));
            let hook = {
                let (y, in_check, armed) = (y.clone(), in_check.clone(), armed.clone());
                move || {
                    if armed.swap(false, Relaxed) {
                        in_check.wait();
                        // B takes `y`'s change first.
                        thread::sleep(Duration::from_millis(50));
                        y.set_quota(Quota::per_second(7), Carry::Debt);
                    }
                }
            };
            let x = Arc::new(Hooked::with_clock(
                Quota::per_second(10),
                HookClock {
                    time: ManualClock::new(),
                    hook: Arc::new(hook),
                },
            ));
            armed.store(true, Relaxed);
            let a = {
                let x = x.clone();
                thread::spawn(move || assert!(x.check().is_allowed()))
            };
            in_check.wait();
            y.set_quota(Quota::per_second(8), Carry::Debt);
            a.join().unwrap();
            let burst = y.quota().burst();
            assert!(burst == 7 || burst == 8, "{burst}");
        },
    );
    within_the_limit("a change of an unrelated limiter afterwards", || {
        let z = Plain::with_clock(Quota::per_second(1), ManualClock::new());
        z.set_quota(Quota::per_second(2), Carry::Debt);
        assert_eq!(z.quota(), Quota::per_second(2));
    });
}

/// A clock that changes its own limiter's quota when read: from inside a check, and from inside
/// a change made outside one (the change reads the clock for the carry's instant).
#[test]
fn a_clock_that_changes_its_own_limiter_does_not_deadlock() {
    within_the_limit("a limiter whose clock changes its own quota", || {
        let me: Arc<OnceLock<Arc<Hooked>>> = Arc::default();
        let fired = Arc::new(AtomicU32::new(0));
        let armed = Arc::new(AtomicBool::new(false));
        let hook = {
            let (me, fired, armed) = (me.clone(), fired.clone(), armed.clone());
            move || {
                if armed.swap(false, Relaxed) {
                    if let Some(me) = me.get() {
                        fired.fetch_add(1, Relaxed);
                        me.set_quota(Quota::per_second(3), Carry::Debt);
                    }
                }
            }
        };
        let limiter = Arc::new(Hooked::with_clock(
            Quota::per_second(10),
            HookClock {
                time: ManualClock::new(),
                hook: Arc::new(hook),
            },
        ));
        let _ = me.set(limiter.clone());
        // From inside a check.
        armed.store(true, Relaxed);
        assert!(limiter.check().is_allowed());
        assert_eq!(limiter.quota(), Quota::per_second(3));
        // From inside a change: the nested one lands, and the outer one is made on top of it.
        armed.store(true, Relaxed);
        limiter.set_quota(Quota::per_second(20), Carry::Debt);
        assert_eq!(fired.load(Relaxed), 2);
        assert_eq!(limiter.quota(), Quota::per_second(20));
        // One token of the first burst was spent; what was spent carries over as time.
        let left = limiter.check_n(0).unwrap().remaining();
        assert!(left < 20, "{left}");
    });
    within_the_limit("a change of an unrelated limiter afterwards", || {
        let z = Plain::with_clock(Quota::per_second(1), ManualClock::new());
        z.set_quota(Quota::per_second(2), Carry::Debt);
        assert_eq!(z.quota(), Quota::per_second(2));
    });
}
