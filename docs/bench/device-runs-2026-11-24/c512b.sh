#!/usr/bin/env bash
# Heat at 4 ranks on one H100, chunk 512 and 128: where the first version's collective step goes (profile).
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} DCKPT_KERNEL_CACHE=/tmp/kc OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DCKPT_HOST_CACHE_SIZE=1G
for c in 512 128 512; do
  rm -rf /tmp/b; mkdir -p /tmp/b
  DCKPT_PROFILE=1 DCKPT_CHUNK_SIZE=$c timeout 120 mpirun --map-by slot:PE=4 -np 4 .device/heat --steps 60 --every 10 --rows 2048 --cols 8192 --device gpu --dir /tmp/b/run --report /tmp/b/l.csv > $OUT/profile$c.log 2>&1
  echo "== chunk $c: $(tail -1 /tmp/b/l.csv | cut -d, -f6,7,12,13,14)"
  p=$(grep '^dckpt-profile' $OUT/profile$c.log | awk '{print $2}' | sort | head -1)
  grep "^dckpt-profile $p v\(10\|20\) " $OUT/profile$c.log | awk '{printf "%s %s %s | ", $3,$4,$5} $4=="settle"{print ""}'
  echo
done
