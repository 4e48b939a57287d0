#!/bin/bash
# CPU-backend scaling study on the device's 16-core host (issue #11: 1..64 CPU ranks).
# Usage: .device/cpuscale.sh a|b   (a: heat, b: labels + replicated); CSV in $OUT.
set -e
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export DCKPT_BACKEND=cpu DCKPT_HOST_CACHE_SIZE=256M
echo "cores $(nproc), $(grep -m1 'model name' /proc/cpuinfo)"; df -h /tmp | tail -1
common=(NO_PLOT=1 BIN_DIR=.device RANKS="1 2 4 8 16 32 64" STUDIES="strong weak" STEPS=60 DEVICE=cpu
        TOTAL_ROWS=4096 ROWS_PER_RANK=256 COLS=2048 TABLE=16M LOCAL=1M)
start=$(date +%s)
case $1 in
a) env "${common[@]}" NAME=h100-cpu-a EXAMPLES=heat scripts/scaling-study.sh "$OUT" ;;
b) env "${common[@]}" NAME=h100-cpu-b EXAMPLES="labels replicated" scripts/scaling-study.sh "$OUT" ;;
esac 2>&1 | grep -v '^wrote'
echo "wall $(( $(date +%s) - start )) s"
