#!/bin/bash
# 16 CPU ranks on the 16-core host (one core a rank): where the collective step's 40 ms a version goes.
set -e
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export DCKPT_BACKEND=cpu DCKPT_HOST_CACHE_SIZE=256M
common=(NO_PLOT=1 BIN_DIR=.device STUDIES=weak STEPS=60 DEVICE=cpu ROWS_PER_RANK=256 COLS=2048 MODES="collective local" EXAMPLES="heat labels")
pe="--use-hwthread-cpus --map-by slot:PE=1"
run() { local name=$1; shift; env "${common[@]}" NAME=$name APPEND=1 "$@" scripts/scaling-study.sh "$OUT" 2>/dev/null; }
for rep in 1 2; do
  run placed RANKS=16
  run yield RANKS=16 MPIRUN_FLAGS="$pe --mca mpi_yield_when_idle 1"
  run unbound RANKS=16 MPIRUN_FLAGS="--bind-to none"
  run unbound-yield RANKS=16 MPIRUN_FLAGS="--bind-to none --mca mpi_yield_when_idle 1"
  run no-overlap RANKS=16 DCKPT_OVERLAP=false
  run r8 RANKS=8
done
for f in "$OUT"/*.csv; do
  awk -F, -v n="$(basename "$f" .csv)" 'NR>1 {printf "%-14s %-7s %-10s P=%2s steady %7.1f ms  step/version %6.1f ms  ms/step %6.2f\n", n, $2, $7, $3, $13, 1000*$15/$9, $20}' "$f"
done
