#!/usr/bin/env bash
# Device nvidia-h200-x2: item 11d's setting (2 and 8 ranks over 2 GPUs), then the heat scaling study on 2 GPUs.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} DCKPT_KERNEL_CACHE=$PWD/.device/kernel-cache OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
t=$SECONDS; DCKPT_MPI_TEST_BACKEND=cuda timeout 120 mpirun --oversubscribe -np 4 .device/mpi-test > $OUT/mpi4.log 2>&1; echo "mpi-test cuda np=4 rc=$? ($((SECONDS-t)) s)"; grep -E "FAIL|panicked" $OUT/mpi4.log | tail -3
: > $OUT/runs.jsonl
one() { local tag=$1 np=$2; shift 2; local t=$SECONDS
  line=$(timeout 150 mpirun --oversubscribe --map-by slot:PE=$((32 / np)) -np $np .device/dckpt bench-collective --workload mixed --backend cuda --dir /tmp/mx --size 256M --versions 9 --tiered 1G "$@" | grep '^{')
  echo "$tag $line" >> $OUT/runs.jsonl; echo "$tag: $((SECONDS-t)) s" >&2; }
for np in 2 8; do
  one "256M-np$np-host" $np --modes collective,local,full
  one "256M-np$np-resident" $np --resident --modes collective,local,full
  one "256M-np$np-host-no-overlap" $np --no-overlap --modes collective
done
python3 .device/summ2.py $OUT/runs.jsonl
t=$SECONDS
BIN_DIR=.device NAME=h200x2 DCKPT_HOST_CACHE_SIZE=1G RANKS="1 2 4 8" STUDIES="strong weak" STEPS=60 EXAMPLES=heat DEVICE=gpu TOTAL_ROWS=8192 ROWS_PER_RANK=2048 COLS=8192 timeout 330 scripts/scaling-study.sh $OUT/scaling > $OUT/scaling.log 2>&1
echo "scaling heat rc=$? ($((SECONDS-t)) s)"; tail -5 $OUT/scaling.log; wc -l $OUT/scaling/*.csv
