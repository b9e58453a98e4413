#!/usr/bin/env bash
# The no_std core: on the host, and on a target without 64-bit atomics through portable-atomic.
set -euo pipefail
cargo build --no-default-features
cargo build --no-default-features --features portable-atomic
target=thumbv7m-none-eabi
rustup target list --installed | grep -q "^$target" || rustup target add "$target"
cargo build --no-default-features --features portable-atomic --target "$target"
