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
# NO_PLOT=1 (only the CSV: on a machine without network for the plots' venv, draw elsewhere with
# scripts/plot-scaling.py, which also redraws every committed plot: --committed),
# MACHINE and DATE (what each figure's title names besides the sizes; default
# this host with its cores and GPUs, and today: set both when redrawing the CSV
# of another machine or day). A NAME without NAME.csv but with the first
# study's NAME-strong.csv / NAME-weak.csv redraws NAME.png from those.
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

# The plots: scripts/plot-scaling.py, under its own virtual environment (target/plot-venv, made and given
# matplotlib on first use; never the system's python). What each figure's title names: the machine (MACHINE;
# default this host, its cores and GPUs), the date of the run (a `date` column of the CSV where it has one,
# else DATE, else today: set both when redrawing another machine's CSV) and the sizes (from the CSV).
if [ -z "${MACHINE:-}" ]; then
    gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c |
        awk '{n = $1; $1 = ""; printf "%s%s ×%s", sep, n, $0; sep = ", "}' || true)
    MACHINE="$(hostname), $(nproc) cores${gpus:+, $gpus}"
fi
python3 scripts/plot-scaling.py "$csv" --out "$out" --name "$name" --machine "$MACHINE" --date "${DATE:-$(date -u +%F)}"
[ -n "${PLOT_ONLY:-}" ] || echo "wrote $csv"
