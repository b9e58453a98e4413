#!/usr/bin/env bash
# Two builds of the crate measured side by side in one process: the working tree against a git
# revision. Both are linked into one binary, so every round times both on the same moments of
# the host, in alternating order; the ratios are per round (medians, with the quartiles).
# This host swings between fast and slow phases that move a ratio between two runs by more than
# a change of a few instructions; within one round they cancel.
#
#   bash scripts/ab.sh REV [ROUNDS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rev=${1:?usage: bash scripts/ab.sh REV [ROUNDS]}
rounds=${2:-200}
work=$(mktemp -d)
cleanup() {
    git -C "$root" worktree remove --force "$work/base" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
git -C "$root" worktree add --detach -q "$work/base" "$rev"
# Cargo links two builds of one package only when their versions are incompatible.
sed -i '0,/^version = /s/^version = .*/version = "0.0.0"/' "$work/base/Cargo.toml"
mkdir -p "$work/ab/src"
cp "$root/scripts/ab/main.rs" "$work/ab/src/main.rs"
cat >"$work/ab/Cargo.toml" <<TOML
[package]
name = "ab"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
base = { package = "atomic-limiter", path = "$work/base" }
head = { package = "atomic-limiter", path = "$root" }

[workspace]
TOML
cargo build --release --quiet --manifest-path "$work/ab/Cargo.toml" --target-dir "$root/target/ab"
echo "base: $(git -C "$root" rev-parse --short "$rev"); head: the working tree"
for _ in 1 2 3; do
    "$root/target/ab/release/ab" "$rounds"
done
