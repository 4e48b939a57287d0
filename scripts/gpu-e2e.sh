#!/usr/bin/env bash
# End-to-end measurements on a GPU machine (no Rust needed), from the
# repository root with the binaries of `scripts/gpu-check.sh --prepare` in
# .device/: the identical-bytes test (CPU and GPU stores, reopened or not),
# then `dckpt bench --e2e` through a store: 10 versions of SIZE in device
# memory (CUDA) and in host memory (CPU path), Tree, 128 B chunks.
#
#   scripts/gpu-e2e.sh [SIZE]          default 4G; JSON + logs under ${OUT:-target/gpu-e2e}
#
# TIERED=6G also runs every workload through the asynchronous tiers (host
# cache of that size, local + shared directories beside the store) in the
# same process and prints what the application waits for either way.
# GPU_MEMORY (default 1.5x) and GPU_CACHE (the GPU cache tier's share of it:
# auto, 0 or a size) set the CUDA backend's device budget.
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:-4G}
out=${OUT:-target/gpu-e2e}
work=${DCKPT_E2E_DIR:-${TMPDIR:-/tmp}/dckpt-e2e}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DCKPT_KERNEL_CACHE=${DCKPT_KERNEL_CACHE:-$PWD/.device/kernel-cache}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
nproc; df -h "$(dirname "$work")" | tail -1
if [ "${SKIP_TEST:-0}" != 1 ]; then
    echo "== identical bytes (CPU = GPU, reopened and not) and GPU restore"
    .device/gpu-test --test-threads=1 --nocapture > "$out/gpu-test.log" 2>&1 && echo "gpu-test: ok" || { echo "gpu-test: FAILED"; tail -30 "$out/gpu-test.log"; }
    grep -E "^test |test result" "$out/gpu-test.log" | tail -6
fi
for spec in ${RUNS:-cuda:scattered:0.01 cuda:clustered:0.01 cuda:scattered:0.10 cpu:scattered:0.01}; do
    backend=${spec%%:*}; workload=${spec#*:}
    name="e2e-$backend-${workload/:/-}"
    echo "== $name ($size)"
    rm -rf "$work"
    .device/dckpt bench --e2e "$work" --backend "$backend" --synthetic "$workload" --size "$size" \
        --versions 10 --method tree --chunk-size 128 ${TIERED:+--tiered "$TIERED"} \
        --gpu-memory "${GPU_MEMORY:-1.5x}" ${TIERED:+--gpu-cache "${GPU_CACHE:-auto}"} \
        --json "$out/$name.json" 2>&1 | tee "$out/$name.txt" || true
    rm -rf "$work" "$work.tiered"
done
