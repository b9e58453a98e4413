#!/usr/bin/env bash
# The library's unit tests under Miri (undefined behaviour, and spurious compare_exchange_weak
# failures that loom never injects). Needs the nightly toolchain's miri component.
set -euo pipefail
if ! rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^miri'; then
    rustup component add miri --toolchain nightly
fi
cargo +nightly miri test --lib --target-dir target/miri
