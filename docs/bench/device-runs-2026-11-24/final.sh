#!/usr/bin/env bash
# Final checks of the session's binaries on the H100: GPU tests, CUDA MPI tests (2, 3 ranks), the placement warning, a tree reduce point.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} DCKPT_KERNEL_CACHE=/tmp/kc OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DCKPT_HOST_CACHE_SIZE=1G
t=$SECONDS; timeout 200 .device/gpu-test --test-threads 1 > $OUT/gpu-test.log 2>&1; echo "gpu-test rc=$? ($((SECONDS-t)) s) $(grep 'test result' $OUT/gpu-test.log)"
for np in 2 3; do t=$SECONDS; DCKPT_MPI_TEST_BACKEND=cuda timeout 150 mpirun --oversubscribe -np $np .device/mpi-test > $OUT/mpi$np.log 2>&1; echo "mpi-test cuda np=$np rc=$? ($((SECONDS-t)) s)"; grep -E "FAIL|panicked" $OUT/mpi$np.log | tail -3; done
rm -rf /tmp/b; timeout 60 mpirun -np 2 .device/heat --steps 20 --every 10 --rows 512 --cols 1024 --device gpu --dir /tmp/b 2>&1 | grep -c "dckpt: warning: a rank is bound" | sed 's/^/default binding, warnings: /'
rm -rf /tmp/b; timeout 60 mpirun --bind-to none -np 2 .device/heat --steps 20 --every 10 --rows 512 --cols 1024 --device gpu --dir /tmp/b 2>&1 | grep -c "dckpt: warning" | sed 's/^/--bind-to none, warnings: /'
for np in 2 16; do mpirun --use-hwthread-cpus --map-by slot:PE=$((16/np)) -np $np .device/dckpt bench-collective --workload reduce --threshold 131072 --case unique --repeat 5 | tail -1; done
