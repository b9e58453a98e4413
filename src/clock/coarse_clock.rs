use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use crate::clock::{Clock, QuantaClock};
use crate::sync::{Ordering, StaticAtomicU64};

/// How often the upkeep thread refreshes the coarse time, and so [`CoarseClock`]'s resolution.
const UPKEEP_INTERVAL: Duration = Duration::from_millis(1);

/// The coarse time: the precise clock's reading (`SOURCE`) as of the upkeep thread's last pass.
static RECENT: StaticAtomicU64 = StaticAtomicU64::new(0);

/// The precise clock behind the coarse time, made once per process with the upkeep thread. It
/// is one calibration of the TSC, shared (copied) by the upkeep thread and every `CoarseClock`, so
/// that a coarse reading is an earlier value of the same function as a precise one: never ahead of
/// it.
static SOURCE: OnceLock<QuantaClock> = OnceLock::new();

/// Held while the upkeep thread is started, so that only one ever runs (one calibration), and a
/// start the system refused may be tried again.
static STARTING: Mutex<()> = Mutex::new(());

/// Starts the upkeep thread on a new precise clock, unless the system refuses it.
fn start() -> std::io::Result<QuantaClock> {
    let source = QuantaClock::new();
    let mut last = source.now();
    // Relaxed: a time, read on its own; no other memory is published with it.
    RECENT.store(last, Ordering::Relaxed);
    let upkeep = source.clone();
    std::thread::Builder::new()
        .name("atomic-limiter-coarse-clock".into())
        .spawn(move || {
            loop {
                std::thread::sleep(UPKEEP_INTERVAL);
                // The only writer, and never back: a thread moved to a core whose counter lags
                // reads an earlier time.
                last = last.max(upkeep.now());
                // Relaxed: as above.
                RECENT.store(last, Ordering::Relaxed);
            }
        })?;
    Ok(source)
}

/// A coarse time: one load of a global that an upkeep thread refreshes every millisecond.
///
/// The cheapest clock there is, at the price of resolution: readings advance in steps of about
/// 1 ms (the upkeep interval, [`Clock::resolution`]), and trail real time by one step, or by more
/// when the upkeep thread is held off the CPU (on a loaded machine, several steps). Limiters
/// decide exactly on the times they read; as the lag varies, a span of real time may hold what
/// the quota allows over that span and the lag (at 1000 a second, one request more over a 1 ms
/// lag), as on any clock of this resolution. A denial is checked once more on a precise
/// reading ([`Clock::now_fresh`], the TSC through quanta) before it is answered, and its
/// retry-after is rounded up to whole steps plus one, so waiting it is always enough. Admissions
/// cost one load, inlined (no call, no conversion); only denials pay for the precise reading.
///
/// The first `CoarseClock` made in a process starts the upkeep thread
/// (`atomic-limiter-coarse-clock`), which then runs for the life of the process.
#[derive(Debug, Clone)]
pub struct CoarseClock {
    source: QuantaClock,
    /// The coarse time when this clock was made: its readings count from there.
    origin: u64,
}

impl CoarseClock {
    /// A clock whose origin is now, starting the upkeep thread if it is not running.
    ///
    /// # Panics
    ///
    /// If the system refuses to start the upkeep thread, as [`std::thread::spawn`] panics;
    /// [`CoarseClock::try_new`] returns the error instead.
    pub fn new() -> CoarseClock {
        CoarseClock::try_new().expect("the coarse clock's upkeep thread could not be started")
    }

    /// A clock whose origin is now, or the system's refusal to start the upkeep thread (which a
    /// later call tries again).
    ///
    /// # Errors
    ///
    /// The error [`std::thread::Builder::spawn`] returned.
    pub fn try_new() -> std::io::Result<CoarseClock> {
        let source = match SOURCE.get() {
            Some(source) => source,
            None => {
                let _starting = STARTING.lock().unwrap_or_else(PoisonError::into_inner);
                match SOURCE.get() {
                    Some(source) => source,
                    None => {
                        let source = start()?;
                        SOURCE.get_or_init(|| source)
                    }
                }
            }
        };
        Ok(CoarseClock {
            source: source.clone(),
            // Relaxed: a time, as above.
            origin: RECENT.load(Ordering::Relaxed),
        })
    }
}

impl Default for CoarseClock {
    fn default() -> CoarseClock {
        CoarseClock::new()
    }
}

impl Clock for CoarseClock {
    #[inline]
    fn now(&self) -> u64 {
        // Relaxed: a time, read on its own.
        RECENT.load(Ordering::Relaxed).saturating_sub(self.origin)
    }

    #[inline]
    fn resolution(&self) -> u64 {
        UPKEEP_INTERVAL.as_nanos() as u64
    }

    /// Both the coarse time and the precise one come from one monotonic source.
    #[inline]
    fn is_monotonic(&self) -> bool {
        true
    }

    #[inline]
    fn now_fresh(&self) -> u64 {
        self.source.now().saturating_sub(self.origin)
    }
}
