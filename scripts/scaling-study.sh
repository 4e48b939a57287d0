#!/usr/bin/env bash
# Scaling studies of whole checkpointing runs of the examples (each rank
# checkpoints through the runtime every EVERY steps, the asynchronous tiers
# on local directories), each run in three modes: collective (the default),
# local-only (DCKPT_COLLECTIVE=false) and Full (local-only, DCKPT_METHOD=full).
#   strong: heat and labels with a fixed state of TOTAL_ROWS x COLS split over P ranks;
#   weak:   ROWS_PER_RANK x COLS per rank (replicated: TABLE + LOCAL per rank);
#   chunk:  chunk sizes CHUNKS at SWEEP_RANKS ranks (weak sizes);
#   every:  checkpoint intervals EVERYS at SWEEP_RANKS ranks (weak sizes).
# One CSV (OUT/NAME.csv: the study, then dckpt::runtime::study's columns)
# and one PNG per example (OUT/NAME-EXAMPLE.png: overhead per step, stored
# bytes, ratios vs Full and vs local-only, time split, the sweeps).
#   scripts/scaling-study.sh [OUT]      (default docs/bench/scaling)
# Environment: EXAMPLES ("heat labels replicated"), MODES ("collective local
# full"), STUDIES ("strong weak chunk every"), RANKS ("1 2 4 8 16 32 64"),
# STEPS (60), EVERY (10), TOTAL_ROWS (1024), ROWS_PER_RANK (128), COLS (1024),
# TABLE (2M), LOCAL (256K), SWEEP_RANKS (4), CHUNKS ("64 128 512 4096"),
# EVERYS ("1 5 10 30"), NAME (devbox-cpu), BIN_DIR (target/release/examples),
# DEVICE (heat: auto | cpu | gpu), MPIRUN_FLAGS (placement: scripts/placement.sh), APPEND=1 (add to the CSV: several
# invocations with other sizes or examples), PLOT_ONLY=1 (redraw from the CSV),
# NO_PLOT=1 (only the CSV: on a machine without matplotlib, draw elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/bench/scaling}
name=${NAME:-devbox-cpu}
csv="$out/$name.csv"
bins=${BIN_DIR:-}
if [ -z "$bins" ]; then
    [ -n "${PLOT_ONLY:-}" ] || cargo build --release --quiet --examples
    bins=target/release/examples
fi
bins=$(realpath "$bins")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# shellcheck source=scripts/placement.sh
. scripts/placement.sh
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
examples=${EXAMPLES:-heat labels replicated}
modes=${MODES:-collective local full}
studies=${STUDIES:-strong weak chunk every}
ranks=${RANKS:-1 2 4 8 16 32 64}
sweep_p=${SWEEP_RANKS:-4}
chunks=${CHUNKS:-64 128 512 4096}
everys=${EVERYS:-1 5 10 30}

# The runs: "study example mode ranks chunk every", one per line.
plan() {
    for ex in $examples; do
        for study in $studies; do
            for mode in $modes; do
                case $study in
                strong) [ "$ex" = replicated ] || for p in $ranks; do echo "strong $ex $mode $p 128 ${EVERY:-10}"; done ;;
                weak) for p in $ranks; do echo "weak $ex $mode $p 128 ${EVERY:-10}"; done ;;
                chunk) [ "$mode" = full ] || for c in $chunks; do echo "chunk $ex $mode $sweep_p $c ${EVERY:-10}"; done ;;
                every) for e in $everys; do echo "every $ex $mode $sweep_p 128 $e"; done ;;
                esac
            done
        done
    done
}

# The example's size arguments for a study at P ranks.
sizes() {
    local study=$1 ex=$2 p=$3
    case $ex in
    replicated) echo "--table ${TABLE:-2M} --local ${LOCAL:-256K}" ;;
    *)
        local rows=${ROWS_PER_RANK:-128}
        [ "$study" = strong ] && rows=$(( ${TOTAL_ROWS:-1024} / p ))
        echo "--rows $rows --cols ${COLS:-1024}"
        ;;
    esac
}

if [ -z "${PLOT_ONLY:-}" ]; then
    [ -n "${APPEND:-}" ] || rm -f "$csv"
    total=$(plan | wc -l)
    k=0
    while read -r study ex mode p chunk every; do
        k=$((k + 1))
        printf '[%3d/%d] %-6s %-10s %-10s %2s ranks, chunk %4s, every %2s ... ' "$k" "$total" "$study" "$ex" "$mode" "$p" "$chunk" "$every" >&2
        rm -rf "$work/run" "$work/line.csv"
        env_mode=()
        case $mode in
        local) env_mode=(DCKPT_COLLECTIVE=false) ;;
        full) env_mode=(DCKPT_COLLECTIVE=false DCKPT_METHOD=full) ;;
        esac
        device=()
        [ "$ex" = heat ] && [ -n "${DEVICE:-}" ] && device=(--device "$DEVICE")
        # shellcheck disable=SC2046
        env "${env_mode[@]}" DCKPT_CHUNK_SIZE="$chunk" timeout 900 $(mpirun_for "$p") "$bins/$ex" \
            --steps "${STEPS:-60}" --every "$every" $(sizes "$study" "$ex" "$p") --dir "$work/run" \
            --report "$work/line.csv" "${device[@]}" </dev/null >/dev/null
        [ -f "$csv" ] || echo "study,$(head -1 "$work/line.csv")" >"$csv"
        echo "$study,$(tail -1 "$work/line.csv")" >>"$csv"
        tail -1 "$work/line.csv" | awk -F, '{printf "%.2f ms/step, %.1fx less than Full\n", $19, $20}' >&2
    done < <(plan)
