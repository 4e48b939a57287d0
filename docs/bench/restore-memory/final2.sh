#!/usr/bin/env bash
# Final checks of the session's binaries on the H100: GPU tests, CUDA MPI tests (2, 3 ranks), heat and adjoint on the GPU (2 ranks, placed).
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} DCKPT_KERNEL_CACHE=/tmp/kc OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DCKPT_HOST_CACHE_SIZE=1G
t=$SECONDS; timeout 240 .device/gpu-test --test-threads 1 > $OUT/gpu-test.log 2>&1; echo "gpu-test rc=$? ($((SECONDS-t)) s) $(grep 'test result' $OUT/gpu-test.log)"; grep -E "FAILED|panicked" -A1 $OUT/gpu-test.log | head -5
for np in 2 3; do t=$SECONDS; DCKPT_MPI_TEST_BACKEND=cuda timeout 150 mpirun --oversubscribe -np $np .device/mpi-test > $OUT/mpi$np.log 2>&1; echo "mpi-test cuda np=$np rc=$? ($((SECONDS-t)) s)"; grep -E "FAIL|panicked" $OUT/mpi$np.log | tail -3; done
rm -rf /tmp/h; timeout 120 mpirun --map-by slot:PE=8 -np 2 .device/heat --steps 40 --every 10 --rows 1024 --cols 2048 --device gpu --dir /tmp/h 2>&1 | tail -2; echo "heat rc=$?"
rm -rf /tmp/a; timeout 120 mpirun --map-by slot:PE=8 -np 2 .device/adjoint --dir /tmp/a 2>&1 | tail -3; echo "adjoint rc=$?"
