#!/bin/bash
# Overlap (the collective step on a background thread) against the step in the call, by cores a rank.
# PART=cpu: CPU backend, 4/8/16 ranks on 16 cores (4/2/1 cores a rank). PART=gpu: CUDA backend, one H100,
# 16 ranks (1 core each) and 2 ranks bound to one core each (OpenMPI's default) and placed (8 cores each).
set -e
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export DCKPT_KERNEL_CACHE=/tmp/kc
run() { local name=$1; shift; env "${common[@]}" NAME=$name APPEND=1 "$@" scripts/scaling-study.sh "$OUT" 2>/dev/null; }
if [ "$PART" = cpu ]; then
  export DCKPT_BACKEND=cpu DCKPT_HOST_CACHE_SIZE=256M
  common=(NO_PLOT=1 BIN_DIR=.device STUDIES=weak STEPS=60 DEVICE=cpu ROWS_PER_RANK=256 COLS=2048 TABLE=16M LOCAL=1M MODES="collective local" EXAMPLES="heat labels replicated")
  for rep in 1 2; do for p in 4 8 16; do
    run cpu-overlap RANKS=$p
    run cpu-sync RANKS=$p DCKPT_OVERLAP=false MODES=collective
  done; done
else
  export DCKPT_HOST_CACHE_SIZE=1G
  common=(NO_PLOT=1 BIN_DIR=.device STUDIES=weak STEPS=60 DEVICE=gpu ROWS_PER_RANK=2048 COLS=8192 MODES="collective local" EXAMPLES="heat labels")
  for rep in 1 2; do
    run gpu-overlap RANKS=16
    run gpu-sync RANKS=16 DCKPT_OVERLAP=false MODES=collective
    run gpu-bound2-overlap RANKS=2 MPIRUN_FLAGS=" "
    run gpu-bound2-sync RANKS=2 MPIRUN_FLAGS=" " DCKPT_OVERLAP=false MODES=collective
    run gpu-placed2-overlap RANKS=2
    run gpu-placed2-sync RANKS=2 DCKPT_OVERLAP=false MODES=collective
  done
fi
for f in "$OUT"/*.csv; do
  awk -F, -v n="$(basename "$f" .csv)" 'NR>1 {printf "%-20s %-10s %-10s P=%2s steady %7.1f ms  step/version %6.1f ms  ms/step %6.2f  compute/step %6.2f ms\n", n, $2, $7, $3, $13, 1000*$15/$9, $20, 1000*$10/$5}' "$f"
done | sort -k1,1 -k2,2 -k4,4 -k3,3
