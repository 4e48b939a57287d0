#!/usr/bin/env bash
# Device nvidia-h200-x2, placed: the weak studies at 16 ranks (8 a GPU, 2 cores a rank).
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} DCKPT_KERNEL_CACHE=/tmp/kc OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
t=$SECONDS
NO_PLOT=1 BIN_DIR=.device NAME=h200x2-placed-c DCKPT_HOST_CACHE_SIZE=1G RANKS=16 STUDIES=weak STEPS=60 EXAMPLES=heat DEVICE=gpu ROWS_PER_RANK=2048 COLS=8192 timeout 150 scripts/scaling-study.sh $OUT > $OUT/w16a.log 2>&1
echo "heat rc=$? ($((SECONDS-t)) s)"; t=$SECONDS
NO_PLOT=1 APPEND=1 BIN_DIR=.device NAME=h200x2-placed-c DCKPT_HOST_CACHE_SIZE=1G RANKS=16 STUDIES=weak STEPS=60 EXAMPLES="labels replicated" ROWS_PER_RANK=512 COLS=2048 TABLE=64M LOCAL=4M timeout 200 scripts/scaling-study.sh $OUT > $OUT/w16b.log 2>&1
echo "labels+replicated rc=$? ($((SECONDS-t)) s)"
awk -F, 'NR>1 {printf "%-6s %-10s %-10s P=%s steady %7.1f ms step %6.1f ms ms/step %6.2f stored %8.1f MiB\n", $1, $2, $7, $3, $13, 1000*$15/$9, $20, $17/1048576}' $OUT/h200x2-placed-c.csv
