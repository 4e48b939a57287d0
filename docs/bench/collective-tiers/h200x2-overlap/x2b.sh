#!/usr/bin/env bash
# Device nvidia-h200-x2, part 2: labels and replicated weak, heat sweeps and 16 ranks (8 per GPU).
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} DCKPT_KERNEL_CACHE=$PWD/.device/kernel-cache OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
common="BIN_DIR=.device NAME=h200x2b DCKPT_HOST_CACHE_SIZE=1G STEPS=60 APPEND=1"
t=$SECONDS
env BIN_DIR=.device NAME=h200x2b DCKPT_HOST_CACHE_SIZE=1G STEPS=60 APPEND=1 EXAMPLES="labels replicated" STUDIES=weak RANKS="1 2 4 8" ROWS_PER_RANK=512 COLS=2048 TABLE=64M LOCAL=4M timeout 240 scripts/scaling-study.sh $OUT/scaling > $OUT/scaling-b1.log 2>&1
echo "labels+replicated rc=$? ($((SECONDS-t)) s)"; tail -2 $OUT/scaling-b1.log
t=$SECONDS
env BIN_DIR=.device NAME=h200x2b DCKPT_HOST_CACHE_SIZE=1G STEPS=60 APPEND=1 EXAMPLES=heat DEVICE=gpu STUDIES=strong RANKS="16" TOTAL_ROWS=8192 COLS=8192 timeout 100 scripts/scaling-study.sh $OUT/scaling > $OUT/scaling-b2.log 2>&1
echo "heat 16 rc=$? ($((SECONDS-t)) s)"; tail -2 $OUT/scaling-b2.log
t=$SECONDS
env BIN_DIR=.device NAME=h200x2b DCKPT_HOST_CACHE_SIZE=1G STEPS=60 APPEND=1 EXAMPLES=heat DEVICE=gpu STUDIES="chunk every" SWEEP_RANKS=4 ROWS_PER_RANK=2048 COLS=8192 CHUNKS="128 512 4096" EVERYS="5 10 30" timeout 170 scripts/scaling-study.sh $OUT/scaling > $OUT/scaling-b3.log 2>&1
echo "heat sweeps rc=$? ($((SECONDS-t)) s)"; tail -2 $OUT/scaling-b3.log; wc -l $OUT/scaling/*.csv
