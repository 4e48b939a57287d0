#!/usr/bin/env bash
# Heat strong, 8 ranks on one H100: the collective step on its thread vs in the call, placed (2 cores a rank) and unbound.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} DCKPT_KERNEL_CACHE=/tmp/kc OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DCKPT_HOST_CACHE_SIZE=1G
one() { local tag=$1 place=$2; shift 2
  rm -rf /tmp/b; mkdir -p /tmp/b
  env "$@" DCKPT_PROFILE=1 timeout 120 mpirun $place -np 8 .device/heat --steps 60 --every 10 --rows 1024 --cols 8192 --device gpu --dir /tmp/b/run --report /tmp/b/l.csv > $OUT/prof-$tag.log 2>&1
  red=$(grep -E '^dckpt-profile [0-9]+ v[2-9][0-9] reduce ' $OUT/prof-$tag.log | awk '{print $5}' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  tail -1 /tmp/b/l.csv | awk -F, -v t=$tag -v r="$red" '{printf "%-22s steady %6.1f ms  ms/step %5.2f  reduce_s %.3f  reduce span median %s ms\n", t, $12, $19, $14, r}'
}
for rep in 1 2; do
  one placed-thread "--map-by slot:PE=2"
  one placed-call "--map-by slot:PE=2" DCKPT_OVERLAP=false
  one placed-local "--map-by slot:PE=2" DCKPT_COLLECTIVE=false
  one unbound-thread "--bind-to none"
done
