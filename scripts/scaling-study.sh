#!/usr/bin/env bash
# Strong and weak scaling of whole checkpointing runs of the heat example
# (examples/heat/: a checkpoint every EVERY steps through the runtime, the
# asynchronous tiers on local directories), on the CPUs of this machine
# (ranks oversubscribed), with a CSV and PNG plots in OUT:
#   strong: a fixed plate of TOTAL_ROWS x COLS split over P ranks;
#   weak:   ROWS_PER_RANK x COLS per rank.
#   scripts/scaling-study.sh [OUT]      (default docs/bench/scaling)
# Environment: RANKS ("1 2 4 8"), TOTAL_ROWS (2048), ROWS_PER_RANK (512),
# COLS (2048), STEPS (100), EVERY (10), NAME (devbox-cpu), HEAT_BIN, DEVICE
# (auto | cpu | gpu: where each rank's plate lives; ranks share a node's GPUs).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/bench/scaling}
bin=${HEAT_BIN:-}
if [ -z "$bin" ]; then
    cargo build --release --quiet --examples
    bin=target/release/examples/heat
fi
bin=$(realpath "$bin")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$out"
name=${NAME:-devbox-cpu}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cols=${COLS:-2048}
steps=${STEPS:-100}
every=${EVERY:-10}
for kind in strong weak; do
    csv="$out/$name-$kind.csv"
    rm -f "$csv"
    for p in ${RANKS:-1 2 4 8}; do
        if [ "$kind" = strong ]; then rows=$(( ${TOTAL_ROWS:-2048} / p )); else rows=${ROWS_PER_RANK:-512}; fi
        printf '%s scaling: %s ranks, %s x %s per rank ... ' "$kind" "$p" "$rows" "$cols" >&2
        rm -rf "$work/run"
        timeout 600 mpirun --oversubscribe -np "$p" "$bin" --steps "$steps" --every "$every" --rows "$rows" \
            --cols "$cols" --dir "$work/run" --report "$csv" ${DEVICE:+--device "$DEVICE"} >/dev/null
        tail -1 "$csv" | awk -F, '{printf "checkpoint %.2f ms/step, stored %.1fx less than Full\n", $12, $13}' >&2
    done
done
python3 -c 'import matplotlib' 2>/dev/null || pip install --quiet matplotlib >&2
python3 - "$out" "$name" <<'PY'
import csv, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
out, name = sys.argv[1], sys.argv[2]
fig, axes = plt.subplots(1, 3, figsize=(14, 4))
for kind, marker in (("strong", "o"), ("weak", "s")):
    rows = list(csv.DictReader(open(f"{out}/{name}-{kind}.csv")))
    p = [int(r["ranks"]) for r in rows]
    axes[0].plot(p, [float(r["overhead_per_step_ms"]) for r in rows], marker=marker, label=kind)
    axes[1].plot(p, [float(r["compute_s"]) for r in rows], marker=marker, label=f"{kind}: compute")
    axes[1].plot(p, [float(r["checkpoint_s"]) for r in rows], marker=marker, linestyle="--", label=f"{kind}: checkpoint calls")
    axes[2].plot(p, [float(r["ratio_to_full"]) for r in rows], marker=marker, label=kind)
axes[0].set(xlabel="ranks", ylabel="ms per step", title="application-visible checkpoint overhead")
axes[1].set(xlabel="ranks", ylabel="seconds (slowest rank)", title="time split")
axes[2].set(xlabel="ranks", ylabel="protected / stored bytes", title="checkpoint size vs Full")
for ax in axes:
    ax.set_xscale("log", base=2)
    ax.legend()
    ax.grid(True, alpha=0.3)
fig.tight_layout()
fig.savefig(f"{out}/{name}.png", dpi=110)
print(f"wrote {out}/{name}-strong.csv, {out}/{name}-weak.csv and {out}/{name}.png")
PY
