#!/usr/bin/env bash
# The README's test command, exactly.
set -euo pipefail
cargo test --workspace
