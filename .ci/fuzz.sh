#!/usr/bin/env bash
# Fuzz smoke: every cargo-fuzz target for a bounded time (FUZZ_SECONDS, default 60), starting from
# the committed seeds. Any crash fails the run; libFuzzer leaves the input in fuzz/artifacts/.
set -euo pipefail
seconds="${FUZZ_SECONDS:-60}"
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
# cargo-fuzz passes -Z flags: the nightly toolchain where installed, else stable told to accept them.
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    fuzz=(cargo +nightly fuzz)
else
    export RUSTC_BOOTSTRAP=1
    fuzz=(cargo fuzz)
fi
cd fuzz
"${fuzz[@]}" build
for target in packed quota differential; do
    mkdir -p "corpus/$target"
    echo "--- fuzz $target for ${seconds}s"
    "${fuzz[@]}" run "$target" "corpus/$target" "seeds/$target" -- \
        -max_total_time="$seconds" -print_final_stats=1 2>&1 |
        grep -E '^(Done|stat::number_of_executed_units|stat::average_exec_per_sec)|panicked|ERROR|SUMMARY' || true
    # libFuzzer's exit status is lost in the pipe: a crash always leaves an artifact.
    if compgen -G "artifacts/$target/*" >/dev/null; then
        echo "fuzz target $target crashed; inputs in fuzz/artifacts/$target:" >&2
        ls "artifacts/$target" >&2
        exit 1
    fi
done
