#!/usr/bin/env bash
# The Runtime on a GPU machine, as an application calls it (issue #27's
# figures): run there from the repository root with the binaries of
# `scripts/gpu-check.sh --prepare` in .device/.
#
#   scripts/runtime-check.sh     the GPU tests and the MPI tests on the CUDA backend (2 ranks where
#                                there are 2 GPUs), then `dckpt bench-runtime` on 1 rank (and on 2)
#
# Environment: SIZES (default "256M 1G 4G"), CHANGES ("0.01 0.10"), VERSIONS (8),
# SKIP_TEST=1, EMIT=1 (also compile the kernels ahead of time into OUT),
# OUT (default target/runtime-check). OUT gets table.txt and results.tgz
# (every run's JSON, table and DCKPT_PROFILE summary); the last lines
# printed are the table.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-target/runtime-check}
work=${WORK:-/tmp/dckpt-runtime-check}
rm -rf "$work"; mkdir -p "$out" "$work/runs"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
export DCKPT_KERNEL_CACHE=$work/kernel-cache
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
.device/dckpt kernels | head -3
if [ "${EMIT:-0}" = 1 ]; then .device/dckpt kernels --emit "$out"; fi

if [ "${SKIP_TEST:-0}" != 1 ]; then
    echo "== GPU tests"
    timeout 300 .device/gpu-test --test-threads=1 >"$work/runs/gpu-test.log" 2>&1
    grep -E "test result|FAILED|panicked" "$work/runs/gpu-test.log" | head
    np=$(( gpus >= 2 ? 2 : 1 ))
    echo "== MPI tests on the CUDA backend, $np rank(s)"
    DCKPT_MPI_TEST_BACKEND=cuda timeout 300 mpirun --bind-to none -np "$np" .device/mpi-test >"$work/runs/mpi-test.log" 2>&1
    echo "rc=$?"; grep -E "FAILED|panicked|runtime ok" "$work/runs/mpi-test.log" | head -5
fi

run() { # name, ranks, args...
    local name=$1 ranks=$2; shift 2
    DCKPT_PROFILE=1 mpirun --bind-to none -np "$ranks" .device/dckpt bench-runtime --dir "$work/$name" \
        --json "$work/runs/$name.json" "$@" >"$work/runs/$name.txt" 2>"$work/runs/$name.prof"
    echo "rc=$? $name"; head -12 "$work/runs/$name.txt"
    python3 scripts/profile-summary.py "$work/runs/$name.prof" >"$work/runs/$name.summary"; rm -f "$work/runs/$name.prof"
    rm -rf "${work:?}/$name"
}
for size in ${SIZES:-256M 1G 4G}; do
    for change in ${CHANGES:-0.01 0.10}; do
        run "d1-$size-$change" 1 --size "$size" --change "$change" --versions "${VERSIONS:-8}"
    done
done
# The same largest case with TieredEngine timed first (an order effect shows as the two swapping).
run "d1-4G-0.01-engine-first" 1 --size 4G --change 0.01 --versions "${VERSIONS:-8}" --engine-first
run "h1-256M-0.01" 1 --size 256M --change 0.01 --memory host --versions "${VERSIONS:-8}"
if [ "$gpus" -ge 2 ]; then
    for mode in collective local-only; do
        run "d2-4G-0.01-$mode" 2 --size 4G --change 0.01 --shared-base "--$mode" --versions "${VERSIONS:-8}" --no-engine
    done
fi
python3 - "$work/runs" >"$out/table.txt" <<'PY'
import json, sys, glob, os
print(f"{'run':26} {'call med':>9} {'max':>8} {'first':>8} {'engine':>8} {'naive':>8} {'drain':>8} {'lat+rst':>8} spill")
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    r = json.load(open(f))
    naive = r["naive_copy_ms"] + r["naive_write_ms"]
    print(f"{os.path.basename(f)[:-5]:26} {r['median_ms']:9.2f} {r['max_ms']:8.2f} {r['first_ms']:8.1f} "
          f"{r['engine_median_ms']:8.2f} {naive:8.1f} {r['drain_ms']:8.1f} {r['latest_ms']+r['restart_ms']:8.1f} {r['spilled_calls']}")
PY
tar -czf "$out/results.tgz" -C "$work" runs
echo "== table (ms; slowest rank)"; cat "$out/table.txt"
