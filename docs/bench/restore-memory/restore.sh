#!/usr/bin/env bash
# Restores from memory (one verified pass per block) and from the GPU cache tier (peek): the GPU tests, CUDA MPI tests (2 ranks), RTM runs old vs new binary, a profile, and a run that holds files on the GPU.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} DCKPT_KERNEL_CACHE=/tmp/kc OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
t=$SECONDS; timeout 240 .device/gpu-test --test-threads 1 > $OUT/gpu-test.log 2>&1; echo "gpu-test rc=$? ($((SECONDS-t)) s) $(grep 'test result' $OUT/gpu-test.log)"; grep -E "FAILED|panicked" $OUT/gpu-test.log | head -5
t=$SECONDS; DCKPT_MPI_TEST_BACKEND=cuda timeout 150 mpirun --oversubscribe -np 2 .device/mpi-test > $OUT/mpi2.log 2>&1; echo "mpi-test cuda np=2 rc=$? ($((SECONDS-t)) s)"; grep -E "FAIL|panicked" $OUT/mpi2.log | tail -3
csv=header
for s in uniform variable; do for b in dckpt-old dckpt; do
  t=$SECONDS
  timeout 200 .device/$b bench-rtm --size 128M --versions 16 --sizes $s --order reverse --policies gap-aware --hints none,one --compute-ms 50 --cold --backend cuda --dir /tmp/rtm --csv $csv | sed "s/^/$b,/" >> $OUT/rtm.csv
  echo "rtm $s $b rc=$? ($((SECONDS-t)) s)"; csv=rows
done; done
cut -d, -f1,6,12,13,17,18,21,22 $OUT/rtm.csv | column -t -s,
DCKPT_PROFILE=1 timeout 200 .device/dckpt bench-rtm --size 128M --versions 16 --sizes uniform --order reverse --policies gap-aware --hints one --compute-ms 50 --cold --backend cuda --dir /tmp/rtm 2> $OUT/prof.log | tail -3
for k in restore-resolve restore-plan restore-fill restore-references restore-upload restore; do grep " $k " $OUT/prof.log | awk -v k=$k '{a[NR]=$5} END {n=asort(a); printf "%-20s n=%d median %.2f ms min %.2f max %.2f\n", k, n, a[int((n+1)/2)], a[1], a[n]}'; done
t=$SECONDS; timeout 200 .device/dckpt bench-rtm --size 128M --versions 16 --sizes uniform --order reverse --policies gap-aware --hints none --host-cache 260M --gpu-memory 8x --gpu-cache 1G --compute-ms 50 --backend cuda --dir /tmp/rtm 2>&1 | tail -4; echo "held-on-GPU rtm ($((SECONDS-t)) s)"
