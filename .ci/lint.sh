#!/usr/bin/env bash
# clippy, rustfmt and rustdoc, all warnings as errors.
set -euo pipefail
for c in clippy rustfmt; do
    rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
done
cargo clippy --workspace --all-targets -- -D warnings
# The `redis` feature's code, tests, example and benchmark; the HTTP layer's, with and without it.
cargo clippy --all-targets --features redis -- -D warnings
cargo clippy --all-targets --features tower,axum -- -D warnings
cargo clippy --all-targets --features tower,axum,redis -- -D warnings
cargo clippy --all-targets --features metrics -- -D warnings
cargo clippy --all-targets --features rls,tower -- -D warnings
cargo clippy --all-targets --features tower,axum,redis,metrics -- -D warnings
cargo clippy --all-targets --features tower,axum,grpc -- -D warnings
(cd grpc-tests && cargo clippy --all-targets --target-dir ../target/grpc-tests -- -D warnings && cargo fmt --check)
# TLS: its tests (certificates made with rcgen) and its side-by-side example.
cargo clippy --all-targets --features redis-tls,metrics -- -D warnings
cargo fmt --all --check
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -p atomic-limiter --features redis-tls,tower,axum,grpc,metrics,rls
# The HTTP layer's docs without the `redis` feature: what a user of `tower,axum` alone reads.
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -p atomic-limiter --features tower,axum
