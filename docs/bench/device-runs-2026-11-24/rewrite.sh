#!/usr/bin/env bash
# The GPU rewrite built on the step's thread: GPU tests, CUDA MPI tests (2, 3 ranks), heat chunk 512 at 4 ranks (profile of v10/v20).
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} DCKPT_KERNEL_CACHE=/tmp/kc OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DCKPT_HOST_CACHE_SIZE=1G
t=$SECONDS; timeout 200 .device/gpu-test --test-threads 1 > $OUT/gpu-test.log 2>&1; echo "gpu-test rc=$? ($((SECONDS-t)) s) $(grep 'test result' $OUT/gpu-test.log)"
for np in 2 3; do t=$SECONDS; DCKPT_MPI_TEST_BACKEND=cuda timeout 150 mpirun --oversubscribe -np $np .device/mpi-test > $OUT/mpi$np.log 2>&1; echo "mpi-test cuda np=$np rc=$? ($((SECONDS-t)) s)"; grep -E "FAIL|panicked" $OUT/mpi$np.log | tail -3; done
for every in 10 30; do for m in coll local; do
  rm -rf /tmp/b; mkdir -p /tmp/b; e=(); [ $m = local ] && e=(DCKPT_COLLECTIVE=false)
  env "${e[@]}" DCKPT_PROFILE=1 DCKPT_CHUNK_SIZE=512 timeout 120 mpirun --map-by slot:PE=4 -np 4 .device/heat --steps 60 --every $every --rows 2048 --cols 8192 --device gpu --dir /tmp/b/run --report /tmp/b/l.csv > $OUT/p512-$m-$every.log 2>&1
  echo "every $every $m: $(tail -1 /tmp/b/l.csv | cut -d, -f6,7,11,12,13,14)"
done; done
p=$(grep '^dckpt-profile' $OUT/p512-coll-30.log | awk '{print $2}' | sort | head -1)
grep "^dckpt-profile $p v30 " $OUT/p512-coll-30.log | awk '{printf "%s %s %s | ", $3,$4,$5}'; echo
