#!/usr/bin/env bash
# The main job, on local directories (CPU backend unless a GPU is found):
#  0. four ranks under mpirun: the heat example (examples/heat/) checkpoints
#     through the runtime; one rank is killed mid-run, the job restarts from
#     its newest checkpoint and ends with the same plate, bit for bit;
#  1. one rank: checkpoint ten versions of an evolving synthetic buffer,
#     restore and verify every one, print the per-version table;
#  2. four ranks under mpirun: the example simulation (examples/collective_sim.rs)
#     takes ten collective checkpoints and restores its own and a neighbour's;
#  3. four ranks under mpirun through the CLI (`checkpoint --collective`, `{rank}`
#     in the file name) over replicated data, then offline restores with no MPI.
#   scripts/demo.sh [SIZE] [CHANGE]      e.g. scripts/demo.sh 256M 0.01
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:-64M}
change=${2:-0.01}
out=${DCKPT_DEMO_DIR:-target/demo}
ranks=${DCKPT_DEMO_RANKS:-4}

scripts/install-deps.sh
cargo build --release --quiet --bins --examples
bin=target/release/dckpt
rm -rf "$out"
mkdir -p "$out"

echo "== 0. the heat example through the runtime: $ranks ranks, one killed mid-run, restarted"
scripts/heat-restart.sh "$ranks" target/release/examples/heat

echo "== 1. one rank, ten versions"
"$bin" gen --size "$size" --versions 10 --change "$change" --shape clustered --out "$out/versions"
for v in $(seq 1 10); do
    "$bin" checkpoint --dir "$out/store" --version "$v" --method tree --chunk-size 128 "$out/versions/v$(printf %03d "$v").bin"
done
for v in $(seq 1 10); do
    "$bin" restore --dir "$out/store" --version "$v" --output "$out/restored.bin" >/dev/null
    cmp -s "$out/restored.bin" "$out/versions/v$(printf %03d "$v").bin" || { echo "version $v: restore differs" >&2; exit 1; }
done
echo "all 10 versions restored byte-exactly"
"$bin" verify --dir "$out/store"
"$bin" inspect --dir "$out/store"

# mpirun as root needs consent; more ranks than cores need --oversubscribe.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun=(mpirun --oversubscribe -np "$ranks")

echo "== 2. $ranks ranks: the example simulation with collective checkpoints"
"${mpirun[@]}" target/release/examples/collective_sim "$out/sim" 10
"$bin" verify --dir "$out/sim"
"$bin" inspect --dir "$out/sim" | tail -n $((ranks + 1))

echo "== 3. $ranks ranks through the CLI: replicated data, stored about once"
for r in $(seq 0 $((ranks - 1))); do ln -sfn versions "$out/rank$r"; done
for v in $(seq 1 10); do
    "${mpirun[@]}" "$bin" checkpoint --collective --dir "$out/collective" --version "$v" \
        "$out/rank{rank}/v$(printf %03d "$v").bin" | sort | tail -n 1
done
for r in $(seq 0 $((ranks - 1))); do
    "$bin" restore --dir "$out/collective" --rank "$r" --version 10 --output "$out/restored.bin" >/dev/null
    cmp -s "$out/restored.bin" "$out/versions/v010.bin" || { echo "rank $r: restore differs" >&2; exit 1; }
done
echo "every rank's version 10 restored byte-exactly, offline (no MPI)"
"$bin" verify --dir "$out/collective"
"$bin" inspect --dir "$out/collective" | tail -n $((ranks + 1))
bytes() { find "$1" -type f -name "$2" -printf '%s\n' | awk '{s += $1} END {print s + 0}'; }
echo "diff files: one rank alone $(bytes "$out/store" '*.dckpt') bytes, $ranks ranks together $(bytes "$out/collective" '*.dckpt') bytes"
echo "every file on disk (manifests, locks, commit records included): one rank $(bytes "$out/store" '*') bytes, $ranks ranks $(bytes "$out/collective" '*') bytes"
