#!/usr/bin/env bash
# The tests that take minutes, at full size (`ATOMIC_LIMITER_LONG_TESTS=1`): floods of ten million
# keys, memory per key at a million, a second of polling at 7 million checks a second, and the
# charge and reconfiguration model campaigns at 5 to 10 times their cases. `cargo test` runs them
# smaller, so that the README's test command stays within minutes.
set -euo pipefail
export ATOMIC_LIMITER_LONG_TESTS=1
cargo test --test keyed --test keyed_lock_free --test keyed_memory --test edge_cases
PROPTEST_CASES=2560 cargo test --test charge --test calendar
PROPTEST_CASES=5120 cargo test --test reconfigure
