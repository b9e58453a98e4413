//! The limiters and floors the benchmarks measure, shared by `benches/limiters.rs` (criterion) and
//! `examples/compare/` (the side-by-side table). Each subject is a closure that runs `iters`
//! checks in a loop monomorphised for its limiter, so dispatch costs one indirect call per batch,
//! not per check.
#![allow(dead_code)]

use atomic_limiter::algorithm::GcraAlgorithm;
use atomic_limiter::baseline::{BaselineLock, MutexGcra, MutexTokenBucket, TextbookBucket};
use atomic_limiter::{
    CoarseClock, Gcra, QuantaClock, Quota, RateLimiter, Reconfigurable, Sharded, TokenBucket,
};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[path = "subjects/keyed.rs"]
pub mod keyed;
pub use keyed::keyed_subjects;

/// parking_lot's mutex as a baseline lock.
pub struct PlMutex<T>(parking_lot::Mutex<T>);

impl<T> BaselineLock<T> for PlMutex<T> {
    fn new(value: T) -> Self {
        PlMutex(parking_lot::Mutex::new(value))
    }
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut self.0.lock())
    }
}

/// Who wrote it, for the ratios.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A lock-free limiter of this crate.
    Ours,
    /// A mutex baseline of this crate.
    Mutex,
    /// Another crate.
    Peer,
    /// Not a limiter: a cost the hot path is made of.
    Floor,
}

/// Runs `iters` operations and returns how many were admitted.
pub type Run = Box<dyn Fn(u64) -> u64 + Send + Sync>;

/// One thing to time.
pub struct Subject {
    /// Its label in tables and criterion ids.
    pub name: &'static str,
    /// Whose it is.
    pub kind: Kind,
    /// Runs `iters` operations; returns how many were admitted (for limiters).
    pub run: Run,
}

fn subject(
    name: &'static str,
    kind: Kind,
    run: impl Fn(u64) -> u64 + Send + Sync + 'static,
) -> Subject {
    Subject {
        name,
        kind,
        run: Box::new(run),
    }
}

fn allow_loop<L: RateLimiter + Send + Sync + 'static>(
    name: &'static str,
    kind: Kind,
    l: L,
) -> Subject {
    subject(name, kind, move |iters| {
        let mut ok = 0;
        for _ in 0..iters {
            ok += black_box(&l).check().is_allowed() as u64;
        }
        ok
    })
}

fn deny_loop<L: RateLimiter + Send + Sync + 'static>(
    name: &'static str,
    kind: Kind,
    l: L,
    read_retry: bool,
) -> Subject {
    let _ = l.check(); // drain the one token
    // Two loops, so that the one that reads only the verdict builds none of the figures.
    if read_retry {
        subject(name, kind, move |iters| {
            let mut ok = 0;
            for _ in 0..iters {
                let d = black_box(&l).check();
                // The caller reads the retry-after, as a 429 response does.
                black_box(d.retry_after());
                ok += d.is_allowed() as u64;
            }
            ok
        })
    } else {
        subject(name, kind, move |iters| {
            let mut ok = 0;
            for _ in 0..iters {
                ok += black_box(&l).check().is_allowed() as u64;
            }
            ok
        })
    }
}

/// `Reconfigurable<GcraAlgorithm>` on quanta's clock, as `Gcra::new` builds its limiter: checked
/// through the same loops as `Gcra`, so that the two differ only in the check.
fn reconfigurable(q: Quota) -> Reconfigurable<GcraAlgorithm, QuantaClock> {
    Reconfigurable::new(q)
}

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

/// governor's coarse clock (quanta's "recent" time, 1 ms upkeep). quanta runs one upkeep thread
/// per process and governor's constructor fails once it runs, so the clock is made once and cloned.
pub fn governor_coarse_clock() -> governor::clock::QuantaUpkeepClock {
    static CLOCK: std::sync::OnceLock<governor::clock::QuantaUpkeepClock> =
        std::sync::OnceLock::new();
    CLOCK
        .get_or_init(|| {
            governor::clock::QuantaUpkeepClock::from_interval(Duration::from_millis(1))
                .expect("quanta's upkeep thread is started here first")
        })
        .clone()
}

