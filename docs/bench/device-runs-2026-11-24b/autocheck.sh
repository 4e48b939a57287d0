#!/bin/bash
# overlap = auto (the new default) against on, CPU backend, 16/32/64 ranks on the 16-core host.
set -e
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export DCKPT_BACKEND=cpu DCKPT_HOST_CACHE_SIZE=256M
common=(NO_PLOT=1 BIN_DIR=.device STUDIES=weak STEPS=60 DEVICE=cpu ROWS_PER_RANK=256 COLS=2048 TABLE=16M LOCAL=1M EXAMPLES="heat replicated")
run() { local name=$1; shift; env "${common[@]}" NAME=$name APPEND=1 "$@" scripts/scaling-study.sh "$OUT" 2>/dev/null; }
for p in 16 32 64; do
  run auto RANKS=$p MODES="collective local"
  run on RANKS=$p MODES=collective DCKPT_OVERLAP=true
done
for f in "$OUT"/*.csv; do
  awk -F, -v n="$(basename "$f" .csv)" 'NR>1 {printf "%-5s %-10s %-10s P=%2s steady %7.1f ms  step/version %6.1f ms  ms/step %6.2f\n", n, $2, $7, $3, $13, 1000*$15/$9, $20}' "$f"
done | sort -k2,2 -k4,4 -k3,3 -k1,1
