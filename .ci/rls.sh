#!/usr/bin/env bash
# The rate-limit service for Envoy: the engine's tests in the library (feature `rls`), then the
# binary over the wire (each test starts it on free loopback ports and drives it with Envoy's
# gRPC client from envoy-types), and its clippy.
set -euo pipefail
cargo test --features rls --lib rls
cargo test -p atomic-limiter-rls
cargo clippy -p atomic-limiter-rls --all-targets -- -D warnings
