//! Prints each limiter's horizons for a few quotas: the numbers in `docs/design.md`.
//!
//! `cargo run --example horizons`

use atomic_limiter::{Gcra, ManualClock, Quota, StdClock, TokenBucket};
use std::time::Duration;

fn human(d: Duration) -> String {
    let s = d.as_secs_f64();
    match s {
        s if s >= 365.0 * 86_400.0 => format!("{:.1} years", s / (365.0 * 86_400.0)),
        s if s >= 86_400.0 => format!("{:.1} days", s / 86_400.0),
        s if s >= 3600.0 => format!("{:.1} h", s / 3600.0),
        s if s >= 1.0 => format!("{s:.1} s"),
        _ => format!("{d:?}"),
    }
}

fn main() {
    let quotas = [
        ("per_second(1)", Quota::per_second(1)),
        (
            "per_second(100).with_burst(10)",
            Quota::per_second(100).with_burst(10),
        ),
        (
            "per_second(1000).with_burst(1024)",
            Quota::per_second(1000).with_burst(1024),
        ),
        (
            "per_second(1000).with_burst(2^20)",
            Quota::per_second(1000).with_burst(1 << 20),
        ),
        ("per_second(3)", Quota::per_second(3)),
        (
            "per_second(7_000_000).with_burst(20)",
            Quota::per_second(7_000_000).with_burst(20),
        ),
        (
            "per_second(10^9).with_burst(64)",
            Quota::per_second(1_000_000_000).with_burst(64),
        ),
        ("per_minute(7)", Quota::per_minute(7)),
        ("per_second(1_000_000)", Quota::per_second(1_000_000)),
        ("per_second(10^9)", Quota::per_second(1_000_000_000)),
    ];
    println!(
        "| quota | GCRA horizon | bucket tick | bucket idle horizon: monotonic clock / any clock | bucket backward tolerance: monotonic / any |"
    );
    println!("|---|---|---|---|---|");
    for (name, q) in quotas {
        let g = Gcra::with_clock(q, ManualClock::new());
        // StdClock (like the default QuantaClock) is monotonic; ManualClock may step back.
        let m = TokenBucket::with_clock(q, StdClock::new());
        let b = TokenBucket::with_clock(q, ManualClock::new());
        println!(
            "| `{name}` | {} | {:?} | {} / {} | {} / {} |",
            human(g.horizon()),
            b.tick(),
            human(m.idle_horizon()),
            human(b.idle_horizon()),
            human(m.backward_tolerance()),
            human(b.backward_tolerance())
        );
    }
}
