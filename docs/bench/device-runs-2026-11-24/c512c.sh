#!/usr/bin/env bash
# After the give-away fix: heat 4 ranks on one H100, chunk 128/512/4096 collective vs local; a v10 profile at 512; GPU tests; CUDA MPI test.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} DCKPT_KERNEL_CACHE=/tmp/kc OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DCKPT_HOST_CACHE_SIZE=1G
t=$SECONDS; timeout 200 .device/gpu-test --test-threads 1 > $OUT/gpu-test.log 2>&1; echo "gpu-test rc=$? ($((SECONDS-t)) s) $(grep 'test result' $OUT/gpu-test.log)"
t=$SECONDS; DCKPT_MPI_TEST_BACKEND=cuda timeout 150 mpirun --oversubscribe -np 3 .device/mpi-test > $OUT/mpi3.log 2>&1; echo "mpi-test cuda np=3 rc=$? ($((SECONDS-t)) s)"; grep -E "FAIL|panicked" $OUT/mpi3.log | tail -3
run() { local tag=$1; shift; rm -rf /tmp/b; mkdir -p /tmp/b
  timeout 120 env "$@" mpirun --map-by slot:PE=4 -np 4 .device/heat --steps 60 --every 10 --rows 2048 --cols 8192 --device gpu --dir /tmp/b/run --report /tmp/b/l.csv > /tmp/b/out.log 2>&1
  echo "$tag rc=$? $(tail -1 /tmp/b/l.csv | cut -d, -f6,7,11,12,13,14,16)"; }
echo "tag mode,chunk,first_call_s,steady_call_ms,dedup_s,reduce_s,stored"
for c in 128 512 4096; do for rep in 1 2; do
  run "c$c coll" DCKPT_CHUNK_SIZE=$c
  run "c$c local" DCKPT_CHUNK_SIZE=$c DCKPT_COLLECTIVE=false
done; done
rm -rf /tmp/b; mkdir -p /tmp/b
DCKPT_PROFILE=1 DCKPT_CHUNK_SIZE=512 timeout 120 mpirun --map-by slot:PE=4 -np 4 .device/heat --steps 60 --every 10 --rows 2048 --cols 8192 --device gpu --dir /tmp/b/run > $OUT/profile512.log 2>&1
p=$(grep '^dckpt-profile' $OUT/profile512.log | awk '{print $2}' | sort | head -1)
grep "^dckpt-profile $p v\(10\|20\) " $OUT/profile512.log | awk '{printf "%s %s %s | ", $3,$4,$5} $4=="settle"{print ""}'
