#!/usr/bin/env bash
# Compiles kernels/digests.cuh as host C++ and checks that every digest equals
# the Rust implementation's (no GPU needed). Exit status 1 on any difference.
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
g++ -std=c++17 -O1 -Wall -Wno-unknown-pragmas -o "$tmp/host" kernels/tests/digests_host_test.cpp
"$tmp/host" > "$tmp/cuda.txt"
cargo run --quiet --release --example digest_vectors > "$tmp/rust.txt"
if diff "$tmp/rust.txt" "$tmp/cuda.txt" > "$tmp/diff.txt"; then
    echo "digests.cuh matches the Rust digests on $(wc -l < "$tmp/rust.txt") vectors"
else
    head -20 "$tmp/diff.txt"
    exit 1
fi
