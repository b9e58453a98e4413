//! A limiter admitting a burst, denying with a retry-after, and recovering, on the real clock.
//!
//! `cargo run --release --example quickstart`

use atomic_limiter::{Gcra, Quota, TokenBucket};
use std::thread::sleep;
use std::time::{Duration, Instant};

fn main() {
    // 20 requests per second, at most 5 at once.
    let quota = Quota::per_second(20).with_burst(5);
    let limiter = Gcra::new(quota);
    let start = Instant::now();
    let stamp = || format!("{:>7.1} ms", start.elapsed().as_secs_f64() * 1e3);

    println!(
        "quota: 20/s, burst 5 (one token every {:?})\n",
        quota.period()
    );
    println!("a burst of 8 requests at once:");
    for i in 1..=8 {
        let d = limiter.check();
        if d.is_allowed() {
            println!("  {} request {i}: allowed, {} left", stamp(), d.remaining());
        } else {
            println!(
                "  {} request {i}: 429, Retry-After {:?}, full again in {:?}",
                stamp(),
                d.retry_after(),
                d.reset_after()
            );
        }
    }

    let d = limiter.check();
    println!("\nwaiting the advertised {:?} ...", d.retry_after());
    sleep(d.retry_after());
    let d = limiter.check();
    println!("  {} retried: {}", stamp(), verdict(d.is_allowed()));

    println!("\nwaiting until full ({:?}) ...", d.reset_after());
    sleep(d.reset_after());
    let d = limiter.check_n(5).expect("5 <= burst");
    println!("  {} 5 at once: {}", stamp(), verdict(d.is_allowed()));

    println!("\nsteady load of 100 checks over 1 s (about 20 pass, plus the burst):");
    let bucket = TokenBucket::new(quota);
    let t0 = Instant::now();
    let mut allowed = 0;
    while t0.elapsed() < Duration::from_secs(1) {
        allowed += bucket.check().is_allowed() as u32;
        sleep(Duration::from_millis(10));
    }
    println!("  token bucket admitted {allowed}");
}

fn verdict(allowed: bool) -> &'static str {
    if allowed { "allowed" } else { "denied" }
}
