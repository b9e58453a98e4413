//! What a keyed check over 100 000 keys is made of, rung by rung, in one process: the clock read,
//! a bare table of 16-byte slots (a key and its word, probed slot by slot), a bare table laid out
//! as the default store's (tags apart, eight to a word, and 32-byte slots), the default store's
//! own lookup, the whole `Keyed<u64, Gcra>` check, and governor's keyed check. Each rung sends
//! for what it reads first before it reads the clock, as the default store does, and ends in one
//! CAS on the key's word; the bare tables decide nothing and never grow, move or free a key.
//!
//! The differences between rungs are the costs of the store's layout against slots of the least
//! size probed one by one (below zero where the layout is the faster), of the store's machinery
//! (its check section, its table pointer, the retired flag) and of the check's own work (the
//! guard against a change of quota, the GCRA step, the decision).
//!
//! `cargo run --release --example keyed_anatomy`
// The prefetch the rungs send for a slot with, as the default store does; each block argued.
#![allow(unsafe_code)]

// The benchmarks' subjects, for their keyed helpers only: the rest (a re-export among it) unused.
#[allow(unused_imports)]
#[path = "../benches/subjects.rs"]
mod subjects;

use atomic_limiter::keyed::{FlatStore, KeyHasher, KeyedStore};
use atomic_limiter::{Clock, Keyed, QuantaClock};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use subjects::keyed::{Word, governor_open_quota, shuffled, take_word};
use subjects::open_quota;

const KEYS: u64 = 100_000;
/// The default store's table for 100 000 keys: the smallest power of two that holds them in
/// seven eighths of its slots.
const SLOTS: usize = 1 << 17;
/// Timed passes over the keys per rung and round; the fastest counts.
const PASSES: usize = 15;

/// Sends for the cache line at `p`, as the default store sends for a key's tags.
#[inline(always)]
fn prefetch<T>(p: &T) {
    prefetch_lines(p, 1);
}

/// Sends for `lines` cache lines from the one at `p` on, as the default store sends for the line
/// of a key's home slot and the two after it. A hint's address is never read, so one past a
/// table's end is harmless.
#[inline(always)]
fn prefetch_lines<T>(p: &T, lines: usize) {
    let p: *const u8 = std::ptr::from_ref(p).cast();
    for line in 0..lines {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch reads nothing the program can see and faults on no address; SSE,
        // which it needs, is part of every x86-64 target.
        unsafe {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * line).cast());
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (p, line);
    }
}

/// A key and its word: the least a slot holds.
#[repr(align(16))]
struct Slot16 {
    key: AtomicU64,
    word: AtomicU64,
}

/// The default store's slot of a `u64` key: the key, the word, the key's limiter and the retired
/// flag (its tag is kept apart).
#[repr(align(32))]
struct Slot32 {
    key: AtomicU64,
    word: AtomicU64,
    _limiter: usize,
    _retired: bool,
}

/// An empty `Slot16`.
const VACANT: u64 = u64::MAX;

/// The live tag of a key of hash `hash`, as the default store writes it.
fn tag(hash: u64) -> u64 {
    (hash >> 57) | 0x80
}

/// Each byte's low and high bits, for the probe of a word of eight tags.
const LOW: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

/// Nanoseconds per check of `check` over `order`: the fastest of `PASSES` passes, after one
/// untimed pass that brings its table back into the caches the other rungs used.
fn time(order: &[u64], check: &dyn Fn(u64) -> bool) -> f64 {
    let mut admitted = 0u64;
    for &k in order {
        admitted += u64::from(check(k));
    }
    let mut best = f64::MAX;
    for _ in 0..PASSES {
        let start = Instant::now();
        for &k in order {
            admitted += u64::from(check(black_box(k)));
        }
        best = best.min(start.elapsed().as_nanos() as f64 / order.len() as f64);
    }
    black_box(admitted);
    best
}

