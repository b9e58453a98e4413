//! Runs N checks of one limiter (allowed, or denied for the `-deny` subjects) in a loop that
//! callgrind can isolate: the count of instructions per check, stable where timings are noisy.
//! Driven by `scripts/instructions.sh`.
//!
//! `cargo run --release --example instructions -- <gcra|token-bucket|gcra-deny|token-bucket-deny|gcra-deny-retry|token-bucket-deny-retry|gcra-coarse-deny|token-bucket-coarse-deny|token-bucket-deny-100|gcra-coarse-deny-100|token-bucket-coarse-deny-100|mutex-bucket|mutex-gcra|governor|reconfigurable|keyed|keyed-floor|keyed-lock-free|keyed-pinned|keyed-pinned-one-key|governor-keyed|quanta-now> [N]`

use atomic_limiter::algorithm::GcraAlgorithm;
use atomic_limiter::baseline::{MutexGcra, MutexTokenBucket};
use atomic_limiter::keyed::{KeyHasher, LockFreeStore};
use atomic_limiter::{
    Clock, CoarseClock, Gcra, KeyQuotas, Keyed, QuantaClock, Quota, RateLimiter, Reconfigurable,
    TokenBucket,
};
use std::hint::black_box;
use std::num::NonZeroU32;

#[inline(never)]
fn measured_loop<F: FnMut() -> bool>(n: u64, mut check: F) -> u64 {
    let mut ok = 0;
    for _ in 0..n {
        ok += check() as u64;
    }
    ok
}

/// One an hour: drained by its first check, so every measured check is a denial.
fn drained() -> Quota {
    Quota::per_hour(1)
}

/// A hundred a second, one at a time: drained by its first check, then refilling on every
/// check (an hour's quota leaves the bucket's stamp ahead of the clock for seconds after the
/// drain), with ticks of 8 us, shorter than a coarse clock's lag.
fn refilling() -> Quota {
    Quota::per_second(100).with_burst(1)
}

fn deny<L: RateLimiter>(l: L, n: u64) -> u64 {
    let _ = l.check();
    measured_loop(n, || black_box(&l).check().is_allowed())
}

/// [`deny`], each denial's retry-after read, as a 429 response does.
fn deny_retry<L: RateLimiter>(l: L, n: u64) -> u64 {
    let _ = l.check();
    measured_loop(n, || {
        let d = black_box(&l).check();
        black_box(d.retry_after());
        d.is_allowed()
    })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let which = args.first().map(String::as_str).unwrap_or("gcra");
    let n: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let q = Quota::per_second(1_000_000_000).with_burst(Quota::MAX_BURST);
    let ok = match which {
        "gcra" => {
            let l = Gcra::new(q);
            measured_loop(n, || black_box(&l).check().is_allowed())
        }
        "token-bucket" => {
            let l = TokenBucket::new(q);
            measured_loop(n, || black_box(&l).check().is_allowed())
        }
        "gcra-deny" => deny(Gcra::new(drained()), n),
        "token-bucket-deny" => deny(TokenBucket::new(drained()), n),
        "gcra-deny-retry" => deny_retry(Gcra::new(drained()), n),
        "token-bucket-deny-retry" => deny_retry(TokenBucket::new(drained()), n),
        "gcra-coarse-deny" => deny(Gcra::with_clock(drained(), CoarseClock::new()), n),
        "token-bucket-coarse-deny" => {
            deny(TokenBucket::with_clock(drained(), CoarseClock::new()), n)
        }
        "token-bucket-deny-100" => deny(TokenBucket::new(refilling()), n),
        "gcra-coarse-deny-100" => deny(Gcra::with_clock(refilling(), CoarseClock::new()), n),
        "token-bucket-coarse-deny-100" => {
            deny(TokenBucket::with_clock(refilling(), CoarseClock::new()), n)
        }
        "mutex-bucket" => {
            let l = MutexTokenBucket::<QuantaClock>::new(q);
            measured_loop(n, || black_box(&l).check().is_allowed())
        }
        "mutex-gcra" => {
            let l = MutexGcra::<QuantaClock>::new(q);
            measured_loop(n, || black_box(&l).check().is_allowed())
        }
        "governor" => {
            let l = governor::RateLimiter::direct(governor::Quota::per_second(
                NonZeroU32::new(1_000_000_000).unwrap(),
            ));
            measured_loop(n, || black_box(&l).check().is_ok())
        }
        "reconfigurable" => {
            let l: Reconfigurable<GcraAlgorithm, QuantaClock> = Reconfigurable::new(q);
            measured_loop(n, || black_box(&l).check().is_allowed())
        }
        "keyed-floor" => {
            // The least an atomic check does on the default store: the clock read, dashmap's
            // lookup of the key's word and one CAS on it (`compare`'s keyed floor).
            let clock = QuantaClock::new();
            let words = dashmap::DashMap::with_hasher(KeyHasher::new());
            for k in 0..1024u64 {
                words.insert(k, std::sync::atomic::AtomicU64::new(0));
            }
            let mut k = 0u64;
            measured_loop(n, || {
                use std::sync::atomic::Ordering;
                k = (k + 1) & 1023;
                black_box(&words).get(&k).is_some_and(|w| {
                    let now = clock.now();
                    let seen = w.load(Ordering::Acquire);
                    w.compare_exchange(seen, now, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                })
            })
        }
        "keyed" => {
            let l = atomic_limiter::Keyed::<u64, Gcra>::gcra(q, 1 << 20);
            for k in 0..1024u64 {
                let _ = l.check_key(&k);
            }
            let mut k = 0u64;
            measured_loop(n, || {
                k = (k + 1) & 1023;
                black_box(&l).check_key(&k).is_allowed()
            })
        }
        "keyed-lock-free" | "keyed-pinned" | "keyed-pinned-one-key" => {
            let clock = QuantaClock::new();
            let l = Keyed::with_store(
                LockFreeStore::with_hasher(KeyHasher::new()),
                1 << 20,
                KeyQuotas::Every(q),
                move |q| Gcra::with_clock(q, clock.clone()),
            );
            for k in 0..1024u64 {
                let _ = l.check_key(&k);
            }
            let mut k = 0u64;
            if which != "keyed-lock-free" {
                // The one-key run checks key 0 throughout: the handle's run of one key.
                let mask = if which == "keyed-pinned" { 1023 } else { 0 };
                let mut pinned = black_box(&l).pinned();
                measured_loop(n, || {
                    k = (k + 1) & mask;
                    pinned.check_key(&k).is_allowed()
                })
            } else {
                measured_loop(n, || {
                    k = (k + 1) & 1023;
                    black_box(&l).check_key(&k).is_allowed()
                })
            }
        }
        "governor-keyed" => {
            let l = governor::RateLimiter::keyed(
                governor::Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap())
                    .allow_burst(NonZeroU32::new(Quota::MAX_BURST).unwrap()),
            );
            for k in 0..1024u64 {
                let _ = l.check_key(&k);
            }
            let mut k = 0u64;
            measured_loop(n, || {
                k = (k + 1) & 1023;
                black_box(&l).check_key(&k).is_ok()
            })
        }
        "quanta-now" => {
            let c = quanta::Clock::new();
            let zero = c.now();
            measured_loop(n, || black_box(c.now()) != zero)
        }
        other => {
            eprintln!("unknown subject {other}");
            std::process::exit(2);
        }
    };
    println!("{which}: {ok} of {n} allowed");
}
