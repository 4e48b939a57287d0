#!/usr/bin/env bash
# The main job: build dckpt, create an evolving synthetic buffer, checkpoint
# ten versions, restore and verify every one, print the per-version table.
#   scripts/demo.sh [SIZE] [CHANGE]      e.g. scripts/demo.sh 256M 0.01
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:-64M}
change=${2:-0.01}
out=${DCKPT_DEMO_DIR:-target/demo}

cargo build --release --quiet
bin=target/release/dckpt
rm -rf "$out"
mkdir -p "$out"
"$bin" gen --size "$size" --versions 10 --change "$change" --shape clustered --out "$out/versions"
for v in $(seq 1 10); do
    "$bin" checkpoint --dir "$out/store" --version "$v" --method tree --chunk-size 128 "$out/versions/v$(printf %03d "$v").bin"
done
for v in $(seq 1 10); do
    "$bin" restore --dir "$out/store" --version "$v" --output "$out/restored.bin" >/dev/null
    cmp -s "$out/restored.bin" "$out/versions/v$(printf %03d "$v").bin" || { echo "version $v: restore differs" >&2; exit 1; }
done
echo "all 10 versions restored byte-exactly"
"$bin" verify --dir "$out/store"
"$bin" inspect --dir "$out/store"