fn main() {
    let hasher = KeyHasher::new();
    let clock = QuantaClock::new();
    let created = shuffled(0, KEYS, 0x2545_f491_4f6c_dd1d);
    let order = shuffled(0, KEYS, 0x9e37_79b9_7f4a_7c15);
    let mask = SLOTS - 1;

    let small: Box<[Slot16]> = (0..SLOTS)
        .map(|_| Slot16 {
            key: AtomicU64::new(VACANT),
            word: AtomicU64::new(0),
        })
        .collect();
    let tags: Box<[AtomicU64]> = (0..SLOTS / 8).map(|_| AtomicU64::new(0)).collect();
    let wide: Box<[Slot32]> = (0..SLOTS)
        .map(|_| Slot32 {
            key: AtomicU64::new(0),
            word: AtomicU64::new(0),
            _limiter: 0,
            _retired: false,
        })
        .collect();
    let store: FlatStore<u64, Word> = FlatStore::with_hasher(KeyHasher::new());
    let keyed = Keyed::gcra_with_clock(open_quota(), 1 << 20, clock.clone());
    let governor = governor::RateLimiter::keyed(governor_open_quota());
    // Relaxed: one thread fills the tables before any rung runs.
    for &k in &created {
        let hash = hasher.hash_one(k);
        let mut i = hash as usize & mask;
        while small[i].key.load(Ordering::Relaxed) != VACANT {
            i = (i + 1) & mask;
        }
        small[i].key.store(k, Ordering::Relaxed);
        let mut i = hash as usize & mask;
        while (tags[i / 8].load(Ordering::Relaxed) >> (8 * (i % 8))) & 0xFF != 0 {
            i = (i + 1) & mask;
        }
        wide[i].key.store(k, Ordering::Relaxed);
        tags[i / 8].fetch_or(tag(hash) << (8 * (i % 8)), Ordering::Relaxed);
        store.with_inserted(k, || Word(AtomicU64::new(0)), |_, _| ());
        let _ = keyed.check_key(&k);
        let _ = governor.check_key(&k);
    }

    // Every key is in every table, so each probe ends at its key.
    let rungs: [(&str, &dyn Fn(u64) -> bool); 6] = [
        ("the clock read alone", &|k| black_box(clock.now() ^ k) != 0),
        ("bare 16-byte slots: clock + probe + CAS", &|k| {
            let mut i = hasher.hash_one(k) as usize & mask;
            prefetch_lines(&small[i], 3);
            let now = clock.now();
            loop {
                let slot = &small[i];
                // Acquire: as a store's lookup reads a slot's key.
                if slot.key.load(Ordering::Acquire) == k {
                    return take_word(&slot.word, now);
                }
                i = (i + 1) & mask;
            }
        }),
        ("bare, the store's layout: clock + probe + CAS", &|k| {
            let hash = hasher.hash_one(k);
            let wants = tag(hash) * LOW;
            let mut at = hash as usize & mask;
            prefetch(&tags[at / 8]);
            prefetch_lines(&wide[at], 3);
            let now = clock.now();
            loop {
                // Acquire: as the default store reads a word of tags.
                let x = tags[at / 8].load(Ordering::Acquire) ^ wants;
                // The slots from `at` on whose tags match (or match but for the lowest bit).
                let mut hits = x.wrapping_sub(LOW) & !x & HIGH & (!0u64 << (8 * (at % 8)));
                while hits != 0 {
                    let slot = &wide[(at & !7) + hits.trailing_zeros() as usize / 8];
                    // Relaxed: the key its tag published.
                    if slot.key.load(Ordering::Relaxed) == k {
                        return take_word(&slot.word, now);
                    }
                    hits &= hits - 1;
                }
                at = ((at | 7) + 1) & mask;
            }
        }),
        ("the default store's lookup: clock + CAS", &|k| {
            store
                .with_existing_after(&k, || clock.now(), |w, _, now| take_word(&w.0, now))
                .unwrap_or(false)
        }),
        ("Keyed<u64, Gcra>, the whole check", &|k| {
            keyed.check_key(&k).is_allowed()
        }),
        ("governor keyed check_key", &|k| {
            governor.check_key(&k).is_ok()
        }),
    ];
    let rounds = 3;
    let mut figures = vec![vec![]; rungs.len()];
    for round in 0..rounds {
        // Rotated, so that no rung always runs first.
        for j in 0..rungs.len() {
            let i = (j + round) % rungs.len();
            figures[i].push(time(&order, rungs[i].1));
        }
    }
    let best: Vec<f64> = figures
        .iter()
        .map(|f| f.iter().copied().fold(f64::MAX, f64::min))
        .collect();
    let [_, small_ns, layout_ns, store_ns, check_ns, gov_ns] = best[..] else {
        unreachable!("six rungs")
    };
    println!(
        "A keyed check over {KEYS} keys, one thread, keys in a scrambled order (ns per check,"
    );
    println!("the fastest of {rounds} rounds of {PASSES} passes; ratio: over governor's):");
    for ((name, _), (f, b)) in rungs.iter().zip(figures.iter().zip(&best)) {
        let rounds: Vec<String> = f.iter().map(|x| format!("{x:.1}")).collect();
        println!(
            "  {name:<46} {b:>6.1}  {:>5.2}x   rounds {}",
            b / gov_ns,
            rounds.join(" ")
        );
    }
    println!("Its parts:");
    for (part, ns) in [
        (
            "the store's layout against 16-byte slots",
            layout_ns - small_ns,
        ),
        ("the store's machinery", store_ns - layout_ns),
        ("the check's own work", check_ns - store_ns),
    ] {
        println!("  {part:<46} {ns:>6.1}");
    }
}
