#!/usr/bin/env bash
# The HTTP layer (features `tower` and `axum`): its oneshot tests, the tests against a real axum
# server and a real client (the Redis backends too: `.ci/redis.sh` installed redis-server), the
# README's example started and hit with curl as the README shows, the side-by-side measurement in
# its quick form, and the criterion benchmark built.
set -euo pipefail
if ! command -v curl >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends curl >/dev/null
fi
export CI="${CI:-true}"
cargo test --features tower,axum --lib http
cargo test --features tower,axum,redis --test http
cargo bench --bench http --features tower,axum --no-run

# The README's exchange: five admitted, the sixth refused with a Retry-After of one second.
cargo build --release --example axum_server --features tower,axum
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
PORT="$port" ./target/release/examples/axum_server > target/axum_server.log 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.05; done
sleep 1.1 # the probe above spent a token: start from a full quota
statuses=$(for _ in 1 2 3 4 5 6; do curl -s -o /dev/null -w '%{http_code} ' "http://127.0.0.1:$port/"; done)
echo "statuses: $statuses"
[ "$statuses" = "200 200 200 200 200 429 " ]
refusal=$(curl -si "http://127.0.0.1:$port/")
echo "$refusal"
grep -qi '^retry-after: 1' <<<"$refusal"
grep -qi '^ratelimit: "default";r=0;t=1' <<<"$refusal"
grep -qi '^content-type: application/problem+json' <<<"$refusal"
kill -INT "$server"
wait "$server"
trap - EXIT

cargo run --release --example http_compare --features tower,axum -- --quick
