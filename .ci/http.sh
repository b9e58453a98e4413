#!/usr/bin/env bash
# The HTTP layer (features `tower` and `axum`): its oneshot tests, the tests against a real axum
# server and a real client (the Redis backends too: `.ci/redis.sh` installed redis-server), the
# README's example started and hit with curl as the README shows, the side-by-side measurement in
# its quick form, and the criterion benchmark built.
set -euo pipefail
if ! command -v curl >/dev/null || ! [ -x /usr/sbin/nginx ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends curl nginx-light >/dev/null
    # The package's own service is not wanted: the tests start their own nginx.
    /usr/sbin/nginx -s stop 2>/dev/null || true
fi
export CI="${CI:-true}"
cargo test --features tower,axum --lib http
cargo test --features tower,axum,redis --test http
cargo test --features tower,axum --test http_proxy
# gRPC answers against a real tonic server and client (its own crate: tonic stays out of the
# main workspace's builds).
(cd grpc-tests && cargo test --target-dir ../target/grpc-tests)
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

# The README's proxy setup: the example behind a real nginx with TRUSTED_PROXIES, clients from
# distinct loopback addresses each with their own five, a forged X-Forwarded-For gaining nothing.
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port)
proxy_port=$(free_port)
nginx_dir=$(mktemp -d)
cat > "$nginx_dir/nginx.conf" <<CONF
user root;
daemon off;
master_process off;
pid $nginx_dir/nginx.pid;
error_log $nginx_dir/error.log warn;
events { worker_connections 64; }
http {
    access_log off;
    client_body_temp_path $nginx_dir/body;
    proxy_temp_path $nginx_dir/proxy;
    server {
        listen 127.0.0.1:$proxy_port;
        location / {
            proxy_pass http://127.0.0.1:$port;
            proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
        }
    }
}
CONF
TRUSTED_PROXIES=127.0.0.1/32 PORT="$port" ./target/release/examples/axum_server > target/axum_proxy.log 2>&1 &
server=$!
/usr/sbin/nginx -p "$nginx_dir" -c "$nginx_dir/nginx.conf" &
proxy=$!
trap 'kill "$server" "$proxy" 2>/dev/null || true; rm -rf "$nginx_dir"' EXIT
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$proxy_port/" && break; sleep 0.05; done
sleep 1.1
# One curl per client, its six requests on one connection within a few milliseconds (a token
# comes back every 200 ms); a batch slower than 150 ms is the host's stall, and is run again.
batch() {
    local source=$1 extra=$2 url="http://127.0.0.1:$proxy_port/" args=()
    for _ in 1 2 3 4 5; do args+=(-o /dev/null "$url"); done
    curl -s --interface "$source" -w '%{http_code} ' "${args[@]}" \
        --next -s --interface "$source" -w '%{http_code}' -H "$extra" -o /dev/null "$url"
}
for source in 127.0.0.2 127.0.0.3; do
    for attempt in 1 2 3; do
        start=$(date +%s%N)
        statuses=$(batch "$source" "X-Forwarded-For: 203.0.113.$attempt")
        took=$(( ($(date +%s%N) - start) / 1000000 ))
        echo "behind nginx, $source: $statuses (${took} ms)"
        [ "$took" -lt 150 ] && break
        sleep 1.1
    done
    [ "$statuses" = "200 200 200 200 200 429" ]
done
kill "$server" "$proxy"
wait "$server" "$proxy" 2>/dev/null || true
trap - EXIT
rm -rf "$nginx_dir"

cargo run --release --example http_compare --features tower,axum -- --quick
