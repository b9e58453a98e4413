//! Runs N admitted requests through one of `http_compare`'s subjects in a loop that callgrind can
//! isolate: instructions per request, stable where timings are noisy. Every subject builds the
//! same request, so a subject's count less that of "no layer" is its layer's own.
//!
//! `cargo build --release --example http_instructions --features tower,axum`, then
//! `valgrind --tool=callgrind --toggle-collect='*measured_loop*' target/release/examples/http_instructions <subject> 20000`,
//! the subject one of 0 (no layer), 1 (atomic-limiter), 2 (tower_governor), 3 (the floor),
//! 4 (atomic-limiter on the lock-free store), 5 (atomic-limiter on the coarse clock).

#[path = "../benches/http/subjects.rs"]
mod subjects;

use std::hint::black_box;
use subjects::{CASES, request, subjects};

#[inline(never)]
fn measured_loop(n: u32, subject: &mut dyn FnMut(u32) -> u16) -> u64 {
    let mut ok = 0;
    for i in 0..n {
        ok += u64::from(black_box(subject(i)) == 200);
    }
    ok
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let which: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(1);
    let n: u32 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(20_000);
    // The first case: admitted, at the default client count.
    let (path, clients) = CASES[0];
    let mut subjects = subjects(path, clients);
    let Some((name, subject)) = subjects.get_mut(which) else {
        eprintln!("no subject {which}: 0 to {}", subjects.len() - 1);
        std::process::exit(2);
    };
    let ok = measured_loop(n, &mut |i| subject(request(i % clients)));
    println!("{name}, {}: {ok} of {n} admitted", path.name());
}
