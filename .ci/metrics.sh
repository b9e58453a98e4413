#!/usr/bin/env bash
# The `metrics` feature: every counter read back from metrics-util's debugging recorder (the
# Redis counters run in .ci/redis.sh, the layer's here), and the Prometheus example started and
# curled as its doc says, on a free port.
set -euo pipefail
if ! command -v curl >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends curl >/dev/null
fi
cargo test --features metrics --test metrics
cargo test --features metrics --doc instrument
cargo test --features tower,axum,metrics --lib http::tests::modes::the_layer_counts_every_decision
cargo test --features tower,axum,metrics --lib http::tests::policies::each_policy_counts_its_own_decisions

cargo build --example prometheus --features metrics
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
./target/debug/examples/prometheus --port "$port" --seconds 10 > target/prometheus.log 2>&1 &
exporter=$!
trap 'kill "$exporter" 2>/dev/null || true' EXIT
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/metrics" && break; sleep 0.05; done
sleep 2 # two seconds of traffic: some admitted, some refused, some at the table's cap
scrape=$(curl -s "http://127.0.0.1:$port/metrics")
grep '^atomic_limiter' <<<"$scrape"
for counter in 'allowed_total{limiter="api"}' 'denied_total{limiter="api"}' \
    'table_full_total{limiter="per_client"}'; do
    value=$(grep -F "atomic_limiter_$counter" <<<"$scrape" | awk '{print $2}')
    echo "$counter = $value"
    [ "${value:-0}" -gt 0 ]
done
