#!/usr/bin/env bash
# The tree reduction on the H100 host: reduce benchmark 1-16 ranks, CUDA MPI tests, the overlapped collective runs (per-call ratio).
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} DCKPT_KERNEL_CACHE=/tmp/kc OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
t=$SECONDS; RANKS="1 2 4 8 16" CASES="unique shared" REPEAT=5 MIXED_RANKS= NO_PLOT=1 DCKPT_BIN=.device/dckpt HOST_LABEL="H100 host, 16 cores" timeout 200 scripts/bench-collective.sh $OUT/h100-16core-tree > $OUT/log 2>&1; echo "reduce bench rc=$? ($((SECONDS-t)) s)"
awk -F, '$2==131072' $OUT/h100-16core-tree/reduce.csv
for np in 2 4; do t=$SECONDS; DCKPT_MPI_TEST_BACKEND=cuda timeout 150 mpirun --oversubscribe -np $np .device/mpi-test > $OUT/mpi$np.log 2>&1; echo "mpi-test cuda np=$np rc=$? ($((SECONDS-t)) s)"; grep -E "FAIL|panicked" $OUT/mpi$np.log | tail -3; done
: > $OUT/runs.jsonl; : > $OUT/prof.log
one() { local tag=$1 np=$2; shift 2; local t=$SECONDS
  line=$(DCKPT_PROFILE=1 timeout 150 mpirun --oversubscribe --map-by slot:PE=$((16 / np)) -np $np .device/dckpt bench-collective --workload mixed --backend cuda --dir /tmp/mx --versions 9 "$@" 2> >(grep dckpt-profile | sed "s/^/$tag /" >> $OUT/prof.log) | grep '^{')
  echo "$tag $line" >> $OUT/runs.jsonl; echo "$tag: $((SECONDS-t)) s" >&2; }
one "1G-np4-c0.01" 4 --size 1G --change 0.01 --tiered 2G --gpu-memory 2x --resident --modes collective,local
one "256M-np8" 8 --size 256M --tiered 1G --resident --modes collective,local
one "256M-np2" 2 --size 256M --tiered 1G --resident --modes collective,local
python3 .device/summ2.py $OUT/runs.jsonl
