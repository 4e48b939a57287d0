#!/usr/bin/env bash
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} DCKPT_KERNEL_CACHE=/tmp/kc
for i in 1 2 3; do DCKPT_PROFILE=1 timeout 120 .device/gpu-test --test-threads 1 the_gpu_cache_tier_holds > $OUT/gt$i.log 2>&1; echo "run $i rc=$? $(grep 'test result' $OUT/gt$i.log)"; grep -c "restore-peek-bytes" $OUT/gt$i.log; grep -E "panicked" -A1 $OUT/gt$i.log | head -3; done
