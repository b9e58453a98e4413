#!/usr/bin/env bash
# The declared minimum Rust (Cargo.toml's rust-version) builds the library, with and without
# its default features; the tests and benches use newer dev-dependencies and are not held to it.
set -euo pipefail
msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
rustup toolchain list | grep -q "^$msrv" || rustup toolchain install "$msrv" --profile minimal
cargo "+$msrv" check --lib --target-dir target/msrv
cargo "+$msrv" check --lib --no-default-features --target-dir target/msrv
