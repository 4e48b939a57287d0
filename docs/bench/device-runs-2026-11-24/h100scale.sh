#!/usr/bin/env bash
# The H100 scaling study again, ranks placed by scripts/placement.sh (PART=heat or PART=rest).
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} DCKPT_KERNEL_CACHE=$PWD/.device/kernel-cache DCKPT_HOST_CACHE_SIZE=1G
nvidia-smi --query-gpu=name --format=csv,noheader; nproc
t=$SECONDS
if [ "$PART" = heat ]; then
  BIN_DIR=.device NAME=h100 RANKS="1 2 4 8" SWEEP_RANKS=4 STEPS=60 EXAMPLES=heat DEVICE=gpu TOTAL_ROWS=8192 ROWS_PER_RANK=2048 COLS=8192 CHUNKS="128 512 4096" EVERYS="5 10 30" timeout 560 scripts/scaling-study.sh $OUT/scaling > $OUT/scaling.log 2>&1
else
  BIN_DIR=.device NAME=h100 RANKS="1 2 4 8" STEPS=60 EXAMPLES="labels replicated" STUDIES=weak ROWS_PER_RANK=512 COLS=2048 TABLE=64M LOCAL=4M timeout 560 scripts/scaling-study.sh $OUT/scaling > $OUT/scaling.log 2>&1
fi
echo "rc=$? ($((SECONDS-t)) s)"; grep -c "ms/step" $OUT/scaling.log; grep -i "warn\|error" $OUT/scaling.log | head -3; tail -3 $OUT/scaling.log
