#!/usr/bin/env bash
# One example under mpirun, killed mid-run and restarted, must end with the
# data of a run never interrupted (each example prints "digest HEX" at the
# end and "restarted from the checkpoint of ... STEP" when it restarts):
#   1. an uninterrupted run;
#   2. a run whose last rank aborts at step CRASH_AT (what SIGKILL leaves;
#      synchronous checkpoints, so the one of step RESUME is durable);
#   3. a run of the same job that must restart from step RESUME and end
#      with the same digest.
#   scripts/kill-restart.sh EXAMPLE_BIN RANKS CRASH_AT RESUME [ARGS...]
# ARGS go to every run (sizes, steps); the work directory is the script's.
set -euo pipefail
[ $# -ge 4 ] || { echo "usage: $0 EXAMPLE_BIN RANKS CRASH_AT RESUME [ARGS...]" >&2; exit 2; }
bin=$(realpath "$1")
ranks=$2 crash_at=$3 resume=$4
shift 4
name=$(basename "$bin")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() { timeout 300 mpirun --oversubscribe -np "$ranks" "$bin" "$@"; }
run "$@" --dir "$work/clean" >"$work/clean.log" || { echo "FAILED: $name: the uninterrupted run"; cat "$work/clean.log"; exit 1; }
want=$(grep -o 'digest [0-9a-f]*' "$work/clean.log")
if DCKPT_MODE=sync run "$@" --dir "$work/crash" --crash-at "$crash_at" >"$work/crash.log" 2>&1; then
    echo "FAILED: $name: the run meant to die at step $crash_at finished"; exit 1
fi
run "$@" --dir "$work/crash" >"$work/log" || { echo "FAILED: $name: the restarted run"; cat "$work/log"; exit 1; }
grep -Eq "restarted from the checkpoint of [a-z]+ $resume\$" "$work/log" ||
    { echo "FAILED: $name: no restart from step $resume"; cat "$work/log"; exit 1; }
got=$(grep -o 'digest [0-9a-f]*' "$work/log")
[ "$got" = "$want" ] || { echo "FAILED: $name: killed at step $crash_at, restarted: $got, uninterrupted: $want"; exit 1; }
echo "$name: $ranks ranks killed at step $crash_at, restarted from step $resume: the same data as an uninterrupted run"
# The data of the clean run, for the caller.
cp "$work/clean.log" "${KILL_RESTART_LOG:-/dev/null}"
