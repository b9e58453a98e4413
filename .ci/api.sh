#!/usr/bin/env bash
# The public API, listed by cargo-public-api (rustdoc's JSON, on the nightly toolchain) with every
# feature a user can turn on, must match docs/public-api.txt: a change to the surface shows in
# review as a change to that file. To accept one: bash .ci/api.sh --bless
set -euo pipefail
version=0.52.0
if ! cargo public-api --version 2>/dev/null | grep -q "$version"; then
    cargo install cargo-public-api --version "$version" --locked
fi
features=std,quanta,baseline,portable-atomic,redis,redis-tls,tower,axum,grpc,metrics,papaya,rls
listed=$(mktemp)
cargo +nightly public-api -ss -p atomic-limiter --features "$features" >"$listed"
if [[ "${1:-}" == "--bless" ]]; then
    cp "$listed" docs/public-api.txt
elif ! diff -u docs/public-api.txt "$listed"; then
    echo "the public API differs from docs/public-api.txt (above); if intended: bash .ci/api.sh --bless" >&2
    exit 1
fi
echo "public API: $(grep -c . docs/public-api.txt) lines, as docs/public-api.txt lists"
