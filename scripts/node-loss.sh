#!/usr/bin/env bash
# Surviving the loss of a node (issue #31), with the heat example under
# mpirun: emulated nodes (ranks_per_node = 1), each with its own node-local
# directory (scratch = .../node-{node}) and no shared tier. For each scheme
# (partner, xor:RANKS) a run dies (one rank aborts at a random step, or the
# whole mpirun is SIGKILLed at a random moment), node 1's directory is
# deleted whole, and the job started again must rebuild that node's files
# from the others and end with the same plate, bit for bit, as an
# uninterrupted run; the restart must come from a checkpoint, not the start.
# With redundancy none the same loss starts the job from the beginning, on
# purpose and said so, never a wrong plate and never a wedge.
#   scripts/node-loss.sh [RANKS] [EXAMPLE_BIN]   (default 3, target/release/examples/heat)
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${1:-3}
bin=$(realpath "${2:-target/release/examples/heat}")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
seed=${SEED:-$RANDOM}
RANDOM=$seed
echo "node-loss: $ranks ranks, one emulated node each, seed $seed"
conf() { # DIR SCHEME
    cat >"$1.toml" <<TOML
scratch = "$1/node-{node}"
redundancy = "$2"
ranks_per_node = 1
max_versions = 4
max_chain = 8
host_cache_size = "64M"
TOML
    echo "$1.toml"
}
heat() { timeout 120 mpirun --oversubscribe -np "$ranks" "$bin" --steps 200 --every 20 --rows 128 --cols 512 --device cpu "$@"; }
want=$(heat --config "$(conf "$work/clean" none)" | grep -o 'digest [0-9a-f]*')
for scheme in partner "xor:$ranks"; do
    for how in abort kill; do
        dir="$work/${scheme/:/-}-$how"
        cfg=$(conf "$dir" "$scheme")
        if [ "$how" = abort ]; then
            crash=$((45 + RANDOM % 150))
            heat --config "$cfg" --crash-at "$crash" >/dev/null 2>&1 && { echo "FAILED: the run meant to die finished"; exit 1; }
            what="rank $((ranks - 1)) aborted at step $crash"
        else
            heat --config "$cfg" >/dev/null 2>&1 &
            job=$!
            ms=$((800 + RANDOM % 1700))
            sleep "$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))"
            pkill -KILL -f "$dir.toml" || true
            kill -KILL "$job" 2>/dev/null || true
            wait "$job" 2>/dev/null || true
            what="mpirun and its ranks SIGKILLed after $ms ms"
        fi
        ls "$dir/node-1" >/dev/null 2>&1 || { echo "node-loss: ($what) nothing on node 1 yet; skipped"; continue; }
        rm -rf "$dir/node-1"
        got=$(heat --config "$cfg" 2>&1 | tee "$work/log" | grep -o 'digest [0-9a-f]*') || { echo "FAILED: $scheme, $what, node 1 lost: the restart failed"; cat "$work/log"; exit 1; }
        # A rebuild says what it did in a line or two, not dozens (XOR
        # restarts used to warn once per block and version).
        warned=$(grep -ci 'warn' "$work/log" || true)
        [ "$warned" -le 3 ] || { echo "FAILED: $scheme, $what, node 1 lost: $warned warnings"; cat "$work/log"; exit 1; }
        from=$(grep -o 'from the checkpoint of step [0-9]*' "$work/log" || echo 'from the start')
        [ "$got" = "$want" ] || { echo "FAILED: $scheme, $what, node 1 lost: $got, uninterrupted: $want"; cat "$work/log"; exit 1; }
        case "$from" in *start*) [ "$how" = kill ] || { echo "FAILED: $scheme: restarted from the start"; cat "$work/log"; exit 1; } ;; esac
        echo "node-loss: $scheme, $what, node 1's directory deleted: restarted $from, same plate, $warned warning(s)"
    done
done
# The newest copy of node 1's rank damaged too: that version cannot be
# rebuilt, so the job falls back to the one before (set aside everywhere,
# on every node's directory) and goes on to the same plate.
dir="$work/damaged-copy"
cfg=$(conf "$dir" partner)
heat --config "$cfg" --crash-at 130 >/dev/null 2>&1 && { echo "FAILED: the run meant to die finished"; exit 1; }
copy=$(ls "$dir"/node-2/*/redundancy/partner/rank-00001/*.bundle | tail -1)
python3 -c 'import sys; p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[len(b) // 2] ^= 0x40; open(p, "wb").write(b)' "$copy"
rm -rf "$dir/node-1"
got=$(heat --config "$cfg" 2>&1 | tee "$work/log" | grep -o 'digest [0-9a-f]*') || { echo "FAILED: damaged copy: the restart failed"; cat "$work/log"; exit 1; }
[ "$got" = "$want" ] || { echo "FAILED: damaged copy: $got, uninterrupted: $want"; cat "$work/log"; exit 1; }
echo "node-loss: partner, node 1 lost and its newest copy ($(basename "$copy")) damaged: restarted $(grep -o 'from the checkpoint of step [0-9]*' "$work/log"), same plate"
# Without copies, the same loss leaves no version on every rank: the job
# says so and starts from the beginning on purpose, the other ranks'
# versions set aside (it used to wedge: every later run refused its first
# checkpoint as "not newer"), and ends with the same plate; the run after
# that restarts from its own checkpoints. Never a wrong plate.
dir="$work/none"
cfg=$(conf "$dir" none)
heat --config "$cfg" --crash-at 130 >/dev/null 2>&1 || true
rm -rf "$dir/node-1"
got=$(heat --config "$cfg" 2>&1 | tee "$work/log" | grep -o 'digest [0-9a-f]*') || { echo "FAILED: redundancy none, node 1 lost: the job stopped"; cat "$work/log"; exit 1; }
[ "$got" = "$want" ] || { echo "FAILED: redundancy none: $got, uninterrupted: $want"; cat "$work/log"; exit 1; }
grep -q "redundancy is none" "$work/log" && grep -q "the job starts from the beginning" "$work/log" || { echo "FAILED: no clear warning"; cat "$work/log"; exit 1; }
grep -q "restarted from" "$work/log" && { echo "FAILED: redundancy none, node 1 lost: restarted from a checkpoint"; cat "$work/log"; exit 1; }
heat --config "$cfg" >"$work/log" 2>&1 || { echo "FAILED: the run after the fresh start"; cat "$work/log"; exit 1; }
grep -q "restarted from the checkpoint of step" "$work/log" || { echo "FAILED: the run after the fresh start did not restart"; cat "$work/log"; exit 1; }
echo "node-loss: redundancy none, node 1 lost: started from the beginning on purpose (old versions set aside), same plate; the next run $(grep -o 'restarted from the checkpoint of step [0-9]*' "$work/log")"
