#!/usr/bin/env bash
# Device: the collective step on a background thread (overlap) vs in the call; correctness first.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} DCKPT_KERNEL_CACHE=$PWD/.device/kernel-cache OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
part=${1:-1}
if [ "$part" = 1 ]; then
t=$SECONDS; timeout 150 .device/gpu-test --test-threads 1 > $OUT/gpu-test.log 2>&1; echo "gpu-test rc=$? ($((SECONDS-t)) s)"; grep -E "test result|panicked" $OUT/gpu-test.log | tail -3
for np in 2 3; do t=$SECONDS; DCKPT_MPI_TEST_BACKEND=cuda timeout 150 mpirun --oversubscribe -np $np .device/mpi-test > $OUT/mpi$np.log 2>&1; echo "mpi-test cuda np=$np rc=$? ($((SECONDS-t)) s)"; grep -E "FAIL|panicked|GPU cache" $OUT/mpi$np.log | tail -3; done
fi
: > $OUT/runs.jsonl; : > $OUT/prof.log
one() { local tag=$1 np=$2; shift 2; local t=$SECONDS
  line=$(DCKPT_PROFILE=1 timeout 150 mpirun --oversubscribe --map-by slot:PE=$((16 / np)) -np $np .device/dckpt bench-collective --workload mixed --backend cuda --dir /tmp/mx "$@" 2> >(grep -E " (settle[a-z-]*|reduce|give-away|agree-[a-z]*|dedup-local|regions|cache) " | sed "s/^/$tag /" >> $OUT/prof.log) | grep '^{')
  echo "$tag $line" >> $OUT/runs.jsonl; echo "$tag: $((SECONDS-t)) s" >&2; }
if [ "$part" = 1 ]; then
one "1G-np4-c0.01-resident-overlap" 4 --size 1G --change 0.01 --tiered 2G --gpu-memory 2x --resident
one "1G-np4-c0.01-resident-incall" 4 --size 1G --change 0.01 --tiered 2G --gpu-memory 2x --resident --no-overlap --modes collective,local
else
one "256M-np2-resident-overlap" 2 --size 256M --tiered 1G --resident
one "256M-np2-resident-incall" 2 --size 256M --tiered 1G --resident --no-overlap --modes collective,local
one "256M-np8-resident-overlap" 8 --size 256M --tiered 1G --resident
one "256M-np8-resident-incall" 8 --size 256M --tiered 1G --resident --no-overlap --modes collective,local
one "1G-np4-c0.01-host-overlap" 4 --size 1G --change 0.01 --tiered 2G --gpu-memory 2x --modes collective,local
fi
python3 .device/summ2.py $OUT/runs.jsonl
