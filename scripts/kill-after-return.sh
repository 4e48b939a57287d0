#!/usr/bin/env bash
# What a crash right after a checkpoint call returned costs (issue #44,
# item 1: the agent is for this): heat on RANKS ranks (CPU backend) dies
# right after its checkpoint of step k returned (the last rank aborts as
# the next step begins; mpirun kills the others), for k drawn at random,
# TRIES times; each time a new job restarts. A hit resumes from k; a miss
# from an earlier checkpoint (the flush of k died with the processes). Every
# restarted job must end with the uninterrupted plate (never wrong), and
# none may resume from past k. MODE=sync (the call returns once durable)
# must hit every time.
#   scripts/kill-after-return.sh [TRIES] [RANKS]   (default 20, 3; after cargo build --release --examples)
# Environment: MODE (async | sync), ROWS, COLS (the plate a rank: 512 x 8192 doubles), SEED.
set -euo pipefail
cd "$(dirname "$0")/.."
tries=${1:-20}
ranks=${2:-3}
bin=$(realpath target/release/examples/heat)
dckpt=$(realpath target/release/dckpt)
agent=${DCKPT_AGENT:-auto}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DCKPT_MODE=${MODE:-async}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
heat() { timeout 300 mpirun --oversubscribe -np "$ranks" "$bin" --device cpu --rows "${ROWS:-512}" \
    --cols "${COLS:-8192}" --steps 200 --every 10 "$@"; }
want=$(heat --dir "$work/whole" 2>/dev/null | grep -o 'digest [0-9a-f]*')
RANDOM=${SEED:-1}
hits=0 misses=0 lost=0
for t in $(seq "$tries"); do
    k=$(( (RANDOM % 18 + 1) * 10 ))   # 10 … 180
    dir="$work/try-$t"
    heat --dir "$dir" --crash-at "$k" >/dev/null 2>&1 && { echo "FAILED: the run meant to die at $k finished"; exit 1; }
    if [ "$agent" = auto ]; then
        # The agent alone: every journal finished before a new job starts.
        "$dckpt" agent --wait --timeout 120 || { "$dckpt" agent --status; echo "FAILED: try $t: the agent did not finish"; exit 1; }
        durable=$("$dckpt" inspect --dir "$dir/persistent/heat" 2>/dev/null | awk '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ {print $2}' | sort -n | tail -1)
        [ "${durable:-0}" -eq "$k" ] || { echo "FAILED: try $t: after the agent, the shared tier's newest version is ${durable:-none}, not $k"; exit 1; }
    fi
    got=$(heat --dir "$dir" 2>&1 | tee "$work/log" | grep -o 'digest [0-9a-f]*')
    [ "$got" = "$want" ] || { echo "FAILED: try $t (k = $k): $got, uninterrupted: $want"; cat "$work/log"; exit 1; }
    from=$(grep -o 'from the checkpoint of step [0-9]*' "$work/log" | grep -o '[0-9]*$' || echo 0)
    [ "$from" -le "$k" ] || { echo "FAILED: try $t resumed from step $from, past the crash at $k"; exit 1; }
    if [ "$from" -eq "$k" ]; then
        hits=$((hits + 1))
    else
        misses=$((misses + 1))
        lost=$((lost + k - from))
    fi
    echo "try $t: died right after the checkpoint of step $k returned; resumed from step $from"
done
echo "kill-after-return ($DCKPT_MODE, agent $agent, $ranks ranks, ${ROWS:-512} x ${COLS:-8192} doubles a rank): $tries tries," \
    "resumed from the last returned checkpoint $hits, from an earlier one $misses ($lost steps redone in all);" \
    "0 wrong"
if { [ "$DCKPT_MODE" = sync ] || [ "$agent" = auto ]; } && [ "$misses" -gt 0 ]; then
    echo "FAILED: $misses returned checkpoints lost ($DCKPT_MODE, agent $agent)"; exit 1
fi
