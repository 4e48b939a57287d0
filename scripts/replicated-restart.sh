#!/usr/bin/env bash
# The replicated-data example (examples/replicated.rs) under mpirun: every
# rank holds the same table; the collective step must store it about once
# for all ranks (the run's stored bytes below 1/RANKS of the protected
# ones, some bytes referenced across ranks). Then a run killed mid-way
# (synchronous checkpoints: the one of step 30 is durable when it dies at
# 35) and started again must end with the data of a run never interrupted.
#   scripts/replicated-restart.sh [RANKS] [EXAMPLE_BIN]   (default 3, target/release/examples/replicated)
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${1:-3}
bin=$(realpath "${2:-target/release/examples/replicated}")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() { timeout 300 mpirun --oversubscribe -np "$ranks" "$bin" --steps 60 --every 10 --table 2M --local 32K "$@"; }
run --dir "$work/clean" > "$work/clean.log"
want=$(grep -o 'digest [0-9a-f]*' "$work/clean.log")
ratio=$(grep -o 'protected bytes ([0-9.]*)' "$work/clean.log" | grep -o '[0-9.]*)' | tr -d ')')
referenced=$(grep -o '[0-9]* bytes referenced' "$work/clean.log" | cut -d' ' -f1)
awk -v r="$ratio" -v p="$ranks" -v ref="$referenced" 'BEGIN { exit !(r < 1 / p && ref > 0) }' ||
    { echo "FAILED: the replicated table was not stored once (ratio $ratio, $referenced bytes referenced)"; cat "$work/clean.log"; exit 1; }
echo "replicated: $ranks ranks stored $ratio of the protected bytes ($referenced bytes referenced across ranks)"
if DCKPT_MODE=sync run --dir "$work/crash" --crash-at 35 >/dev/null 2>&1; then
    echo "FAILED: the run meant to die at step 35 finished"; exit 1
fi
run --dir "$work/crash" > "$work/log"
grep -q "restarted from the checkpoint of step 30" "$work/log" || { echo "FAILED: no restart from step 30"; cat "$work/log"; exit 1; }
got=$(grep -o 'digest [0-9a-f]*' "$work/log")
[ "$got" = "$want" ] || { echo "FAILED: killed at step 35, restarted: $got, uninterrupted: $want"; exit 1; }
echo "replicated: killed at step 35, restarted from step 30: same data"
