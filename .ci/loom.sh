#!/usr/bin/env bash
# The loom model checks: release mode with debug assertions, a bounded number of preemptions, and
# a target directory of their own so the main build is not redone under the loom cfg.
set -euo pipefail
export RUSTFLAGS="--cfg atomic_limiter_loom ${RUSTFLAGS:-}"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}"
export CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true
cargo test -p atomic-limiter-loom-tests --release --target-dir target/loom -- "$@"
