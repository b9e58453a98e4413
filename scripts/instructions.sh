#!/usr/bin/env bash
# Instructions per check (admitted; denied for the `-deny` subjects), counted by callgrind inside
# `measured_loop` only (the limiter's construction and quanta's calibration are left out).
# Deterministic for a given binary.
#
#   bash scripts/instructions.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-100000}"
cargo build --release --example instructions >/dev/null
bin=target/release/examples/instructions
out=$(mktemp -d)
printf '| subject | instructions per check |\n|---|---|\n'
for s in quanta-now gcra token-bucket gcra-deny token-bucket-deny gcra-deny-retry token-bucket-deny-retry gcra-coarse-deny \
    token-bucket-coarse-deny \
    token-bucket-deny-100 gcra-coarse-deny-100 token-bucket-coarse-deny-100 mutex-gcra mutex-bucket governor reconfigurable keyed keyed-floor keyed-lock-free keyed-pinned keyed-pinned-one-key governor-keyed; do
    valgrind --tool=callgrind --callgrind-out-file="$out/$s.out" \
        --toggle-collect='*measured_loop*' "$bin" "$s" "$n" >/dev/null 2>"$out/$s.err"
    total=$(grep -E '^(summary|totals):' "$out/$s.out" | head -1 | awk '{print $2}')
    printf '| %s | %s |\n' "$s" "$(awk -v t="$total" -v n="$n" 'BEGIN { printf "%.1f", t / n }')"
done
rm -rf "$out"
