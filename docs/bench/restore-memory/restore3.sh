#!/usr/bin/env bash
# Final binaries of the restore work: GPU tests, CUDA MPI tests (2, 3 ranks), RTM old vs new, e2e restore old vs new (1 GiB), files held on the GPU restored by peek.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} DCKPT_KERNEL_CACHE=/tmp/kc OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
t=$SECONDS; timeout 240 .device/gpu-test --test-threads 1 > $OUT/gpu-test.log 2>&1; echo "gpu-test rc=$? ($((SECONDS-t)) s) $(grep 'test result' $OUT/gpu-test.log)"; grep -E "FAILED|panicked" $OUT/gpu-test.log | head -5
for np in 2 3; do t=$SECONDS; DCKPT_MPI_TEST_BACKEND=cuda timeout 150 mpirun --oversubscribe -np $np .device/mpi-test > $OUT/mpi$np.log 2>&1; echo "mpi-test cuda np=$np rc=$? ($((SECONDS-t)) s)"; grep -E "FAIL|panicked" $OUT/mpi$np.log | tail -3; done
csv=header
for s in uniform variable; do for b in dckpt-old dckpt; do
  t=$SECONDS
  timeout 200 .device/$b bench-rtm --size 128M --versions 16 --sizes $s --order reverse --policies gap-aware --hints none,one --compute-ms 50 --cold --backend cuda --dir /tmp/rtm --csv $csv | sed "s/^/$b,/" >> $OUT/rtm.csv
  echo "rtm $s $b rc=$? ($((SECONDS-t)) s)"; csv=rows
done; done
for b in dckpt-old dckpt; do for w in scattered:0.01 clustered:0.01; do
  rm -rf /tmp/e2e; t=$SECONDS
  timeout 200 .device/$b bench --e2e /tmp/e2e --synthetic $w --size 1G --versions 10 --method tree --chunk-size 128 --backend cuda 2>&1 | grep -E "reopen|restore phases" | sed "s/^/$b $w: /"
  echo "$b $w rc=$? ($((SECONDS-t)) s)"
done; done
t=$SECONDS; DCKPT_PROFILE=1 timeout 200 .device/dckpt bench-rtm --size 128M --versions 16 --sizes uniform --order reverse --policies gap-aware --hints none --host-cache 1G --gpu-memory 8x --gpu-cache 512M --compute-ms 50 --backend cuda --dir /tmp/rtm 2> $OUT/prof-held.log | tail -3; echo "held rtm rc=$? ($((SECONDS-t)) s)"
grep -E " (restore|restore-peek|cuda-hand-over) " $OUT/prof-held.log | awk '{print $3, $4, $5}' | tr '\n' ';'; echo
