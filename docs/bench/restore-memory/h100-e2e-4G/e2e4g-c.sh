#!/usr/bin/env bash
# 4 GiB scattered 1% end to end with the resolution change (15efe86): restore phases; GPU tests again.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} DCKPT_KERNEL_CACHE=/tmp/kc
rm -rf /tmp/e4; timeout 250 .device/dckpt bench --e2e /tmp/e4 --backend cuda --synthetic scattered:0.01 --size 4G --versions 10 --method tree --chunk-size 128 --json $OUT/dckpt-scattered-0.01.json > $OUT/dckpt-scattered-0.01.txt 2>&1; echo "rc=$?"
grep -E "median incremental|reopen|restore phases" $OUT/dckpt-scattered-0.01.txt; rm -rf /tmp/e4
t=$SECONDS; timeout 240 .device/gpu-test --test-threads 1 > $OUT/gpu-test.log 2>&1; echo "gpu-test rc=$? ($((SECONDS-t)) s) $(grep 'test result' $OUT/gpu-test.log)"
