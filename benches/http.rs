//! The tower layer's own cost per request, against tower_governor's on the same inner service and
//! the same keys (no network): `cargo bench --bench http --features tower,axum`.
//!
//! Each iteration calls the service with one request (with its peer address, as axum's
//! `ConnectInfo`, built beforehand and untimed) and polls the response future to completion; "no
//! layer" is that work alone. The
//! side-by-side figures, interleaved, come from `examples/http_compare.rs`.

#[path = "http/subjects.rs"]
mod subjects;

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::time::Duration;

use atomic_limiter::{Gcra, Keyed, Quota};

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use subjects::{CASES, CLIENTS, request, subjects};

fn layers(c: &mut Criterion) {
    for (path, clients) in CASES {
        let name = format!("http layer/{}, {clients} clients", path.name());
        let mut group = c.benchmark_group(name);
        group.throughput(Throughput::Elements(1));
        let mut i = 0u32;
        for (name, mut subject) in subjects(path, clients) {
            // Requests built outside the timed calls (in batches): the layer's own cost is then
            // a large share of what is timed.
            group.bench_function(name, |b| {
                b.iter_batched(
                    || {
                        i = (i + 1) % clients;
                        request(i)
                    },
                    |r| black_box(subject(r)),
                    BatchSize::SmallInput,
                )
            });
        }
        group.finish();
    }
    // The tables alone, on the same addresses: what of the layer's cost is the keyed check.
    for clients in [CLIENTS, 100_000] {
        let quota = Quota::with_period(Duration::from_nanos(1)).with_burst(1_000_000);
        let ours: Keyed<IpAddr, Gcra> = Keyed::gcra(quota, 2 * clients as usize);
        let theirs = governor::RateLimiter::<IpAddr, _, _>::dashmap(
            governor::Quota::with_period(Duration::from_nanos(1))
                .unwrap()
                .allow_burst(NonZeroU32::new(1_000_000).unwrap()),
        );
        let ips: Vec<IpAddr> = (0..clients)
            .map(|i| IpAddr::V4(Ipv4Addr::from(0x0A00_0000 + i)))
            .collect();
        let mut group =
            c.benchmark_group(format!("http layer/the keyed table alone, {clients} keys"));
        let mut i = 0;
        group.bench_function("atomic-limiter Keyed", |b| {
            b.iter(|| {
                i = (i + 1) % ips.len();
                black_box(ours.check_key(&ips[i]).is_allowed())
            })
        });
        group.bench_function("governor keyed", |b| {
            b.iter(|| {
                i = (i + 1) % ips.len();
                black_box(theirs.check_key(&ips[i]).is_ok())
            })
        });
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = layers
}
criterion_main!(benches);
