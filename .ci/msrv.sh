#!/usr/bin/env bash
# The declared minimum Rust (Cargo.toml's rust-version) builds the library, with and without
# its default features and with the HTTP layer; the `redis` feature's own minimum (redis-rs 1.8 needs Rust 1.88) builds
# it with that feature. The tests and benches use newer dev-dependencies and are not held to it.
# The toolchains come from the Rust distribution server, not a package registry: where one cannot
# be had, the check says so and is skipped rather than failing the run for the network.
set -euo pipefail
msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
redis_msrv=1.88

# A toolchain installed here only for this check is removed at the end (about 0.6 GB each).
installed=()
trap 'for t in "${installed[@]}"; do rustup toolchain uninstall "$t" || true; done' EXIT
have() {
    rustup toolchain list | grep -q "^$1" && return 0
    if ! rustup toolchain install "$1" --profile minimal; then
        echo "MSRV CHECK SKIPPED: the Rust $1 toolchain could not be installed here" >&2
        return 1
    fi
    installed+=("$1")
}

if have "$msrv"; then
    cargo "+$msrv" check --lib --target-dir target/msrv
    cargo "+$msrv" check --lib --no-default-features --target-dir target/msrv
    cargo "+$msrv" check --lib --features tower,axum --target-dir target/msrv
    cargo "+$msrv" check --lib --features metrics --target-dir target/msrv
    cargo "+$msrv" check --lib --features papaya --target-dir target/msrv
    cargo "+$msrv" check --lib --features rls --target-dir target/msrv
    echo "Rust $msrv builds the library, and with the tower, axum, metrics, papaya and rls features"
fi
if have "$redis_msrv"; then
    cargo "+$redis_msrv" check --lib --features redis --target-dir target/msrv
    cargo "+$redis_msrv" check --lib --features redis-tls --target-dir target/msrv
    cargo "+$redis_msrv" check --lib --features grpc --target-dir target/msrv
    echo "Rust $redis_msrv builds the library with the redis, redis-tls and grpc features"
fi
# The rate-limit service (rls/) has its own minimum: serde-saphyr needs 1.89.
rls_msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' rls/Cargo.toml)
if have "$rls_msrv"; then
    cargo "+$rls_msrv" check -p atomic-limiter-rls --target-dir target/msrv
    echo "Rust $rls_msrv builds atomic-limiter-rls"
fi
