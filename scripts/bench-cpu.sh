#!/usr/bin/env bash
# The CPU benchmark of BENCHMARKS.md: ten versions of SIZE bytes with 1% and
# 10% of the bytes changed per version, clustered and scattered, at chunk
# sizes 64, 128 and 512 B; every method plus hashing alone, zstd-1, lz4 and
# memcpy in the same process. Writes JSON per run under OUT and prints a table.
#   scripts/bench-cpu.sh [SIZE] [OUT]        (default 1G, target/bench-cpu)
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:-1G}
out=${2:-target/bench-cpu}
data=${DCKPT_BENCH_DATA:-target/bench-data}
cargo build --release --quiet
bin=target/release/dckpt
mkdir -p "$out"
for shape in clustered scattered; do
    for change in 0.01 0.10; do
        rm -rf "$data"
        "$bin" gen --size "$size" --versions 10 --change "$change" --shape "$shape" --seed 42 --out "$data"
        for cs in 64 128 512; do
            name="$shape-$change-$cs"
            baselines=hash
            [ "$cs" = 128 ] && baselines=all
            echo "== $name"
            "$bin" bench --chunk-size "$cs" --baselines "$baselines" --json "$out/$name.json" "$data"/v*.bin
        done
    done
done
rm -rf "$data"
python3 scripts/bench-table.py "$out"
