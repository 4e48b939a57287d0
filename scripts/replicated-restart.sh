#!/usr/bin/env bash
# The replicated-data example (examples/replicated.rs) under mpirun: every
# rank holds the same table; the collective step must store it about once
# for all ranks (the run's stored bytes below 1/RANKS of the protected
# ones, some bytes referenced across ranks). Then a run killed mid-way and
# started again must end with the data of a run never interrupted
# (scripts/kill-restart.sh).
#   scripts/replicated-restart.sh [RANKS] [EXAMPLE_BIN]   (default 3, target/release/examples/replicated)
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${1:-3}
bin=${2:-target/release/examples/replicated}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
KILL_RESTART_LOG=$log scripts/kill-restart.sh "$bin" "$ranks" 35 30 --steps 60 --every 10 --table 2M --local 32K
ratio=$(grep -o 'protected bytes ([0-9.]*)' "$log" | grep -o '[0-9.]*)' | tr -d ')')
referenced=$(grep -o '[0-9]* bytes referenced' "$log" | cut -d' ' -f1)
awk -v r="$ratio" -v p="$ranks" -v ref="$referenced" 'BEGIN { exit !(r < 1 / p && ref > 0) }' ||
    { echo "FAILED: the replicated table was not stored once (ratio $ratio, $referenced bytes referenced)"; cat "$log"; exit 1; }
echo "replicated: $ranks ranks stored $ratio of the protected bytes ($referenced bytes referenced across ranks)"
