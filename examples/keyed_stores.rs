//! The keyed stores side by side, alone in the process: the default (`FlatStore`), dashmap and the
//! lock-free store (the `papaya` feature), the same table on each, and governor's keyed limiter
//! beside them; keys visited in a scrambled order, one thread and two threads on distinct keys.
//!
//! `cargo run --release --example keyed_stores --features papaya`
use atomic_limiter::keyed::{KeyHasher, LockFreeStore};
use atomic_limiter::{Gcra, KeyQuotas, Keyed, QuantaClock, Quota};
use dashmap::DashMap;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Instant;

type Table<S> = Keyed<u64, Gcra<QuantaClock>, S>;

/// `count` keys below `keys`, scrambled (xorshift), on `thread`'s side of the key space.
fn order(keys: u64, count: usize, thread: u64) -> Vec<u64> {
    let mut x = 0x9e37_79b9_7f4a_7c15_u64 ^ thread;
    (0..count)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % keys) * 2 + thread
        })
        .collect()
}

/// Nanoseconds per check on one thread, and million checks per second on two, of the checks
/// `make` makes (one keyed check, answering whether it was admitted), one maker per thread.
fn measure<F: FnMut(&u64) -> bool>(make: &(impl Fn() -> F + Sync), keys: u64) -> (f64, f64) {
    let count = 1 << 20;
    let one = order(keys, count, 0);
    let mut check = make();
    let start = Instant::now();
    let mut ok = 0u64;
    for k in &one {
        ok += u64::from(check(black_box(k)));
    }
    black_box(ok);
    let per_check = start.elapsed().as_nanos() as f64 / count as f64;
    drop(check);
    let both = [order(keys, count, 0), order(keys, count, 1)];
    let start = Instant::now();
    std::thread::scope(|s| {
        for keys in &both {
            s.spawn(move || {
                let mut check = make();
                let mut ok = 0u64;
                for k in keys {
                    ok += u64::from(check(black_box(k)));
                }
                black_box(ok);
            });
        }
    });
    let mops = (2 * count) as f64 / start.elapsed().as_nanos() as f64 * 1000.0;
    (per_check, mops)
}

fn main() {
    let quota = Quota::per_second(1_000_000_000).with_burst(Quota::MAX_BURST);
    let nz = |n| NonZeroU32::new(n).unwrap();
    let gov_quota =
        governor::Quota::per_second(nz(1_000_000_000)).allow_burst(nz(Quota::MAX_BURST));
    println!("Keyed<u64, Gcra> on each store (the lock-free one also through a pinned handle, one");
    println!("per thread), and governor's keyed limiter (a quota nothing hits; ratio: the default");
    println!("store's time over governor's, its throughput over governor's):");
    for keys in [1u64, 100_000] {
        let clock = QuantaClock::new();
        let flat: Table<_> = Keyed::gcra_with_clock(quota, 1 << 24, clock.clone());
        let c = clock.clone();
        let dash = Keyed::with_store(
            DashMap::with_hasher(KeyHasher::new()),
            1 << 24,
            KeyQuotas::Every(quota),
            move |q| Gcra::with_clock(q, c.clone()),
        );
        let free = Keyed::with_store(
            LockFreeStore::with_hasher(KeyHasher::new()),
            1 << 24,
            KeyQuotas::Every(quota),
            move |q| Gcra::with_clock(q, clock.clone()),
        );
        let gov = governor::RateLimiter::keyed(gov_quota);
        for k in 0..2 * keys {
            let _ = flat.check_key(&k);
            let _ = dash.check_key(&k);
            let _ = free.check_key(&k);
            let _ = gov.check_key(&k);
        }
        // Each through `black_box`, so that no table is seen through.
        let flat_check = || {
            let t = black_box(&flat);
            move |k: &u64| t.check_key(k).is_allowed()
        };
        let dash_check = || {
            let t = black_box(&dash);
            move |k: &u64| t.check_key(k).is_allowed()
        };
        let free_check = || {
            let t = black_box(&free);
            move |k: &u64| t.check_key(k).is_allowed()
        };
        let pinned_check = || {
            let mut pinned = black_box(&free).pinned();
            move |k: &u64| pinned.check_key(k).is_allowed()
        };
        let gov_check = || {
            let gov = black_box(&gov);
            move |k: &u64| gov.check_key(k).is_ok()
        };
        println!("{keys} key(s): ns per check on one thread | million checks a second on two");
        for round in 0..3 {
            // Rotated, so that none always runs first.
            let mut figures = [(0.0, 0.0); 5];
            for i in 0..5 {
                let which = (i + round) % 5;
                figures[which] = match which {
                    0 => measure(&flat_check, keys),
                    1 => measure(&dash_check, keys),
                    2 => measure(&free_check, keys),
                    3 => measure(&pinned_check, keys),
                    _ => measure(&gov_check, keys),
                };
            }
            let [f, d, l, p, g] = figures;
            println!(
                "  default {:>5.1} dashmap {:>5.1} lock-free {:>5.1} pinned {:>5.1} governor {:>5.1} \
                 {:>5.2}x | default {:>5.1} dashmap {:>5.1} lock-free {:>5.1} pinned {:>5.1} \
                 governor {:>5.1} {:>5.2}x",
                f.0,
                d.0,
                l.0,
                p.0,
                g.0,
                f.0 / g.0,
                f.1,
                d.1,
                l.1,
                p.1,
                g.1,
                f.1 / g.1
            );
        }
    }
}
