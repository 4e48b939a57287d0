#!/usr/bin/env bash
# The per-node agent (issue #44), heat on RANKS ranks (CPU backend), each
# part with an agent directory of its own in /dev/shm:
#  1. kill every rank right after the k-th call returned, 20 tries at random
#     k: the agent alone makes k durable before the new job starts, and the
#     job resumes from k (scripts/kill-after-return.sh, 0 misses);
#  2. the same with agent = "off": what is lost without it (printed);
#  3. the agent killed mid-flush (held by DCKPT_DELAY_AT in its first
#     journal, then SIGKILL): its journals stay, the next job's ranks finish
#     them (and say so), resume from k, same plate;
#  4. two jobs on one node, both killed after a returned call: one agent
#     finishes both, each from its own journal into its own stores, and
#     each job resumes from its own k with its own plate.
#   scripts/agent-test.sh [RANKS]   (after cargo build --release --bins --examples: the
#   examples turn on the crash points, DCKPT_DELAY_AT, for dckpt too)
# Environment: TRIES (part 1, default 20), OFF_TRIES (part 2, default 6).
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${1:-3}
heat_bin=$(realpath target/release/examples/heat)
dckpt=$(realpath target/release/dckpt)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
agents=/dev/shm/dckpt-agent-test-$$
cleanup() {
    # The test's own agents: each exits when idle; no need to wait for it.
    for d in "$agents"-*; do
        [ -d "$d" ] || continue
        pid=$("$dckpt" agent --dir "$d" --status --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["agent"] or "")' || true)
        [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
        rm -rf "$d"
    done
    rm -rf "$work"
}
trap cleanup EXIT
heat() { timeout 300 mpirun --oversubscribe -np "$ranks" "$heat_bin" --device cpu --rows 256 --cols 4096 \
    --steps 120 --every 10 "$@"; }
agent_pid() { "$dckpt" agent --dir "$1" --status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["agent"] or "")'; }
journals() { "$dckpt" agent --dir "$1" --status --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["journals"]))'; }
newest() { "$dckpt" inspect --dir "$1/persistent/heat" 2>/dev/null | awk '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ {print $2}' | sort -n | tail -1; }
from_of() { grep -o 'from the checkpoint of step [0-9]*' "$1" | grep -o '[0-9]*$' || echo 0; }

echo "agent test 1: kill after return, with the agent"
DCKPT_AGENT_DIR="$agents-1" scripts/kill-after-return.sh "${TRIES:-20}" "$ranks"

echo "agent test 2: kill after return, agent = off (what is lost without it)"
DCKPT_AGENT=off DCKPT_AGENT_DIR="$agents-2" scripts/kill-after-return.sh "${OFF_TRIES:-6}" "$ranks"

want=$(heat --dir "$work/whole" 2>/dev/null | grep -o 'digest [0-9a-f]*')

echo "agent test 3: the agent killed mid-flush"
export DCKPT_AGENT_DIR="$agents-3"
# The ranks' flush held back (1 s a file), so that versions are in flight
# when the job dies; the job starts the agent, which inherits the delays:
# 20 s in its first journal with work.
DCKPT_DELAY_AT=agent.finish:20000,store.file_durable:1000 heat --dir "$work/mid" --crash-at 70 >/dev/null 2>&1 &&
    { echo "FAILED: the run meant to die at 70 finished"; exit 1; }
pid=$(agent_pid "$agents-3")
[ -n "$pid" ] || { echo "FAILED: no agent runs after the job"; exit 1; }
sleep 1
kill -9 "$pid"
left=$(journals "$agents-3")
[ "$left" -gt 0 ] || { echo "FAILED: the agent finished before it was killed"; exit 1; }
echo "  agent $pid killed mid-flush; $left journal(s) left:"
"$dckpt" agent --dir "$agents-3" --status
DCKPT_LOG=info heat --dir "$work/mid" >"$work/mid.log" 2>&1 || { cat "$work/mid.log"; echo "FAILED: the job after the agent's death"; exit 1; }
got=$(grep -o 'digest [0-9a-f]*' "$work/mid.log")
[ "$got" = "$want" ] || { cat "$work/mid.log"; echo "FAILED: after the agent's death: $got, uninterrupted: $want"; exit 1; }
[ "$(from_of "$work/mid.log")" -eq 70 ] || { cat "$work/mid.log"; echo "FAILED: resumed from $(from_of "$work/mid.log"), not 70"; exit 1; }
grep -q 'finished the flush of version 70' "$work/mid.log" || { cat "$work/mid.log"; echo "FAILED: the ranks did not say they finished the flush"; exit 1; }
echo "  the next job finished the journals, resumed from 70, same plate"

echo "agent test 4: two jobs on one node"
export DCKPT_AGENT_DIR="$agents-4"
heat --dir "$work/jobA" --crash-at 50 >/dev/null 2>&1 &
a=$!
heat --dir "$work/jobB" --crash-at 90 >/dev/null 2>&1 &
b=$!
wait "$a" && { echo "FAILED: job A finished"; exit 1; }
wait "$b" && { echo "FAILED: job B finished"; exit 1; }
"$dckpt" agent --dir "$agents-4" --wait --timeout 120 || { "$dckpt" agent --dir "$agents-4" --status; echo "FAILED: the agent did not finish both"; exit 1; }
[ "$(newest "$work/jobA")" -eq 50 ] || { echo "FAILED: job A's newest durable version is $(newest "$work/jobA"), not 50"; exit 1; }
[ "$(newest "$work/jobB")" -eq 90 ] || { echo "FAILED: job B's newest durable version is $(newest "$work/jobB"), not 90"; exit 1; }
for j in A:50 B:90; do
    name=${j%%:*} k=${j##*:}
    heat --dir "$work/job$name" >"$work/job$name.log" 2>&1 || { cat "$work/job$name.log"; echo "FAILED: job $name's restart"; exit 1; }
    got=$(grep -o 'digest [0-9a-f]*' "$work/job$name.log")
    [ "$got" = "$want" ] || { echo "FAILED: job $name: $got, uninterrupted: $want"; exit 1; }
    [ "$(from_of "$work/job$name.log")" -eq "$k" ] || { echo "FAILED: job $name resumed from $(from_of "$work/job$name.log"), not $k"; exit 1; }
done
echo "  one agent finished both jobs (50 and 90), each resumed from its own, same plates"
echo "agent tests: passed"
