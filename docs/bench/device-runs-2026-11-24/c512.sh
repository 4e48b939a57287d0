#!/usr/bin/env bash
# Heat at 4 ranks on one H100: chunk 128 / 512 / 4096, collective vs local-only (placed ranks), then a profile at 512.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} DCKPT_KERNEL_CACHE=$PWD/.device/kernel-cache OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DCKPT_HOST_CACHE_SIZE=1G
nvidia-smi --query-gpu=name --format=csv,noheader
t=$SECONDS; DCKPT_MPI_TEST_BACKEND=cuda timeout 150 mpirun --oversubscribe -np 2 .device/mpi-test > $OUT/mpi2.log 2>&1; echo "mpi-test cuda np=2 rc=$? ($((SECONDS-t)) s)"; grep -E "FAIL|panicked" $OUT/mpi2.log | tail -3
run() { local tag=$1; shift; rm -rf /tmp/b; mkdir -p /tmp/b
  timeout 120 env "$@" mpirun --map-by slot:PE=4 -np 4 .device/heat --steps 60 --every 10 --rows 2048 --cols 8192 --device gpu --dir /tmp/b/run --report /tmp/b/l.csv > /tmp/b/out.log 2>&1
  echo "$tag rc=$? $(tail -1 /tmp/b/l.csv | cut -d, -f6,7,12,13,14,16)"; }
echo "tag mode,chunk,steady_call_ms,dedup_s,reduce_s,stored"
for c in 128 512 4096; do for rep in 1 2; do
  run "c$c coll" DCKPT_CHUNK_SIZE=$c
  run "c$c local" DCKPT_CHUNK_SIZE=$c DCKPT_COLLECTIVE=false
done; done
rm -rf /tmp/b; mkdir -p /tmp/b
DCKPT_PROFILE=1 DCKPT_CHUNK_SIZE=512 timeout 120 mpirun --map-by slot:PE=4 -np 4 .device/heat --steps 60 --every 10 --rows 2048 --cols 8192 --device gpu --dir /tmp/b/run > $OUT/profile512.log 2>&1
grep '^dckpt-profile' $OUT/profile512.log | awk '$3!="v10"{s[$4]+=$5; n[$4]++} END{for(k in s) printf "%-20s %10.2f (n=%d)\n", k, s[k]/n[k], n[k]}' | sort -k2 -nr | head -24
