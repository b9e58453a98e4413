#!/usr/bin/env bash
# The README's main-job command and the quickstart must keep working: run both (compare in its
# quick mode, a few seconds), what being reconfigurable costs, and check that the benchmarks still
# compile.
set -euo pipefail
cargo run --release --example quickstart
cargo run --release --example compare -- --quick
cargo run --release --example reconfigure_cost -- --quick
cargo bench --bench limiters --no-run
