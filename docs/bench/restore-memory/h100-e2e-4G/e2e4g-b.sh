#!/usr/bin/env bash
# The 4 GiB scattered pipeline time, new binary first then old (order check), and the in-memory GPU bench for both.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} DCKPT_KERNEL_CACHE=/tmp/kc
for b in dckpt dckpt-old; do
  rm -rf /tmp/e4; t=$SECONDS
  timeout 200 .device/$b bench --e2e /tmp/e4 --backend cuda --synthetic scattered:0.01 --size 4G --versions 6 --method tree --chunk-size 128 --json $OUT/$b.json > $OUT/$b.txt 2>&1
  echo "$b rc=$? ($((SECONDS-t)) s)"; grep -E "median incremental" $OUT/$b.txt
  python3 -c "import json; print([round(v['pipeline_ms'],1) for v in json.load(open('$OUT/$b.json'))['versions']])"
done
rm -rf /tmp/e4
for b in dckpt dckpt-old; do timeout 120 .device/$b bench --backend cuda --synthetic scattered:0.01 --size 4G --versions 6 --method tree 2>&1 | tail -4 | sed "s/^/$b: /"; done
