#!/usr/bin/env bash
# Issue #10's 2-rank gap: mpirun binds each of 2 ranks to one core by default (np <= 2).
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} DCKPT_KERNEL_CACHE=$PWD/.device/kernel-cache OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DCKPT_HOST_CACHE_SIZE=1G
nvidia-smi --query-gpu=name --format=csv,noheader; nproc
mpirun -np 2 --report-bindings true 2>&1 | head -2
run() { local tag=$1 ex=$2; shift 2; rm -rf /tmp/b; mkdir -p /tmp/b
  local args="--rows 4096 --cols 8192 --device gpu"; [ $ex = labels ] && args=""
  timeout 120 env "$@" .device/$ex --steps 60 --every 10 $args --dir /tmp/b/run --report /tmp/b/l.csv > /tmp/b/out.log 2>&1
  echo "$tag $ex rc=$? $(tail -1 /tmp/b/l.csv | cut -d, -f6,12,14,15)"; }
for ex in ${EXS:-heat labels}; do
  for m in collective local; do
    e=(); [ $m = local ] && e=(DCKPT_COLLECTIVE=false)
    run "core      $m" $ex "${e[@]}" mpirun -np 2
    run "none      $m" $ex "${e[@]}" mpirun --bind-to none -np 2
    run "PE8       $m" $ex "${e[@]}" mpirun --map-by slot:PE=8 -np 2
  done
  run "core no-overlap collective" $ex DCKPT_OVERLAP=false mpirun -np 2
  run "core      collective(again)" $ex mpirun -np 2
  run "PE8       collective(again)" $ex mpirun --map-by slot:PE=8 -np 2
done
rm -rf /tmp/b; mkdir -p /tmp/b
DCKPT_PROFILE=1 timeout 120 mpirun -np 2 .device/heat --steps 60 --every 10 --rows 4096 --cols 8192 --device gpu --dir /tmp/b/run > $OUT/profile-core.log 2>&1
rm -rf /tmp/b; mkdir -p /tmp/b
DCKPT_PROFILE=1 timeout 120 mpirun --map-by slot:PE=8 -np 2 .device/heat --steps 60 --every 10 --rows 4096 --cols 8192 --device gpu --dir /tmp/b/run > $OUT/profile-pe8.log 2>&1
echo done
