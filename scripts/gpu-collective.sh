#!/usr/bin/env bash
# The collective step on GPUs, synchronous and through the asynchronous
# tiers: run on a machine with the CUDA driver, OpenMPI and no Rust
# toolchain, from the repository root, with the binaries that
# `scripts/gpu-check.sh --prepare` put in .device/.
#
#   scripts/gpu-collective.sh            the MPI tests on the CUDA backend (2 ranks), then
#                                        bench-collective mixed, sync vs tiered, at RANKS ranks
# Environment: RANKS ("2 8"), SIZE (256M per rank), CACHE (2G host cache per rank),
# SKIP_TEST=1 to skip the tests, OUT (target/gpu-collective).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-target/gpu-collective}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DCKPT_KERNEL_CACHE=${DCKPT_KERNEL_CACHE:-$PWD/.device/kernel-cache}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
if [ "${SKIP_TEST:-0}" != 1 ]; then
    echo "== mpi-tests on the CUDA backend, 2 ranks"
    DCKPT_MPI_TEST_BACKEND=cuda mpirun --oversubscribe -np 2 .device/mpi-test 2>&1 | tee "$out/mpi-test.log" | tail -n 3
fi
echo "== bench-collective mixed ${SIZE:-256M} per rank, cuda, sync and tiered (${CACHE:-2G} cache)"
DCKPT_BIN=.device/dckpt RANKS="" MIXED_RANKS="${RANKS:-2 8}" MIXED_SIZE="${SIZE:-256M}" MIXED_BACKEND=cuda \
    MIXED_TIERED="${CACHE:-2G}" NO_PLOT=1 scripts/bench-collective.sh "$out" | tail -n +1 | grep -v '^$'
