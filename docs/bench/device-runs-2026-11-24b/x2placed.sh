#!/usr/bin/env bash
# Device nvidia-h200-x2, ranks placed (scripts/placement.sh: --map-by slot:PE=32/P): the scaling study on
# 2 GPUs again (the 2-rank rows of 2026-11-24 ran bound to one core), then item 11d's 2-rank setting.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} DCKPT_KERNEL_CACHE=/tmp/kc OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc
t=$SECONDS
NO_PLOT=1 BIN_DIR=.device NAME=h200x2-placed DCKPT_HOST_CACHE_SIZE=1G RANKS="1 2 4 8" STUDIES="strong weak" STEPS=60 EXAMPLES=heat DEVICE=gpu TOTAL_ROWS=8192 ROWS_PER_RANK=2048 COLS=8192 timeout 250 scripts/scaling-study.sh $OUT > $OUT/heat.log 2>&1
echo "heat rc=$? ($((SECONDS-t)) s)"; grep -c ms/step $OUT/heat.log
t=$SECONDS
NO_PLOT=1 APPEND=1 BIN_DIR=.device NAME=h200x2-placed DCKPT_HOST_CACHE_SIZE=1G RANKS="1 2 4 8" STUDIES=weak STEPS=60 EXAMPLES="labels replicated" ROWS_PER_RANK=512 COLS=2048 TABLE=64M LOCAL=4M timeout 150 scripts/scaling-study.sh $OUT > $OUT/rest.log 2>&1
echo "labels+replicated rc=$? ($((SECONDS-t)) s)"; grep -c ms/step $OUT/rest.log
t=$SECONDS
timeout 60 mpirun --map-by slot:PE=16 -np 2 .device/dckpt bench-collective --workload mixed --backend cuda --dir /tmp/mx --size 256M --versions 9 --tiered 1G --modes collective,local,full | grep '^{' > $OUT/np2-host.jsonl
echo "bench-collective np2 rc=$? ($((SECONDS-t)) s)"
awk -F, 'NR>1 {printf "%-6s %-10s %-10s P=%s steady %7.1f ms step %6.1f ms ms/step %6.2f stored %8.1f MiB\n", $1, $2, $7, $3, $13, 1000*$15/$9, $20, $17/1048576}' $OUT/h200x2-placed.csv