fi
[ -z "${NO_PLOT:-}" ] || { echo "wrote $csv (no plots: NO_PLOT)" >&2; exit 0; }

python3 -c 'import matplotlib' 2>/dev/null || pip install --quiet matplotlib >&2
python3 - "$csv" "$out" "$name" <<'PY'
import csv, sys
from collections import defaultdict
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

path, out, name = sys.argv[1:4]
rows = list(csv.DictReader(open(path)))
MODES = {"collective": "o-", "local": "s--", "full": "^:"}

def series(ex, study, mode, key, x="ranks"):
    pts = sorted((int(r[x]), r) for r in rows if r["example"] == ex and r["study"] == study and r["mode"] == mode)
    return [p for p, _ in pts], [key(r) for _, r in pts]

per_ckpt = lambda r: int(r["stored_bytes"]) / max(1, int(r["checkpoints"]) * int(r["ranks"]))
for ex in sorted({r["example"] for r in rows}):
    fig, ax = plt.subplots(2, 3, figsize=(16, 8.5))
    for mode, style in MODES.items():
        for study, a in (("strong", ax[0][0]), ("weak", ax[0][1])):
            x, y = series(ex, study, mode, lambda r: float(r["overhead_per_step_ms"]))
            if x:
                a.plot(x, y, style, label=mode)
        x, y = series(ex, "weak", mode, per_ckpt)
        if x:
            ax[0][2].plot(x, [v / 2**20 for v in y], style, label=mode)
        for study, a, key in (("chunk", ax[1][1], "chunk_size"), ("every", ax[1][2], "every")):
            x, y = series(ex, study, mode, lambda r: float(r["overhead_per_step_ms"]), key)
            if x:
                a.plot(x, y, style, label=f"{mode}: ms/step")
    # Ratios of the weak runs: Full's stored bytes and local-only's over collective's.
    by = defaultdict(dict)
    for r in rows:
        if r["example"] == ex and r["study"] == "weak":
            by[int(r["ranks"])][r["mode"]] = int(r["stored_bytes"])
    ps = sorted(p for p in by if "collective" in by[p])
    for other, style in (("full", "^-"), ("local", "s-")):
        pts = [(p, by[p][other] / by[p]["collective"]) for p in ps if other in by[p]]
        if pts:
            ax[1][0].plot([p for p, _ in pts], [v for _, v in pts], style, label=f"{other} / collective")
    # Time split of the weak collective runs (slowest rank's seconds).
    x, split = series(ex, "weak", "collective", lambda r: r)
    if x:
        t = ax[1][0].twinx()
        dedup = [float(r["dedup_s"]) for r in split]
        reduce = [float(r["reduce_s"]) for r in split]
        first = [float(r["first_call_s"]) for r in split]
        rest = [max(0.0, float(r["checkpoint_s"]) - d - e - f) for r, d, e, f in zip(split, dedup, reduce, first)]
        drain = [float(r["drain_s"]) for r in split]
        t.stackplot(x, dedup, reduce, first, rest, drain, alpha=0.25,
                    labels=["de-dup", "reduction", "first call", "rest of calls", "drain at finalize"])
        t.set_ylabel("seconds (collective, slowest rank)")
        t.legend(loc="upper right", fontsize=7)
    ax[0][0].set(title=f"{ex}: strong scaling", xlabel="ranks", ylabel="checkpoint ms per step (app waits)")
    ax[0][1].set(title=f"{ex}: weak scaling", xlabel="ranks", ylabel="checkpoint ms per step (app waits)")
    ax[0][2].set(title=f"{ex}: stored per checkpoint and rank (weak)", xlabel="ranks", ylabel="MiB")
    ax[1][0].set(title=f"{ex}: bytes stored vs collective; time split", xlabel="ranks", ylabel="stored / collective's")
    ax[1][1].set(title=f"{ex}: chunk size ({'/'.join(sorted({r['ranks'] for r in rows if r['study'] == 'chunk'}))} ranks)",
                 xlabel="chunk bytes", ylabel="ms per step")
    ax[1][2].set(title=f"{ex}: checkpoint interval", xlabel="steps between checkpoints", ylabel="ms per step")
    for a in (ax[0][0], ax[0][1], ax[0][2], ax[1][0], ax[1][1], ax[1][2]):
        a.set_xscale("log", base=2)
        a.grid(True, alpha=0.3)
        if a.get_lines():
            a.legend(loc="upper left", fontsize=8)
        else:
            a.text(0.5, 0.5, "not run for this example", ha="center", va="center", transform=a.transAxes)
    # The chunk sweep's stored bytes on a second axis.
    t2 = ax[1][1].twinx()
    for mode, style in MODES.items():
        x, y = series(ex, "chunk", mode, per_ckpt, "chunk_size")
        if x:
            t2.plot(x, [v / 2**20 for v in y], style, alpha=0.4, color="gray")
    t2.set_ylabel("MiB stored per checkpoint and rank (gray)")
    fig.tight_layout()
    fig.savefig(f"{out}/{name}-{ex}.png", dpi=100)
    print(f"wrote {out}/{name}-{ex}.png")
print(f"wrote {path}")
PY
