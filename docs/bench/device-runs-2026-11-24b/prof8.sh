#!/usr/bin/env bash
# Heat strong, 8 ranks on one H100 (2 cores a rank, as 16 ranks on 2 x H200): where the collective step's time goes.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} DCKPT_KERNEL_CACHE=/tmp/kc OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DCKPT_HOST_CACHE_SIZE=1G
summ() { python3 - "$1" <<'PY'
import collections, re, statistics, sys
d = collections.defaultdict(list)
for l in open(sys.argv[1]):
    m = re.match(r'^dckpt-profile (\d+) v(\d+) (\S+) ([0-9.]+)$', l.strip())
    if m and int(m.group(2)) >= 20:
        d[m.group(3)].append(float(m.group(4)))
print("  " + "  ".join(f"{k} {statistics.median(v):.2f}/{max(v):.2f}" for k, v in d.items()))
PY
}
for mode in collective local collective; do
  rm -rf /tmp/b; mkdir -p /tmp/b
  env $([ $mode = local ] && echo DCKPT_COLLECTIVE=false) DCKPT_PROFILE=1 timeout 120 mpirun --map-by slot:PE=2 -np 8 .device/heat --steps 60 --every 10 --rows 1024 --cols 8192 --device gpu --dir /tmp/b/run --report /tmp/b/l.csv > $OUT/prof-$mode.log 2>&1
  echo "== $mode: steady $(tail -1 /tmp/b/l.csv | cut -d, -f13) ms, reduce_s $(tail -1 /tmp/b/l.csv | cut -d, -f15), ms/step $(tail -1 /tmp/b/l.csv | cut -d, -f20)"
  summ $OUT/prof-$mode.log
done
