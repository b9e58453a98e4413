#!/usr/bin/env bash
# The rate-limit service for Envoy: the engine's tests in the library (feature `rls`, and on
# Redis), then the binary over the wire (each test starts it on free loopback ports, and the
# Redis ones a redis-server, and drives it with Envoy's gRPC client from envoy-types), its
# clippy, and the load generator in its quick form.
set -euo pipefail
export CI="${CI:-true}"
cargo test --features rls --lib rls
cargo test --features rls,redis --lib lease
cargo test -p atomic-limiter-rls
cargo test -p atomic-limiter-rls --features redis
cargo clippy -p atomic-limiter-rls --all-targets -- -D warnings
cargo clippy -p atomic-limiter-rls --features redis --all-targets -- -D warnings
cargo run --release -p atomic-limiter-rls --example rls_load -- --quick
