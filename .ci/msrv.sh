#!/usr/bin/env bash
# The declared minimum Rust (Cargo.toml's rust-version) builds the library, with and without
# its default features; the tests and benches use newer dev-dependencies and are not held to it.
# The toolchain comes from the Rust distribution server, not a package registry: where it cannot
# be had, the check says so and is skipped rather than failing the run for the network.
set -euo pipefail
msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
if ! rustup toolchain list | grep -q "^$msrv"; then
    if ! rustup toolchain install "$msrv" --profile minimal; then
        echo "MSRV CHECK SKIPPED: the Rust $msrv toolchain could not be installed here" >&2
        exit 0
    fi
fi
cargo "+$msrv" check --lib --target-dir target/msrv
cargo "+$msrv" check --lib --no-default-features --target-dir target/msrv
echo "Rust $msrv builds the library"
