#!/usr/bin/env bash
# The package a user would download builds on its own and holds what they need, nothing of the
# development tooling (see `include` in Cargo.toml).
set -euo pipefail
cargo package --allow-dirty --no-verify --list > target/package-list.txt
if grep -E '^(fuzz|loom-tests|grpc-tests|\.ci|scripts|benches|tests)/' target/package-list.txt; then
    echo "development tooling in the package" >&2
    exit 1
fi
cargo publish --dry-run --allow-dirty --target-dir target/package
