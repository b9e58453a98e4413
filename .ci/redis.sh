#!/usr/bin/env bash
# The `redis` feature against real servers: installs redis-server and redis-cli from Debian's
# packages when they are missing (Debian's is built with TLS), then runs the script's property tests, the failure and cluster
# suite (the tests start and stop their own servers on free loopback ports), the side-by-side
# measurement in its quick form, and the multi-node example against a server started here.
set -euo pipefail
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends redis-server redis-tools >/dev/null
fi
redis-server --version
# A missing server fails these tests instead of skipping them.
export CI="${CI:-true}"
cargo test --features redis --lib redis
cargo test --features redis,metrics --test redis
# Charge and settle, and an operator's changes of a subject, each once on a real server.
cargo test --features redis,metrics --test redis_admin
# One at a time: each fault test starts its own servers and times calls against a deadline, so
# two at once on two cores would each read the other's load as the code's (serial takes no
# longer: about 60 s either way).
cargo test --features redis,metrics --test redis_fleet -- --test-threads=1
# TLS (a CA, mutual TLS, a TLS cluster), the least-privilege ACL, Sentinel failover, secrets.
cargo test --features redis-tls,metrics --test redis_access
cargo run --release --features redis --example redis_compare -- --quick

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" --daemonize yes \
    --pidfile "$dir/redis.pid" >/dev/null
trap 'kill "$(cat "$dir/redis.pid")" 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
REDIS_URL="redis://127.0.0.1:$port/" cargo run --release --features redis --example redis_nodes
