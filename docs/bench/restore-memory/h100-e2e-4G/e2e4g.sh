#!/usr/bin/env bash
# 4 GiB end to end on the H100 (checkpoint, reopen, restore onto the device), old (adbdf1d) vs this session's binary.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} DCKPT_KERNEL_CACHE=/tmp/kc
for w in scattered:0.01 clustered:0.01; do for b in dckpt-old dckpt; do
  rm -rf /tmp/e4; t=$SECONDS
  timeout 280 .device/$b bench --e2e /tmp/e4 --backend cuda --synthetic $w --size 4G --versions 10 --method tree --chunk-size 128 --json $OUT/$b-${w/:/-}.json > $OUT/$b-${w/:/-}.txt 2>&1
  echo "$b $w rc=$? ($((SECONDS-t)) s)"; grep -E "median incremental|reopen|restore phases|bytes on disk" $OUT/$b-${w/:/-}.txt
done; done
rm -rf /tmp/e4
