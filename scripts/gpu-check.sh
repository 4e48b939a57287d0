#!/usr/bin/env bash
# The GPU check: run on a machine with the CUDA driver and no Rust toolchain,
# from the repository root, with the prebuilt binaries in .device/.
#
#   scripts/gpu-check.sh --prepare     (here, with Rust) build and copy the binaries to .device/
#   scripts/gpu-check.sh [SIZE]        (there) identical-bytes test, GPU restore, then the benchmark
#
# Environment: CHANGES, SHAPES, CHUNKS, METHOD (all), GPU_MEMORY (budgets to
# compare, e.g. "1.5x 8x"), SKIP_TEST=1 (benchmark only), OUT.
#
# Output: the test log and one JSON per workload under ${OUT:-target/gpu-check}.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--prepare" ]; then
    cargo build --release
    test_bin=$(cargo test --release --no-run --test gpu --message-format=json 2>/dev/null |
        python3 -c 'import json,sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable") and "/deps/gpu-" in m["executable"]][-1])')
    mpi_bin=$(cargo test --release --no-run --test mpi --message-format=json 2>/dev/null |
        python3 -c 'import json,sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable") and "/deps/mpi-" in m["executable"]][-1])')
    cargo build --release --examples
    mkdir -p .device
    strip -o .device/dckpt target/release/dckpt
    strip -o .device/gpu-test "$test_bin"
    strip -o .device/mpi-test "$mpi_bin"
    strip -o .device/collective_sim target/release/examples/collective_sim
    for ex in heat labels replicated adjoint; do strip -o ".device/$ex" "target/release/examples/$ex"; done
    echo "prepared .device/: $(ls .device | tr '\n' ' ')"
    exit 0
fi
size=${1:-4G}
out=${OUT:-target/gpu-check}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DCKPT_KERNEL_CACHE=${DCKPT_KERNEL_CACHE:-$PWD/.device/kernel-cache}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
if [ "${SKIP_TEST:-0}" != 1 ]; then
    echo "== identical bytes and GPU restore"
    set -o pipefail
    .device/gpu-test --test-threads=1 --nocapture 2>&1 | tee "$out/gpu-test.log" | grep -E "^test |test result|sequences|FAILED|panicked"
fi
echo "== benchmark: 10 versions of $size, chunk sizes ${CHUNKS:-64,128,512}, GPU memory ${GPU_MEMORY:-1.5x}"
restore=(--restore-dir "${TMPDIR:-/tmp}")
for change in ${CHANGES:-0.01 0.10 1.0}; do
    for shape in ${SHAPES:-scattered clustered}; do
        [ "$change" = 1.0 ] && [ "$shape" = clustered ] && continue
        for mem in ${GPU_MEMORY:-1.5x}; do
            echo "-- $shape:$change, --gpu-memory $mem"
            .device/dckpt bench --backend cuda --synthetic "$shape:$change" --size "$size" --versions 10 \
                --method "${METHOD:-all}" --chunk-sizes "${CHUNKS:-64,128,512}" --gpu-memory "$mem" "${restore[@]}" \
                --json "$out/gpu-$shape-$change-$mem.json" 2>&1 | grep -v '^gpu-profile'
            restore=()
        done
    done
done
