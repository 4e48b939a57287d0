#!/usr/bin/env bash
# Pageable host memory to the device through two page-locked buffers: GPU tests, CUDA MPI tests, e2e restore H2D (1 GiB), host-buffer checkpoint calls (mixed, 256 MiB), old (adbdf1d) vs new.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} DCKPT_KERNEL_CACHE=/tmp/kc OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
t=$SECONDS; timeout 240 .device/gpu-test --test-threads 1 > $OUT/gpu-test.log 2>&1; echo "gpu-test rc=$? ($((SECONDS-t)) s) $(grep 'test result' $OUT/gpu-test.log)"; grep -E "FAILED|panicked" $OUT/gpu-test.log | head -5
t=$SECONDS; DCKPT_MPI_TEST_BACKEND=cuda timeout 150 mpirun --oversubscribe -np 2 .device/mpi-test > $OUT/mpi2.log 2>&1; echo "mpi-test cuda np=2 rc=$? ($((SECONDS-t)) s)"; grep -E "FAIL|panicked" $OUT/mpi2.log | tail -3
for b in dckpt-old dckpt; do for w in scattered:0.01 clustered:0.01; do
  rm -rf /tmp/e2e
  timeout 200 .device/$b bench --e2e /tmp/e2e --synthetic $w --size 1G --versions 10 --method tree --chunk-size 128 --backend cuda 2>&1 | grep -E "median incremental|reopen|restore phases" | sed "s/^/$b $w: /"
done; done
for np in 1 4; do for b in dckpt-old dckpt; do
  rm -rf /tmp/bc; timeout 200 mpirun --oversubscribe --map-by slot:PE=$((16/np)) -np $np .device/$b bench-collective --workload mixed --backend cuda --size 256M --versions 9 --tiered 1G --modes local,collective --dir /tmp/bc 2>/dev/null | grep '^{' > $OUT/mixed-$b-$np.json
  python3 -c "
import json,statistics as s,sys
d=json.load(open('$OUT/mixed-$b-$np.json'))
for m in d['modes']: print('$b np=$np', m['mode'], 'median incr call %.2f ms'%(s.median(m['version_seconds'][1:])*1e3), 'run %.3f s'%m['seconds'])
"
done; done
