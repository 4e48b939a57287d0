#!/usr/bin/env bash
# The heat example (examples/heat.rs) under mpirun: an uninterrupted run,
# then runs where one rank dies (abort, what SIGKILL leaves) at a step
# between checkpoints and the job is started again; each restarted run must
# end with the same plate, bit for bit (the digest rank 0 prints, the same
# however the plate is split). Then, with 4 ranks: a job of 4 killed and
# restarted on 3 and on 2 ranks (each reading its rows out of the 4 old
# ranks' regions).
#   scripts/heat-restart.sh [RANKS] [EXAMPLE_BIN]   (default 4, target/release/examples/heat)
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${1:-4}
bin=$(realpath "${2:-target/release/examples/heat}")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
heat() { timeout 300 mpirun --oversubscribe -np "$ranks" "$bin" --steps 200 --every 20 --rows 128 --cols 512 "$@"; }
want=$(heat --dir "$work/clean" | grep -o 'digest [0-9a-f]*')
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
    plate() { timeout 300 mpirun --oversubscribe -np "$1" "$bin" --steps 200 --every 20 --rows $((384 / $1)) --cols 512 "${@:2}"; }
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
