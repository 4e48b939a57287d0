#!/usr/bin/env bash
# Device nvidia-h200-x2, placed: heat strong at 16 ranks (8 a GPU, 2 cores a rank); labels weak at 2 ranks twice more.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} DCKPT_KERNEL_CACHE=/tmp/kc OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
t=$SECONDS
NO_PLOT=1 BIN_DIR=.device NAME=h200x2-placed-b DCKPT_HOST_CACHE_SIZE=1G RANKS=16 STUDIES=strong STEPS=60 EXAMPLES=heat DEVICE=gpu TOTAL_ROWS=8192 COLS=8192 timeout 120 scripts/scaling-study.sh $OUT > $OUT/heat16.log 2>&1
echo "heat16 rc=$? ($((SECONDS-t)) s)"
for rep in 1 2; do NO_PLOT=1 APPEND=1 BIN_DIR=.device NAME=h200x2-labels2 DCKPT_HOST_CACHE_SIZE=1G RANKS=2 STUDIES=weak STEPS=60 EXAMPLES=labels MODES="collective local" ROWS_PER_RANK=512 COLS=2048 timeout 40 scripts/scaling-study.sh $OUT 2>/dev/null; done
for f in $OUT/*.csv; do awk -F, 'NR>1 {printf "%-6s %-10s %-10s P=%s steady %7.1f ms step %6.1f ms ms/step %6.2f stored %8.1f MiB\n", $1, $2, $7, $3, $13, 1000*$15/$9, $20, $17/1048576}' $f; done
