#!/usr/bin/env bash
# De-duplication vs compression vs both on the same versions (issue #9,
# item 9): bytes stored over 10 versions of two simulations (heat stencil,
# label propagation) and the synthetic edits, with the CSV in OUT.
#
#   scripts/compression-study.sh [OUT]     (default docs/bench/compression)
# Environment: SIZE (64M), VERSIONS (10), WORKLOADS, DCKPT_BIN.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/bench/compression}
bin=${DCKPT_BIN:-}
if [ -z "$bin" ]; then
    cargo build --release --quiet --bin dckpt
    bin=target/release/dckpt
fi
mkdir -p "$out"
csv="$out/study.csv"
header=header
: >"$csv"
for w in ${WORKLOADS:-heat labels scattered:0.01 clustered:0.01 scattered:0.10}; do
    "$bin" bench-compression --workload "$w" --size "${SIZE:-64M}" --versions "${VERSIONS:-10}" \
        --dir "${TMPDIR:-/tmp}/dckpt-compression" --csv "$header" >>"$csv"
    header=line
done
python3 - "$csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print(f"{'workload':<16}{'size':>12}{'zstd alone':>12}{'de-dup':>10}{'de-dup+zstd':>13}{'de-dup/zstd':>13}{'zstd GB/s':>11}")
for r in rows:
    print(f"{r['workload']:<16}{int(r['size']):>12}{float(r['ratio_zstd']):>11.2f}x{float(r['ratio_dedup']):>9.2f}x"
          f"{float(r['ratio_dedup_zstd']):>12.2f}x{float(r['dedup_over_zstd']):>12.2f}x{float(r['dedup_zstd_gbps']):>11.2f}")
PY
