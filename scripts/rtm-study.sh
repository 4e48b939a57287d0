#!/usr/bin/env bash
# The adjoint (RTM-like) benchmark of issue #9, item 11(b)/(c): a forward
# pass checkpoints VERSIONS versions of SIZE bytes, a backward pass restores
# them (reverse, then irregular order; uniform, then variable diff sizes),
# through the synchronous store and the asynchronous tiers (FIFO, LRU,
# gap-aware eviction x no, one, all hints). Page cache dropped before each
# restore (--cold). One CSV for all, in OUT, and a short table ("mem %":
# the share of the restores' reads served from memory: the restore cache or
# versions still in the host cache).
#
#   scripts/rtm-study.sh [OUT]                 (default docs/bench/rtm)
# Environment: SIZE (256M), VERSIONS (16), COMPUTE_MS (50), BACKEND (auto),
# CACHE (restore and host caches; default 4 x SIZE), NAME (csv file name,
# default study), DCKPT_BIN, TMPDIR (scratch directory; on the disk measured).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/bench/rtm}
bin=${DCKPT_BIN:-}
if [ -z "$bin" ]; then
    cargo build --release --quiet --bin dckpt
    bin=target/release/dckpt
fi
mkdir -p "$out"
csv="$out/${NAME:-study}.csv"
header=header
: >"$csv"
cache=()
if [ -n "${CACHE:-}" ]; then cache=(--host-cache "$CACHE" --restore-cache "$CACHE"); fi
for sizes in uniform variable; do
    for order in reverse irregular; do
        echo "== $sizes sizes, $order order" >&2
        "$bin" bench-rtm --size "${SIZE:-256M}" --versions "${VERSIONS:-16}" --sizes "$sizes" --order "$order" \
            --compute-ms "${COMPUTE_MS:-50}" --backend "${BACKEND:-auto}" --cold "${cache[@]}" \
            --dir "${TMPDIR:-/tmp}/dckpt-rtm" --csv "$header" >>"$csv"
        header=line
    done
done
python3 - "$csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print(f"{'sizes':<9}{'order':<10}{'engine':<10}{'hints':<6}{'ckpt GB/s':>10}{'x sync':>8}{'restore GB/s':>13}{'x sync':>8}{'mem %':>7}")
for r in rows:
    hit, miss = int(r['hit_bytes']) + int(r['inflight_bytes']), int(r['miss_bytes'])
    pct = 100 * hit / (hit + miss) if hit + miss else 0
    print(f"{r['sizes']:<9}{r['order']:<10}{r['engine']:<10}{r['hints']:<6}{float(r['checkpoint_gbps']):>10.2f}"
          f"{float(r['ckpt_speedup']):>8.2f}{float(r['restore_gbps']):>13.2f}{float(r['restore_speedup']):>8.2f}{pct:>7.0f}")
PY
