#!/usr/bin/env bash
# The Runtime on a GPU machine, as an application calls it (issue #27's
# figures): run there from the repository root with the binaries of
# `scripts/gpu-check.sh --prepare` in .device/.
#
#   scripts/runtime-check.sh            kernels (ahead of time, then the node's cache), the GPU tests,
#                                       then `dckpt bench-runtime` on 1 rank (and 2 where there are 2 GPUs)
#
# Environment: SIZES (default "256M 1G 4G"), CHANGES ("0.01 0.10"), VERSIONS (6),
# SKIP_TEST=1, OUT (default target/runtime-check). Each run's JSON and log
# go to OUT; the last lines are a table.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-target/runtime-check}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export NCCL_NVLS_ENABLE=0
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
work=${WORK:-/tmp/dckpt-runtime-check}
rm -rf "$work"; mkdir -p "$work"
export DCKPT_KERNEL_CACHE=$work/kernel-cache

echo "== kernels ahead of time (NVRTC, no cache)"
/usr/bin/time -f "emit: %e s" .device/dckpt kernels --emit "$out/kernels" 2>&1
.device/dckpt kernels | head -5

echo "== first run with an empty kernel cache: 2 ranks (1 a GPU), 64M, profile"
DCKPT_PROFILE=1 /usr/bin/time -f "first run: %e s" mpirun --bind-to none -np 2 .device/dckpt bench-runtime \
    --size 64M --versions 3 --no-engine --dir "$work/first" 2>"$out/first-run.log" | tail -3
grep -E "kernels-|time|first run" "$out/first-run.log" | sort | uniq -c | head
tail -1 "$out/first-run.log"

if [ "${SKIP_TEST:-0}" != 1 ]; then
    echo "== GPU tests"
    timeout 300 .device/gpu-test --test-threads=1 2>&1 | tee "$out/gpu-test.log" | grep -E "test result|FAILED|panicked" | head
fi

run() { # name, ranks, args...
    local name=$1 ranks=$2; shift 2
    mpirun --bind-to none -np "$ranks" .device/dckpt bench-runtime --dir "$work/$name" --json "$out/$name.json" "$@" \
        >"$out/$name.log" 2>&1
    echo "rc=$? $name"; grep -vE "^dckpt: warning" "$out/$name.log" | head -12
    rm -rf "$work/$name"
}
for size in ${SIZES:-256M 1G 4G}; do
    for change in ${CHANGES:-0.01 0.10}; do
        run "d1-$size-$change" 1 --size "$size" --change "$change" --versions "${VERSIONS:-6}"
    done
done
run "h1-256M-0.01" 1 --size 256M --change 0.01 --memory host --versions "${VERSIONS:-6}"
if [ "$gpus" -ge 2 ]; then
    for mode in --collective --local-only; do
        run "d2-4G-0.01$mode" 2 --size 4G --change 0.01 --shared-base $mode --versions "${VERSIONS:-6}" --no-engine
    done
fi
echo "== table (ms; slowest rank)"
python3 - "$out" <<'PY'
import json, sys, glob, os
print(f"{'run':28} {'call med':>9} {'max':>8} {'first':>8} {'engine':>8} {'naive':>8} {'drain':>8} {'lat+rst':>8} spill")
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    r = json.load(open(f))
    naive = r["naive_copy_ms"] + r["naive_write_ms"]
    print(f"{os.path.basename(f)[:-5]:28} {r['median_ms']:9.2f} {r['max_ms']:8.2f} {r['first_ms']:8.1f} "
          f"{r['engine_median_ms']:8.2f} {naive:8.1f} {r['drain_ms']:8.1f} {r['latest_ms']+r['restart_ms']:8.1f} {r['spilled_calls']}")
PY