/// quanta's "recent" time, read as governor's coarse clock reads it (a call into quanta, then a
/// `Duration` made and turned back into nanoseconds): `Gcra` on it, against governor's coarse
/// check, compares the two checks alone, each with the same clock read.
#[derive(Debug, Clone)]
pub struct QuantaRecent {
    clock: quanta::Clock,
    origin: quanta::Instant,
}

impl Default for QuantaRecent {
    /// On the upkeep thread governor's coarse clock started.
    fn default() -> QuantaRecent {
        let _ = governor_coarse_clock();
        let clock = quanta::Clock::new();
        let origin = clock.recent();
        QuantaRecent { clock, origin }
    }
}

impl atomic_limiter::Clock for QuantaRecent {
    #[inline]
    fn now(&self) -> u64 {
        let d = self.clock.recent().saturating_duration_since(self.origin);
        u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
    }

    fn resolution(&self) -> u64 {
        1_000_000
    }

    fn is_monotonic(&self) -> bool {
        true
    }

    fn now_fresh(&self) -> u64 {
        let d = self.clock.now().saturating_duration_since(self.origin);
        u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Our coarse clock (its own upkeep thread, 1 ms).
pub fn coarse() -> CoarseClock {
    CoarseClock::new()
}

/// A quota nothing hits: 10^9/s, the largest burst.
pub fn open_quota() -> Quota {
    Quota::per_second(1_000_000_000).with_burst(Quota::MAX_BURST)
}

/// The costs a check is made of.
pub fn floors() -> Vec<Subject> {
    let quanta = quanta::Clock::new();
    let q2 = quanta.clone();
    let q3 = quanta.clone();
    let ours = QuantaClock::new();
    let coarse = coarse();
    vec![
        subject("quanta Clock::now", Kind::Floor, move |iters| {
            for _ in 0..iters {
                black_box(quanta.now());
            }
            0
        }),
        subject("quanta Clock::raw", Kind::Floor, move |iters| {
            for _ in 0..iters {
                black_box(q2.raw());
            }
            0
        }),
        subject("quanta Clock::recent", Kind::Floor, move |iters| {
            for _ in 0..iters {
                black_box(q3.recent());
            }
            0
        }),
        subject("QuantaClock::now", Kind::Floor, move |iters| {
            use atomic_limiter::Clock;
            for _ in 0..iters {
                black_box(ours.now());
            }
            0
        }),
        subject("CoarseClock::now", Kind::Floor, move |iters| {
            use atomic_limiter::Clock;
            for _ in 0..iters {
                black_box(coarse.now());
            }
            0
        }),
        subject("std Instant::now", Kind::Floor, |iters| {
            for _ in 0..iters {
                black_box(Instant::now());
            }
            0
        }),
        {
            // The lookup a keyed check makes, on the maps a keyed limiter could sit on: one key
            // present, its value read. dashmap takes and releases a shard read lock (two atomic
            // RMWs); papaya and scc's HashIndex read without a lock, but enter and leave an
            // epoch-style guard per lookup (one RMW); papaya with a guard held across lookups
            // does no RMW at all.
            let m = dashmap::DashMap::with_hasher(ahash::RandomState::new());
            m.insert(1u64, AtomicU64::new(0));
            subject("dashmap get (aHash)", Kind::Floor, move |iters| {
                for _ in 0..iters {
                    black_box(m.get(black_box(&1)).map(|v| v.load(Ordering::Relaxed)));
                }
                0
            })
        },
        {
            let m = papaya::HashMap::with_hasher(ahash::RandomState::new());
            m.pin().insert(1u64, AtomicU64::new(0));
            subject("papaya pin + get (aHash)", Kind::Floor, move |iters| {
                for _ in 0..iters {
                    black_box(
                        m.pin()
                            .get(black_box(&1))
                            .map(|v| v.load(Ordering::Relaxed)),
                    );
                }
                0
            })
        },
        {
            let m = papaya::HashMap::with_hasher(ahash::RandomState::new());
            m.pin().insert(1u64, AtomicU64::new(0));
            subject(
                "papaya get, guard held (aHash)",
                Kind::Floor,
                move |iters| {
                    let guard = m.pin();
                    for _ in 0..iters {
                        black_box(guard.get(black_box(&1)).map(|v| v.load(Ordering::Relaxed)));
                    }
                    0
                },
            )
        },
        {
            let m = scc::HashIndex::with_hasher(ahash::RandomState::new());
            let _ = m.insert_sync(1u64, AtomicU64::new(0));
            subject(
                "scc HashIndex peek_with (aHash)",
                Kind::Floor,
                move |iters| {
                    for _ in 0..iters {
                        black_box(m.peek_with(black_box(&1), |_, v| v.load(Ordering::Relaxed)));
                    }
                    0
                },
            )
        },
        // What a token bucket's retry-after cannot do without: its wait is a count of units
        // divided by its rate (GCRA keeps the wait itself). Each division waits for the last.
        subject("u64 division, one after another", Kind::Floor, |iters| {
            let rate = black_box(0x0012_3456_789a_bcde_u64);
            let mut x = black_box(0x7fff_ffff_ffff_u64 << 12);
            for _ in 0..iters {
                x = x / rate + (1 << 63);
            }
            black_box(x);
            0
        }),
        subject("uncontended compare_exchange", Kind::Floor, |iters| {
            let word = AtomicU64::new(0);
            for i in 0..iters {
                let _ = black_box(&word).compare_exchange(
                    i,
                    i + 1,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            }
            0
        }),
    ]
}

/// GCRA's admission, the least a bucket that stores tokens can do, and the token bucket's: three
/// subjects measured back to back, so that their ratios come from the same moments of the host.
pub fn bucket_floor_subjects() -> Vec<Subject> {
    let q = open_quota();
    vec![
        allow_loop("Gcra", Kind::Ours, Gcra::new(q)),
        bare_bucket(),
        allow_loop("TokenBucket", Kind::Ours, TokenBucket::new(q)),
    ]
}

/// The least a token bucket of this crate's word can do on an admission of the open quota: tokens
/// and a tick stamp in one word, refilled by one multiply of the ticks elapsed, capped, one token
/// taken. No drift-free refill, no re-phase at the cap, no step-back handling: not a limiter one
/// could ship (it runs ahead of the exact quota), but what any bucket that stores tokens pays
/// over GCRA, which stores the wait itself.
fn bare_bucket() -> Subject {
    let clock = QuantaClock::new();
    let word = AtomicU64::new(0);
    // The open quota's: a token is 1024 units, a tick is 1 ns, 1024 units a tick (53 fraction
    // bits). Opaque, as a quota's rate is: a constant would turn the multiply into a shift.
    let rate = black_box(1u64 << 63);
    subject("a bare packed bucket", Kind::Floor, move |iters| {
        use atomic_limiter::Clock;
        // The layout is a constant here (a favour: the crate's depends on the quota).
        const TOKEN_BITS: u32 = 31;
        const TOKENS: u64 = (1 << TOKEN_BITS) - 1;
        const CAP: u64 = (Quota::MAX_BURST as u64) << 10;
        let mut ok = 0;
        for _ in 0..iters {
            let tick = black_box(&clock).now();
            let word = black_box(&word);
            let mut cur = word.load(Ordering::Relaxed);
            loop {
                let elapsed = tick.wrapping_sub(cur >> TOKEN_BITS) & (u64::MAX >> TOKEN_BITS);
                let refill = ((elapsed as u128 * rate as u128) >> 53) as u64;
                let held = (cur & TOKENS).saturating_add(refill).min(CAP);
                if held < 1 << 10 {
                    break;
                }
                let new = (tick << TOKEN_BITS) | (held - (1 << 10));
                match word.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => {
                        ok += 1;
                        break;
                    }
                    Err(seen) => cur = seen,
                }
            }
        }
        ok
    })
}

/// What a check on one word is made of, with nothing decided: a reading of `clock` and one CAS
/// on a word of the thread's own. No other thread touches the word, so with several threads it
/// is the most that any limiter reading this clock and changing a word of its own can serve.
fn own_word_floor<C: atomic_limiter::Clock + Send + Sync + 'static>(
    name: &'static str,
    clock: C,
) -> Subject {
    thread_local! {
        static WORD: AtomicU64 = const { AtomicU64::new(0) };
    }
    subject(name, Kind::Floor, move |iters| {
        WORD.with(|w| {
            let mut ok = 0;
            for _ in 0..iters {
                let now = black_box(&clock).now();
                // Relaxed, as a limiter's state word is changed: one word, no data published.
                let seen = w.load(Ordering::Relaxed);
                ok += u64::from(
                    w.compare_exchange(seen, now, Ordering::Relaxed, Ordering::Relaxed)
                        .is_ok(),
                );
            }
            ok
        })
    })
}

/// Every limiter on the allow path (a quota so large that nothing is denied), and the floor
/// under them.
pub fn allow_subjects() -> Vec<Subject> {
    let q = open_quota();
    let gov_q = governor::Quota::per_second(nz(1_000_000_000));
    vec![
        own_word_floor("floor: clock read + CAS, own word", QuantaClock::new()),
        own_word_floor("floor: CoarseClock read + CAS, own word", coarse()),
        allow_loop("Gcra", Kind::Ours, Gcra::new(q)),
        allow_loop("Reconfigurable<Gcra>", Kind::Ours, reconfigurable(q)),
        allow_loop("TokenBucket", Kind::Ours, TokenBucket::new(q)),
        allow_loop("Sharded<Gcra>", Kind::Ours, Sharded::gcra(q)),
        allow_loop(
            "Gcra + CoarseClock",
            Kind::Ours,
            Gcra::with_clock(q, coarse()),
        ),
        allow_loop(
            "Gcra + quanta recent time (governor's coarse read)",
            Kind::Ours,
            Gcra::with_clock(q, QuantaRecent::default()),
        ),
        allow_loop(
            "Sharded<Gcra> + CoarseClock",
            Kind::Ours,
            Sharded::gcra_with_clock(q, Sharded::<Gcra>::default_shard_count(), coarse()),
        ),
        allow_loop(
            "FixedWindow",
            Kind::Ours,
            atomic_limiter::FixedWindow::with_clock(
                Quota::per_second(1_000_000_000),
                QuantaClock::new(),
            )
            .unwrap(),
        ),
        allow_loop(
            "MutexFixedWindow (std)",
            Kind::Mutex,
            atomic_limiter::baseline::MutexFixedWindow::<QuantaClock>::with_clock(
                Quota::per_second(1_000_000_000),
                QuantaClock::new(),
            )
            .unwrap(),
        ),
        allow_loop(
            "MutexSlidingWindowCounter (std)",
            Kind::Mutex,
            atomic_limiter::baseline::MutexSlidingWindowCounter::<QuantaClock>::with_clock(
                Quota::try_new(1_000_000, Duration::from_millis(1), 1).unwrap(),
                QuantaClock::new(),
            )
            .unwrap(),
        ),
        allow_loop(
            "SlidingWindowLog (mutex)",
            Kind::Mutex,
            atomic_limiter::SlidingWindowLog::with_clock(
                Quota::try_new(1_000_000, Duration::from_millis(1), 1).unwrap(),
                QuantaClock::new(),
            )
            .unwrap(),
        ),
        allow_loop(
            "SlidingWindowCounter",
            Kind::Ours,
            atomic_limiter::SlidingWindowCounter::with_clock(
                Quota::try_new(1_000_000, Duration::from_millis(1), 1).unwrap(),
                QuantaClock::new(),
            )
            .unwrap(),
        ),
        allow_loop(
            "MutexTokenBucket (std)",
            Kind::Mutex,
            MutexTokenBucket::<QuantaClock>::new(q),
        ),
        allow_loop(
            "MutexTokenBucket (parking_lot)",
            Kind::Mutex,
            MutexTokenBucket::<QuantaClock, PlMutex<TextbookBucket>>::new(q),
        ),
        allow_loop(
            "MutexTokenBucket (std) + CoarseClock",
            Kind::Mutex,
            MutexTokenBucket::<CoarseClock>::with_clock(q, coarse()),
        ),
        allow_loop(
            "MutexGcra (std)",
            Kind::Mutex,
            MutexGcra::<QuantaClock>::new(q),
        ),
        // The textbook exactly as the articles write it: the OS monotonic clock under the lock.
        allow_loop(
            "MutexTokenBucket (std, Instant)",
            Kind::Mutex,
            MutexTokenBucket::<atomic_limiter::StdClock>::with_clock(
                q,
                atomic_limiter::StdClock::new(),
            ),
        ),
        {
            let g = governor::RateLimiter::direct(gov_q);
            subject("governor check", Kind::Peer, move |iters| {
                let mut ok = 0;
                for _ in 0..iters {
                    ok += black_box(&g).check().is_ok() as u64;
                }
                ok
            })
        },
        {
            let g = governor::RateLimiter::direct_with_clock(gov_q, governor_coarse_clock());
            subject("governor check + coarse clock", Kind::Peer, move |iters| {
                let mut ok = 0;
                for _ in 0..iters {
                    ok += black_box(&g).check().is_ok() as u64;
                }
                ok
            })
        },
        {
            let g = governor::RateLimiter::direct(gov_q);
            subject("governor check_n(1)", Kind::Peer, move |iters| {
                let mut ok = 0;
                for _ in 0..iters {
                    ok += matches!(black_box(&g).check_n(nz(1)), Ok(Ok(()))) as u64;
                }
                ok
            })
        },
        {
            let r = ratelimit::Ratelimiter::builder(1_000_000_000)
                .max_tokens(1_000_000_000)
                .initial_available(1_000_000_000)
                .build()
                .unwrap();
            subject("ratelimit try_wait", Kind::Peer, move |iters| {
                let mut ok = 0;
                for _ in 0..iters {
                    ok += black_box(&r).try_wait().is_ok() as u64;
                }
                ok
            })
        },
    ]
}

/// Every limiter on the deny path (exhausted: one per hour, drained). With `read_retry`, the
/// caller also reads when to retry from each denial (governor needs a second clock read for it).
pub fn deny_subjects(read_retry: bool) -> Vec<Subject> {
    let q = Quota::per_hour(1);
    let gov_q = governor::Quota::per_hour(nz(1));
    let mut v = vec![
        deny_loop("Gcra", Kind::Ours, Gcra::new(q), read_retry),
        deny_loop(
            "Reconfigurable<Gcra>",
            Kind::Ours,
            reconfigurable(q),
            read_retry,
        ),
        deny_loop(
            "Gcra + CoarseClock",
            Kind::Ours,
            Gcra::with_clock(q, coarse()),
            read_retry,
        ),
        deny_loop("TokenBucket", Kind::Ours, TokenBucket::new(q), read_retry),
        deny_loop(
            "TokenBucket + CoarseClock",
            Kind::Ours,
            TokenBucket::with_clock(q, coarse()),
            read_retry,
        ),
        deny_loop(
            "MutexTokenBucket (std)",
            Kind::Mutex,
            MutexTokenBucket::<QuantaClock>::new(q),
            read_retry,
        ),
    ];
    if read_retry {
        use governor::clock::Clock as _;
        let g = governor::RateLimiter::direct(gov_q);
        let clock = governor::clock::DefaultClock::default();
        let _ = g.check();
        v.push(subject(
            "governor check + wait_time_from",
            Kind::Peer,
            move |iters| {
                let mut ok = 0;
                for _ in 0..iters {
                    match black_box(&g).check() {
                        Ok(()) => ok += 1,
                        Err(not_until) => {
                            black_box(not_until.wait_time_from(clock.now()));
                        }
                    }
                }
                ok
            },
        ));
    } else {
        // The same refusals on a quota of 100 a second: drained, the bucket is refilling on
        // every check (an hour's quota leaves its stamp ahead, nothing refilled, for the first
        // seconds after the drain), and its ticks of 8 us are shorter than a coarse clock's lag,
        // so that a coarse denial is carried across ticks to the fresh reading.
        let q = Quota::per_second(100).with_burst(1);
        v.extend([
            deny_loop("Gcra, 100/s", Kind::Ours, Gcra::new(q), false),
            deny_loop("TokenBucket, 100/s", Kind::Ours, TokenBucket::new(q), false),
            deny_loop(
                "Gcra + CoarseClock, 100/s",
                Kind::Ours,
                Gcra::with_clock(q, coarse()),
                false,
            ),
            deny_loop(
                "TokenBucket + CoarseClock, 100/s",
                Kind::Ours,
                TokenBucket::with_clock(q, coarse()),
                false,
            ),
        ]);
        let g = governor::RateLimiter::direct(gov_q);
        let _ = g.check();
        v.push(subject("governor check", Kind::Peer, move |iters| {
            let mut ok = 0;
            for _ in 0..iters {
                ok += black_box(&g).check().is_ok() as u64;
            }
            ok
        }));
    }
    let r = ratelimit::Ratelimiter::builder(1)
        .period(Duration::from_secs(3600))
        .max_tokens(1)
        .initial_available(0)
        .build()
        .unwrap();
    // ratelimit computes its wait on every denial, read or not.
    v.push(subject("ratelimit try_wait", Kind::Peer, move |iters| {
        let mut ok = 0;
        for _ in 0..iters {
            match black_box(&r).try_wait() {
                Ok(()) => ok += 1,
                Err(e) => {
                    black_box(e);
                }
            }
        }
        ok
    }));
    v
}

/// Times `iters` operations of `s` on `threads` threads at once (each doing `iters`); returns the
/// wall time.
pub fn run_threads(s: &Subject, threads: usize, iters: u64) -> Duration {
    if threads == 1 {
        let t = Instant::now();
        black_box((s.run)(iters));
        return t.elapsed();
    }
    let barrier = std::sync::Barrier::new(threads + 1);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    barrier.wait();
                    black_box((s.run)(iters));
                })
            })
            .collect();
        barrier.wait();
        let t = Instant::now();
        for h in handles {
            h.join().unwrap();
        }
        t.elapsed()
    })
}

/// The throttle's reservation (a quota nothing queues on), lock-free and behind a mutex.
pub fn throttle_subjects() -> Vec<Subject> {
    let q = open_quota();
    let free = atomic_limiter::Throttle::with_clock(q, QuantaClock::new());
    let locked =
        atomic_limiter::baseline::MutexThrottle::<QuantaClock>::with_clock(q, QuantaClock::new());
    vec![
        subject("Throttle reserve", Kind::Ours, move |iters| {
            let mut ok = 0;
            for _ in 0..iters {
                ok += black_box(&free).reserve(Duration::ZERO).is_ok() as u64;
            }
            ok
        }),
        subject("MutexThrottle reserve (std)", Kind::Mutex, move |iters| {
            let mut ok = 0;
            for _ in 0..iters {
                ok += black_box(&locked).reserve(Duration::ZERO).is_ok() as u64;
            }
            ok
        }),
    ]
}
