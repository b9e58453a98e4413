#!/usr/bin/env bash
# The library's unit tests under Miri (undefined behaviour, and spurious compare_exchange_weak
# failures that loom never injects). Needs the nightly toolchain's miri component.
set -euo pipefail
if ! rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^miri'; then
    rustup component add miri --toolchain nightly
fi
cargo +nightly miri test --lib --target-dir target/miri
# The pinned keyed handle reads entries through pointers it keeps across checks: one run of its
# property test (some hundred checks, renewals, evictions and moves) on the lock-free store.
# Proptest keeps its seeds in a file, which Miri's isolation would refuse.
PROPTEST_CASES=1 MIRIFLAGS="-Zmiri-disable-isolation" cargo +nightly miri test --features papaya \
    --target-dir target/miri --test keyed_lock_free a_pinned_handle_answers_what_check_key_answers
# A growth abandoned by a panicking `Hash` frees the table it was building, keys and all.
cargo +nightly miri test --target-dir target/miri --test keyed_flat a_panicking_hash_during_growth
