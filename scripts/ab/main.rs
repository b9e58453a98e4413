//! The harness `scripts/ab.sh` builds: `base` is the revision, `head` the working tree.

use std::hint::black_box;
use std::time::Instant;

macro_rules! checks {
    ($name:ident, $krate:ident) => {
        #[inline(never)]
        fn $name<L: $krate::RateLimiter>(l: &L, iters: u64) -> u64 {
            let mut ok = 0;
            for _ in 0..iters {
                ok += black_box(l).check().is_allowed() as u64;
            }
            ok
        }
    };
}
checks!(base_checks, base);
checks!(head_checks, head);

macro_rules! keyed_checks {
    ($name:ident, $krate:ident) => {
        /// `iters` keyed checks over keys `0..keys`, in a scrambled order (xorshift).
        #[inline(never)]
        fn $name(t: &$krate::Keyed<u64, $krate::Gcra>, keys: u64, iters: u64) -> u64 {
            let (mut ok, mut x) = (0, 0x9e37_79b9_7f4a_7c15_u64);
            for _ in 0..iters {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ok += black_box(t).check_key(&(x % keys)).is_allowed() as u64;
            }
            ok
        }
    };
}
keyed_checks!(base_keyed, base);
keyed_checks!(head_keyed, head);

const BLOCK: u64 = 100_000;

fn timed(f: impl FnOnce() -> u64) -> f64 {
    let t = Instant::now();
    black_box(f());
    t.elapsed().as_nanos() as f64
}

/// Quartiles and median of `v`, sorted in place.
fn spread(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 4], v[v.len() / 2], v[3 * v.len() / 4])
}

/// Per round: GCRA (base) as the reference, then a block of the base subject's checks and one
/// of the head subject's, in alternating order.
/// Returns (base / GCRA, head / GCRA, head / base) per round.
fn rounds_of(
    n: usize,
    gcra: &impl base::RateLimiter,
    base_block: impl Fn() -> u64,
    head_block: impl Fn() -> u64,
) -> [Vec<f64>; 3] {
    let mut out = [vec![], vec![], vec![]];
    for i in 0..n {
        let g = timed(|| base_checks(gcra, BLOCK));
        let (ta, tb) = if i % 2 == 0 {
            let ta = timed(&base_block);
            (ta, timed(&head_block))
        } else {
            let tb = timed(&head_block);
            (timed(&base_block), tb)
        };
        out[0].push(ta / g);
        out[1].push(tb / g);
        out[2].push(tb / ta);
    }
    out
}

/// [`rounds_of`] for two limiters (the token buckets, or the two GCRAs).
fn rounds<A: base::RateLimiter, B: head::RateLimiter>(
    n: usize,
    gcra: &impl base::RateLimiter,
    a: &A,
    b: &B,
) -> [Vec<f64>; 3] {
    rounds_of(n, gcra, || base_checks(a, BLOCK), || head_checks(b, BLOCK))
}

/// [`rounds_of`] for two keyed tables over `keys` keys, all present before the first round. Over
/// 100 000 keys two identical builds differ by up to 15 % (where each table's memory lands):
/// read that row's quartiles, not its median alone.
fn keyed_rounds(n: usize, gcra: &impl base::RateLimiter, keys: u64) -> [Vec<f64>; 3] {
    let (rate, burst) = (1_000_000_000, base::Quota::MAX_BURST);
    let a = base::Keyed::gcra(base::Quota::per_second(rate).with_burst(burst), 1 << 24);
    let b = head::Keyed::gcra(head::Quota::per_second(rate).with_burst(burst), 1 << 24);
    for k in 0..keys {
        let _ = a.check_key(&k);
        let _ = b.check_key(&k);
    }
    rounds_of(
        n,
        gcra,
        || base_keyed(&a, keys, BLOCK),
        || head_keyed(&b, keys, BLOCK),
    )
}

fn report(what: &str, mut r: [Vec<f64>; 3]) {
    print!("  {what:<38}");
    for (name, v) in ["base/Gcra", "head/Gcra", "head/base"]
        .iter()
        .zip(r.iter_mut())
    {
        let (lo, mid, hi) = spread(v);
        print!("  {name} {mid:.3} [{lo:.3} {hi:.3}]");
    }
    println!();
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    // The admission: a quota nothing exhausts, the bucket at its cap on every check.
    let (rate, burst) = (1_000_000_000, base::Quota::MAX_BURST);
    let gcra = base::Gcra::new(base::Quota::per_second(rate).with_burst(burst));
    let a = base::TokenBucket::new(base::Quota::per_second(rate).with_burst(burst));
    let b = head::TokenBucket::new(head::Quota::per_second(rate).with_burst(burst));
    report("TokenBucket: admission", rounds(n, &gcra, &a, &b));
    let a = base::Gcra::new(base::Quota::per_second(rate).with_burst(burst));
    let b = head::Gcra::new(head::Quota::per_second(rate).with_burst(burst));
    report("Gcra: admission", rounds(n, &gcra, &a, &b));
    for keys in [1, 100_000] {
        report(
            &format!("Keyed<u64, Gcra>: {keys} key(s)"),
            keyed_rounds(n / 2, &gcra, keys),
        );
    }
    // Refusals, drained: an hour's quota, and 100/s (the bucket refilling between checks).
    let refusals = [
        (
            "refusal, an hour's quota",
            base::Quota::per_hour(1),
            head::Quota::per_hour(1),
        ),
        (
            "refusal, 100/s",
            base::Quota::per_second(100),
            head::Quota::per_second(100),
        ),
    ];
    for (what, quota_base, quota_head) in refusals {
        let gcra = base::Gcra::new(quota_base);
        let a = base::TokenBucket::new(quota_base);
        let b = head::TokenBucket::new(quota_head);
        while gcra.check().is_allowed() {}
        while a.check().is_allowed() {}
        while b.check().is_allowed() {}
        report(
            &format!("TokenBucket: {what}"),
            rounds(n / 2, &gcra, &a, &b),
        );
        let a = base::Gcra::new(quota_base);
        let b = head::Gcra::new(quota_head);
        while a.check().is_allowed() {}
        while b.check().is_allowed() {}
        report(&format!("Gcra: {what}"), rounds(n / 2, &gcra, &a, &b));
    }
}
