//! A counting global allocator shows that a check allocates nothing, allowed or denied.
// A counting global allocator is an `unsafe impl`: the crate denies `unsafe` elsewhere.
#![allow(unsafe_code)]

use atomic_limiter::{Gcra, ManualClock, Quota, RateLimiter, StdClock, TokenBucket};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: defers every call to the system allocator unchanged; only counts, per thread, in a
// const-initialised thread-local that itself never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc` is passed on as is.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_during(f: impl FnOnce()) -> u64 {
    let before = ALLOCATIONS.with(Cell::get);
    f();
    ALLOCATIONS.with(Cell::get) - before
}

fn exercise(limiter: &impl RateLimiter, clock: &ManualClock) {
    for i in 0..10_000u64 {
        let d = limiter.check();
        // The figures are computed without allocating too.
        std::hint::black_box((d.remaining(), d.retry_after(), d.reset_after()));
        let _ = std::hint::black_box(limiter.check_n((i % 4) as u32));
        let _ = std::hint::black_box(limiter.check_n(u32::MAX));
        clock.advance_nanos(i % 3 * 1_000_000);
    }
}

#[test]
fn checks_do_not_allocate() {
    let clock = ManualClock::new();
    let quota = Quota::per_second(100).with_burst(10);
    let gcra = Gcra::with_clock(quota, clock.clone());
    let bucket = TokenBucket::with_clock(quota, clock.clone());
    assert_eq!(allocations_during(|| exercise(&gcra, &clock)), 0, "gcra");
    assert_eq!(
        allocations_during(|| exercise(&bucket, &clock)),
        0,
        "bucket"
    );

    let real = Gcra::with_clock(quota, StdClock::new());
    let quanta = TokenBucket::new(quota);
    let n = allocations_during(|| {
        for _ in 0..10_000 {
            let _ = std::hint::black_box(real.check());
            let _ = std::hint::black_box(quanta.check());
        }
    });
    assert_eq!(n, 0, "real clocks");

    // A `String`-keyed limiter checked with `&str`: a held key's check allocates nothing.
    let keyed = atomic_limiter::Keyed::gcra_with_clock(quota, 100, clock.clone());
    assert!(keyed.check_key::<str>("alice").is_allowed());
    let n = allocations_during(|| {
        for i in 0..10_000u64 {
            let _ = std::hint::black_box(keyed.check_key("alice"));
            clock.advance_nanos(i % 3 * 1_000_000);
        }
    });
    assert_eq!(n, 0, "keyed by &str");
    let _: &atomic_limiter::Keyed<String, Gcra<ManualClock>> = &keyed;

    // The counter works: a Vec allocates.
    assert!(allocations_during(|| drop(std::hint::black_box(vec![1u8; 64]))) > 0);
}
