#!/usr/bin/env bash
# limitador's Redis storage beside `RedisGcra` on one redis-server started here
# (`benches/peer-limitador`). limitador 0.14.0's Redis storage compiles only with its disk
# storage, whose RocksDB is built from C++ with bindgen: libclang and a C++ compiler are
# installed from Debian's packages when missing, and the first build takes about 14 minutes on 2
# cores (then seconds).
#
#   bash scripts/peer_limitador.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v redis-server >/dev/null || ! ldconfig -p | grep -q libclang; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends redis-server libclang-dev clang >/dev/null
fi
cargo build --release --manifest-path benches/peer-limitador/Cargo.toml --target-dir target/peers
./target/peers/release/atomic-limiter-peer-limitador "$@"
