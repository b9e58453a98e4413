//! The tower layer's own cost per request, against tower_governor's on the same inner service and
//! the same keys (no network): `cargo bench --bench http --features tower,axum`.
//!
//! Each iteration builds one request (with its peer address, as axum's `ConnectInfo`), calls the
//! service and polls the response future to completion; "no layer" is that work alone. The
//! side-by-side figures, interleaved, come from `examples/http_compare.rs`.

#[path = "http/subjects.rs"]
mod subjects;

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use subjects::{Path, request, subjects};

fn layers(c: &mut Criterion) {
    for path in [Path::Admitted, Path::AdmittedWithHeaders, Path::Refused] {
        let mut group = c.benchmark_group(format!("http layer/{}", path.name()));
        group.throughput(Throughput::Elements(1));
        let mut i = 0u32;
        for (name, mut subject) in subjects(path) {
            group.bench_function(name, |b| {
                b.iter(|| {
                    i = i.wrapping_add(1);
                    black_box(subject(request(i)))
                })
            });
        }
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
