#!/usr/bin/env bash
# The heat example (examples/heat/) under mpirun: an uninterrupted run,
# then runs where one rank dies (abort, what SIGKILL leaves) at a step
# between checkpoints and the job is started again; each restarted run must
# end with the same plate, bit for bit (the digest rank 0 prints, the same
# however the plate is split). Then, with 4 ranks: a job of 4 killed and
# restarted on 3 and on 2 ranks (each reading its rows out of the 4 old
# ranks' regions).
#   scripts/heat-restart.sh [RANKS] [EXAMPLE_BIN]   (default 4, target/release/examples/heat)
# DEVICE=gpu keeps the plate in GPU memory (default auto: the GPU where there
# is one); with DEVICE=gpu the GPU's plate must also equal the CPU's, and a
# job killed on the GPU must restart on the CPU (--device cpu) with it.
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${1:-4}
bin=$(realpath "${2:-target/release/examples/heat}")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
device=${DEVICE:-auto}
heat() { timeout 300 mpirun --oversubscribe -np "$ranks" "$bin" --steps 200 --every 20 --rows 128 --cols 512 --device "$device" "$@"; }
want=$(heat --dir "$work/clean" | tee "$work/log" | grep -o 'digest [0-9a-f]*')
grep -o 'the plate is in [A-Za-z]* memory' "$work/log"
if [ "$device" = gpu ]; then
    cpu=$(heat --dir "$work/clean-cpu" --device cpu | grep -o 'digest [0-9a-f]*')
    [ "$cpu" = "$want" ] || { echo "FAILED: the GPU's plate ($want) differs from the CPU's ($cpu)"; exit 1; }
    echo "heat: the GPU's plate equals the CPU's"
    dir="$work/gpu-to-cpu"
    # Synchronous checkpoints: the one of step 120 is durable when it dies.
    DCKPT_MODE=sync heat --dir "$dir" --crash-at 130 >/dev/null 2>&1 && { echo "FAILED: the GPU run meant to die finished"; exit 1; }
    got=$(heat --dir "$dir" --device cpu | tee "$work/log" | grep -o 'digest [0-9a-f]*')
    grep -q "the plate is in host memory" "$work/log" && grep -q "from the checkpoint of step 120" "$work/log" ||
        { echo "FAILED: no restart on the host"; cat "$work/log"; exit 1; }
    [ "$got" = "$want" ] || { echo "FAILED: killed on the GPU, restarted on the CPU: $got, uninterrupted: $want"; exit 1; }
    echo "heat: killed on the GPU at step 130, restarted in host memory from step 120: same plate"
    # Killed while diffs wait in the GPU cache tier: a host cache of two
    # 4 MiB segments, a slow disk (each file durable 300 ms late), a GPU cache.
    held() {
        env DCKPT_HOST_CACHE_SIZE=8M DCKPT_GPU_MEMORY=256M DCKPT_GPU_CACHE_SIZE=64M \
            DCKPT_DELAY_AT=store.file_durable:300 timeout 300 mpirun --oversubscribe -np "$ranks" "$bin" \
            --steps 200 --every 10 --rows 512 --cols 1024 --device gpu "$@"
    }
    want_held=$(held --dir "$work/held-clean" | tee "$work/log" | grep -o 'digest [0-9a-f]*')
    grep -o '[0-9]* checkpoint calls returned with their diff held on the GPU' "$work/log" ||
        { echo "FAILED: no diff was held on the GPU"; cat "$work/log"; exit 1; }
    # Step 100 committed first (a run that ends there), then a run that dies
    # at step 190 with the newer diffs still on the GPU or in flight.
    held --dir "$work/held" --steps 100 >/dev/null
    held --dir "$work/held" --crash-at 190 >/dev/null 2>&1 && { echo "FAILED: the run meant to die finished"; exit 1; }
    got=$(held --dir "$work/held" | tee "$work/log" | grep -o 'digest [0-9a-f]*')
    from=$(grep -o 'from the checkpoint of step [0-9]*' "$work/log" | grep -o '[0-9]*$' || echo 0)
    [ "$from" -ge 100 ] || { echo "FAILED: killed with diffs on the GPU: restarted from step $from, not 100 or later"; cat "$work/log"; exit 1; }
    [ "$got" = "$want_held" ] || { echo "FAILED: killed with diffs on the GPU: $got, uninterrupted: $want_held"; cat "$work/log"; exit 1; }
    echo "heat: killed at step 190 with diffs held on the GPU, restarted from step $from: same plate"
fi
for crash in 7 45 130 199; do
    dir="$work/crash-$crash"
    if heat --dir "$dir" --crash-at "$crash" >/dev/null 2>&1; then
        echo "FAILED: the run meant to die at step $crash finished"; exit 1
    fi
    got=$(heat --dir "$dir" | tee "$work/log" | grep -o 'digest [0-9a-f]*')
    [ "$got" = "$want" ] || { echo "FAILED: killed at step $crash, restarted: $got, uninterrupted: $want"; cat "$work/log"; exit 1; }
    echo "heat: killed at step $crash, restarted ($(grep -o 'from the checkpoint of step [0-9]*' "$work/log" || echo 'from the start')): same plate"
done

if [ "$ranks" = 4 ]; then
    # The same plate (384 rows) on 4, 3 and 2 ranks.
    plate() { timeout 300 mpirun --oversubscribe -np "$1" "$bin" --steps 200 --every 20 --rows $((384 / $1)) --cols 512 --device "$device" "${@:2}"; }
    want=$(plate 4 --dir "$work/p4" | grep -o 'digest [0-9a-f]*')
    for m in 3 2; do
        dir="$work/resize-$m"
        plate 4 --dir "$dir" --crash-at 130 >/dev/null 2>&1 && { echo "FAILED: the 4-rank run meant to die finished"; exit 1; }
        got=$(plate "$m" --dir "$dir" | tee "$work/log" | grep -o 'digest [0-9a-f]*')
        grep -q "restarted on $m ranks from the 4 ranks" "$work/log" || { echo "FAILED: no restart on $m ranks"; cat "$work/log"; exit 1; }
        [ "$got" = "$want" ] || { echo "FAILED: 4 ranks killed, restarted on $m: $got, uninterrupted: $want"; exit 1; }
        echo "heat: 4 ranks killed at step 130, restarted on $m ranks: same plate"
    done
fi
