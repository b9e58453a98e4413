#!/usr/bin/env bash
# Every meaningful combination of the crate's features builds without a warning (the loom cfg
# is exercised by .ci/loom.sh, and a target without 64-bit atomics by .ci/no-std.sh).
set -euo pipefail
export RUSTFLAGS="-D warnings ${RUSTFLAGS:-}"
for features in "" "std" "quanta" "baseline" "portable-atomic" "std,portable-atomic" "quanta,portable-atomic" "redis" "tower" "tower,axum" "tower,redis" "metrics" "metrics,redis" "redis-tls" "metrics,tower" "papaya" "papaya,tower" "grpc" "grpc,axum,redis" "rls" "rls,tower" "rls,redis"; do
    echo "--- --no-default-features --features '$features'"
    cargo check --lib --no-default-features --features "$features" --target-dir target/features
done
cargo check --lib --all-features --target-dir target/features
